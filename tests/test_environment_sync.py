"""environment.yml (the conda route) must ask for the same dependencies as pyproject.toml."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent

# Conda packages the environment needs for itself, not dependencies of the project.
CONDA_ONLY = {"python", "pip"}
# Installed from PyPI through the `pip:` section: conda-forge's builds differ (name, CUDA).
PIP_ONLY = {"torch"}


def _name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(lines, where):
    """``{normalised name: specifier}`` for PEP 508 requirement strings."""
    found = {}
    for line in lines:
        try:
            req = Requirement(line)
        except Exception as exc:
            raise AssertionError(f"{where}: {line!r} is not a PEP 508 requirement; write it "
                                 f"as in pyproject.toml, e.g. 'numpy' or 'torch==2.13.*' "
                                 f"({exc})") from None
        name = _name(req.name)
        assert name not in found, f"{where}: {req.name} is listed twice"
        found[name] = str(req.specifier)
    return found


def _pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["requires-python"], _requirements(project["dependencies"], "pyproject.toml")


def _environment():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"environment.yml: unexpected entry {dep!r}"
            # Lines starting with "-" are pip options (an index URL), not requirements.
            pip += [line for line in dep["pip"] if not line.startswith("-")]
        else:
            conda.append(dep)
    python = [dep for dep in conda if re.fullmatch(r"python\s*=.*", dep)]
    conda = [dep for dep in conda if dep not in python]
    return env, python, _requirements(conda, "environment.yml"), _requirements(pip, "environment.yml pip:")


def test_same_dependencies_and_pins():
    _, wanted = _pyproject()
    _, _, conda, pip = _environment()
    both = sorted(set(conda) & set(pip))
    assert not both, f"environment.yml lists {both} both as conda and as pip packages"
    listed = {name: spec for name, spec in {**conda, **pip}.items() if name not in CONDA_ONLY}

    missing = sorted(set(wanted) - set(listed))
    extra = sorted(set(listed) - set(wanted))
    assert not missing, f"in pyproject.toml but not in environment.yml: {missing}"
    assert not extra, f"in environment.yml but not in pyproject.toml: {extra}"
    differ = {name: (wanted[name], listed[name]) for name in wanted
              if SpecifierSet(wanted[name]) != SpecifierSet(listed[name])}
    assert not differ, ("pins differ, {name: (pyproject.toml, environment.yml)}: "
                        f"{differ}")


def test_pip_only_packages_come_from_pip():
    _, _, conda, pip = _environment()
    for name in PIP_ONLY:
        assert name not in conda, (f"environment.yml: install {name} in the `pip:` section, "
                                   "pinned as in pyproject.toml")
        assert name in pip, f"environment.yml: {name} is missing from the `pip:` section"
    assert "pip" in conda, "environment.yml: list `pip` so that the `pip:` section runs"


def test_python_version_is_allowed_by_pyproject():
    requires_python, _ = _pyproject()
    env, python, _, _ = _environment()
    assert "conda-forge" in env.get("channels", []), "environment.yml: use conda-forge"
    assert len(python) == 1, "environment.yml: pin python once, e.g. python=3.11"
    version = python[0].split("=")[-1].strip()
    assert Version(version) in SpecifierSet(requires_python), (
        f"environment.yml asks for python {version}, but pyproject.toml requires "
        f"{requires_python}")
