"""Speed and scale measurements (see README.md); each prints ratios."""
