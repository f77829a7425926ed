"""Each learner's copy of the labs: missing files are copied, a learner's files never
overwritten."""

from workbook import workspace


def _tree(tmp_path):
    source = tmp_path / "repo"
    for name in ("notebooks/00_a.ipynb", "labs/02_b.ipynb", "labs/.ipynb_checkpoints/x.ipynb",
                 "README.md", "simcluster/secret.py"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(f"original {name}")
    return source


def test_copies_what_is_missing_and_keeps_a_learners_work(tmp_path):
    source, target = _tree(tmp_path), tmp_path / "home" / "simcluster-workbook"
    copied, kept = workspace.copy_missing(target, source)
    assert sorted(map(str, copied)) == ["README.md", "labs/02_b.ipynb", "notebooks/00_a.ipynb"]
    assert kept == [] and not (target / "simcluster").exists()
    assert not (target / "labs" / ".ipynb_checkpoints").exists()
    (target / "labs" / "02_b.ipynb").write_text("my answers")
    (target / "notebooks" / "00_a.ipynb").unlink()
    copied, kept = workspace.copy_missing(target, source)
    assert list(map(str, copied)) == ["notebooks/00_a.ipynb"]
    assert (target / "labs" / "02_b.ipynb").read_text() == "my answers"
    assert "labs/02_b.ipynb" in map(str, kept)


def test_the_start_up_hook_never_raises(tmp_path, monkeypatch):
    lines = []
    home = tmp_path / "home"
    assert workspace.setup_home(home, log=lines.append) == home / "simcluster-workbook"
    assert (home / "simcluster-workbook" / "labs" / "09_3d_parallelism.ipynb").is_file()
    assert lines and "copied" in lines[0]

    def refuse(*args, **kwargs):
        raise PermissionError("read-only home")

    monkeypatch.setattr(workspace, "copy_missing", refuse)
    lines.clear()
    workspace.setup_home(home, log=lines.append)
    assert "could not copy the labs" in lines[0] and "read-only home" in lines[0]


def test_the_server_config_hook_sets_the_landing_page(tmp_path, monkeypatch):
    from traitlets.config import Config

    monkeypatch.setenv("HOME", str(tmp_path))
    config = Config()
    code = (workspace.ROOT / "workshop" / "jupyter_server_config.py").read_text()
    exec(compile(code, "jupyter_server_config.py", "exec"), {"c": config})
    assert config.ServerApp.default_url == "/lab/tree/simcluster-workbook/START.ipynb"
    assert (tmp_path / "simcluster-workbook" / "START.ipynb").is_file()   # the start page it opens
    assert (tmp_path / "simcluster-workbook" / "notebooks").is_dir()
