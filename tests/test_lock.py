"""requirements.lock agrees with pyproject.toml, environment.yml and the Makefile: every
dependency pinned exactly, each pin allowed by pyproject, the same torch everywhere, no
CUDA package, and (where the environment is installed) no stale or missing entry."""
from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def lock() -> dict[str, str]:
    """``{canonical name: version}`` of requirements.lock (every line must be ``name==v``)."""
    pins = {}
    for n, line in enumerate((ROOT / "requirements.lock").read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.]*)", line.strip())
        assert m, f"requirements.lock line {n}: {line!r} is not an exact name==version pin"
        name = canonicalize_name(m[1])
        assert name not in pins, f"requirements.lock line {n}: {name} pinned twice"
        pins[name] = m[2]
    return pins


def project_requirements() -> list[Requirement]:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in proj.get("optional-dependencies", {}).values() for r in group]
    return [Requirement(r) for r in proj["dependencies"] + extras]


def test_every_pyproject_dependency_is_pinned_to_an_allowed_version():
    pins = lock()
    for req in project_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (pyproject.toml) is missing from requirements.lock: " \
                             "run `make lock`"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), \
            f"requirements.lock pins {name}=={pins[name]}, outside pyproject's {req}"


def test_lock_has_no_cuda_packages_local_labels_or_the_package_itself():
    pins = lock()
    assert not [n for n in pins if n.startswith("nvidia-")], "CUDA packages in the lock"
    assert "nslib" not in pins and "pip" not in pins
    assert not [v for v in pins.values() if "+" in v]


def test_torch_is_the_same_in_pyproject_lock_environment_and_makefile():
    torch = next(r for r in project_requirements() if r.name == "torch")
    assert str(torch.specifier).startswith("=="), "pyproject must pin torch exactly"
    version = str(torch.specifier)[2:]
    assert lock()["torch"] == version
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip[0] == f"torch=={version}" and "-r requirements.lock" in pip
    make = (ROOT / "Makefile").read_text()
    assert f"TORCH := torch=={version}" in make
    assert "--no-deps -r $(LOCK)" in make and "\nlock:" in make


def _closure() -> set[str] | None:
    """Canonical names of pyproject's dependencies and theirs (extras followed), from the
    installed metadata; None when some are not installed at their locked versions."""
    pins, seen, stack = lock(), {}, list(project_requirements())
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        extras = seen.get(name, set()) | set(req.extras)
        if name in seen and extras == seen[name]:
            continue
        seen[name] = extras
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            if name.startswith("nvidia-"):
                continue
            return None
        if name in pins and Version(dist.version).public != pins[name]:
            return None
        for raw in dist.requires or []:
            dep = Requirement(raw)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in ["", *sorted(extras)]):
                stack.append(dep)
    return {n for n in seen if not n.startswith("nvidia-")}


def test_lock_is_exactly_the_dependency_closure():
    closure = _closure()
    if closure is None:
        pytest.skip("this environment was not installed from requirements.lock")
    pins = set(lock())
    assert not closure - pins, f"missing from the lock (run `make lock`): {closure - pins}"
    assert not pins - closure, f"in the lock but needed by nothing: {pins - closure}"
