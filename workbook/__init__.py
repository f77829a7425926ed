"""What the notebooks need besides the cluster: exercise checks, quizzes, the lab builder,
and the progress report."""
