# Jupyter server start-up hook for a shared server (workshop/server.md): each learner gets
# ~/simcluster-workbook with the lessons and labs, copied when missing, never overwritten,
# and JupyterLab opens there. Put this file where the server reads its configuration:
#   The Littlest JupyterHub: /opt/tljh/user/etc/jupyter/jupyter_server_config.py
#   Docker image:            /srv/workbook/.venv/etc/jupyter/jupyter_server_config.py
# (`jupyter --paths` lists the folders; append to an existing file of that name.)
from workbook.workspace import setup_home

_folder = setup_home()
c.ServerApp.default_url = f"/lab/tree/{_folder.name}/notebooks"  # noqa: F821 (c: the config)
