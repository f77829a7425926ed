"""Peak memory of one learner's kernel running a notebook from top to bottom.

    PYTHONPATH=. .venv/bin/python scripts/kernel_memory.py notebooks/09_3d_parallelism.ipynb

Runs the notebook in a fresh kernel (a copy in memory; nothing is written back), samples
the resident set size (RSS) of the kernel process and its children every 0.2 s, and
prints the peak, the kernel's CPU time and its wall time. workshop/server.md uses the
peak to size a shared server: learners per server = usable memory / peak per kernel.
"""

import argparse
import threading
import time
from pathlib import Path

from benchmarks.bench_notebooks import _kernel_cpu_seconds


def _rss(process):
    """Resident bytes of ``process`` and its children (0 for those that just ended)."""
    import psutil

    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def measure(path, interval=0.2):
    """Run ``path`` in a fresh kernel; return ``{"peak_rss", "idle_rss", "wall", "cpu"}``."""
    import nbformat
    import psutil
    from nbclient import NotebookClient

    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    peak, done = [0], threading.Event()
    start = time.perf_counter()
    with client.setup_kernel():
        process = psutil.Process(client.km.provisioner.process.pid)
        idle = _rss(process)

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _rss(process))
                done.wait(interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        done.set()
        sampler.join()
        peak[0] = max(peak[0], _rss(process))
        cpu = _kernel_cpu_seconds(client)
    return {"peak_rss": peak[0], "idle_rss": idle,
            "wall": time.perf_counter() - start, "cpu": cpu}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    args = parser.parse_args(argv)
    result = measure(args.notebook)
    gib = 2 ** 30
    print(f"{args.notebook}: peak RSS {result['peak_rss'] / gib:.2f} GiB "
          f"(idle kernel {result['idle_rss'] / gib:.2f} GiB), "
          f"kernel CPU {result['cpu']:.1f} s, wall {result['wall']:.1f} s")
    return result


if __name__ == "__main__":
    main()
