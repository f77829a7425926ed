#!/usr/bin/env bash
# Start JupyterLab on the workbook: bound to 127.0.0.1 with token authentication (the
# default), serving the repository and opened on START.ipynb, the start page (a notebook
# of markdown cells, so JupyterLab shows it rendered). scripts/lab-settings/overrides.json
# changes JupyterLab's defaults (a learner's own settings still win): no "Would you like to
# get notified about official Jupyter news?" prompt on first start.
# `make lab` runs this, and so do the tests in tests/browser/ (adding --port and
# --no-browser): extra arguments go to `jupyter lab`. JUPYTER names the jupyter command.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
args=(
    --ServerApp.ip=127.0.0.1
    --ServerApp.root_dir="$PWD"
    --LabApp.default_url=/lab/tree/START.ipynb
    --LabApp.app_settings_dir="$PWD/scripts/lab-settings"
)
# Jupyter refuses to start as root, which is how containers and some CI runners run.
if [ "$(id -u)" = 0 ]; then
    args+=(--allow-root)
fi
exec "${JUPYTER:-jupyter}" lab "${args[@]}" "$@"
