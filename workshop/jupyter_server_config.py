# Jupyter server start-up hook for a shared server (workshop/server.md): each learner gets
# ~/simcluster-workbook with the lessons and labs, copied when missing, never overwritten,
# and JupyterLab opens there. Put this file where the learners' servers read their
# configuration (`jupyter --paths`, "config"; append to a file of that name if one exists):
#   The Littlest JupyterHub: /opt/tljh/user/etc/jupyter/jupyter_server_config.py
#   Docker image:            /srv/simcluster-workbook/.venv/etc/jupyter/jupyter_server_config.py
import sys

try:
    from workbook.workspace import setup_home
except ImportError:
    # The server runs in another Python than the workbook's kernel (TLJH's user
    # environment): workspace.py needs only the standard library, so load it from the
    # repository on the server.
    sys.path.append("/srv/simcluster-workbook")
    from workbook.workspace import setup_home

_folder = setup_home()
c.ServerApp.default_url = f"/lab/tree/{_folder.name}/START.ipynb"  # noqa: F821 (c: the config)
