"""Each learner's own copy of the lessons and labs, on a shared server.

    python -m workbook.workspace ~/simcluster-workbook     # copy what is missing

copies ``notebooks/`` and ``labs/`` (and the README and the start page) from the installed workbook into the
folder. It never overwrites: a file that is already there — a lab a learner has worked
in — is kept as it is, and only missing files are copied, so running it at every login
is safe and hands out a lab added later. On JupyterHub (The Littlest JupyterHub) and in
the Docker image, ``workshop/jupyter_server_config.py`` calls :func:`setup_home` each time
a learner's server starts (workshop/server.md).
"""

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "labs")
FILES = ("README.md", "START.ipynb")
HOME_FOLDER = "simcluster-workbook"


def _sources(root):
    """``(relative path, source path)`` of every file a learner gets."""
    root = Path(root)
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and ".ipynb_checkpoints" not in path.parts:
                yield path.relative_to(root), path
    for name in FILES:
        if (root / name).is_file():
            yield Path(name), root / name


def copy_missing(target, source=ROOT):
    """Copy into ``target`` every lesson and lab file it lacks; return ``(copied, kept)``,
    the relative paths copied and those left alone because they were already there."""
    target = Path(target).expanduser()
    copied, kept = [], []
    for relative, path in _sources(source):
        destination = target / relative
        if destination.exists():
            kept.append(relative)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        # exclusive create: if something appears there meanwhile, it is not overwritten
        try:
            with open(path, "rb") as src, open(destination, "xb") as dst:
                shutil.copyfileobj(src, dst)
        except FileExistsError:
            kept.append(relative)
            continue
        copied.append(relative)
    return copied, kept


def setup_home(home=None, log=print):
    """The start-up hook: give the learner ``~/simcluster-workbook`` (missing files only).
    Never raises: a server must start even if the copy fails (the error is logged)."""
    target = Path(home or Path.home()) / HOME_FOLDER
    try:
        copied, kept = copy_missing(target)
    except OSError as error:
        log(f"workbook: could not copy the labs into {target}: {error}")
        return target
    if copied:
        log(f"workbook: copied {len(copied)} file(s) into {target} ({len(kept)} kept)")
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook.workspace",
                                     description="Copy the lessons and labs into a folder, "
                                                 "never overwriting a file there.")
    parser.add_argument("target", help="the learner's folder, e.g. ~/simcluster-workbook")
    args = parser.parse_args(argv)
    copied, kept = copy_missing(args.target)
    print(f"copied {len(copied)} file(s) into {args.target}; kept {len(kept)} already there")
    for relative in kept:
        if relative.suffix == ".ipynb":
            print(f"  kept {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
