"""The project's own consistency: env file vs pyproject, notebook pairs, stored notebooks."""
import json
import tomllib
from pathlib import Path

import jupytext
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_installs_the_package_and_pins_torch_like_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(d for d in deps if d.startswith("torch"))
    assert pip == [torch_pin, "-r requirements.lock", "-e .[dev]"], \
        "environment.yml: the same torch as pyproject.toml first, then the lock, then the package"


def notebooks():
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("nb", notebooks(), ids=lambda p: p.stem)
def test_notebook_pairs_agree_and_carry_no_outputs(nb):
    py = nb.with_suffix(".py")
    assert py.exists(), f"{nb.name} has no paired py:percent file"
    a, b = jupytext.read(nb), jupytext.read(py)
    code = lambda n: [(c.cell_type, c.source.strip()) for c in n.cells]
    assert code(a) == code(b), f"{nb.name} and {py.name} drifted apart: run `jupytext --sync`"
    raw = json.loads(nb.read_text())
    assert all(not c.get("outputs") for c in raw["cells"] if c["cell_type"] == "code")
    first = next(c for c in raw["cells"] if c["cell_type"] == "code")
    assert "parameters" in first.get("metadata", {}).get("tags", []), "first code cell: parameters"
