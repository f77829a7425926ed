"""`make lab` really starts a JupyterLab that answers on 127.0.0.1 and asks for a token.

The server is the `lab_server` fixture (conftest.py): scripts/lab.sh, the command
`make lab` runs, with a free port, --no-browser and a known token. No browser needed.
"""

import json

from _jupyter_lab import ROOT, get


def test_lab_starts_on_localhost_and_requires_the_token(lab_server):
    status, _ = get(f"{lab_server.url}/api/contents")
    assert status == 403, f"an unauthenticated request got {status}, not 403"

    status, body = get(f"{lab_server.url}/api/contents", lab_server.token)
    assert status == 200, f"with the token, /api/contents got {status}"
    names = {item["name"] for item in json.loads(body)["content"]}
    assert "simcluster" in names, f"the server does not serve the repository: {names}"

    status, body = get(f"{lab_server.url}/api/contents/notebooks", lab_server.token)
    if (ROOT / "notebooks").is_dir():
        assert status == 200, f"with the token, /api/contents/notebooks got {status}"
        assert json.loads(body)["type"] == "directory"
    else:                                   # a checkout before the first lesson
        assert status == 404, status
