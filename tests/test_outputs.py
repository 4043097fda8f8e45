"""`nslib reproduce` never clobbers what it should not: an unknown --only is an error before
anything is written, and the quick profile keeps to its own folder and leaves the README."""
from __future__ import annotations

import datetime
import subprocess

import pytest

from nslib import cli, reproduce
from nslib.data.paths import PROJECT_ROOT


def _tracked_state() -> str:
    """`git status` of the tracked files (empty string outside a git checkout)."""
    try:
        return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                              cwd=PROJECT_ROOT, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


@pytest.mark.parametrize("quick,out,figs,readme", [
    (False, None, "figures", True),
    (True, None, "figures/quick", False),
    (False, "elsewhere", "elsewhere", False),
    (True, "elsewhere", "elsewhere", False),
])
def test_output_paths(quick, out, figs, readme, tmp_path):
    out = None if out is None else tmp_path / out
    f, res, rd = reproduce.output_paths(quick, out)
    assert f == (out if out is not None else PROJECT_ROOT / figs)
    assert res == PROJECT_ROOT / "results" / ("quick" if quick else "full")
    assert (rd == PROJECT_ROOT / "README.md") if readme else rd is None


def test_unknown_notebook_is_an_error_listing_the_names(capsys):
    before = _tracked_state(), (PROJECT_ROOT / "README.md").read_bytes()
    with pytest.raises(ValueError, match="unknown notebook.*typo.*01_kernel_data"):
        reproduce.run(only=["typo"], progress=False)
    rc = cli.main(["reproduce", "--only", "typo", "01_kernel_data"])
    err = capsys.readouterr().err
    assert rc == 2 and "typo" in err and "04_inference" in err
    assert (_tracked_state(), (PROJECT_ROOT / "README.md").read_bytes()) == before


@pytest.fixture
def fake_notebooks(monkeypatch, tmp_path):
    """papermill replaced by a stand-in that writes one headline table into ``out``."""
    import papermill as pm

    def execute(src, dst, parameters, **kw):
        from pathlib import Path
        Path(parameters["out"], "04_inf_summary.csv").write_text("gpu,err\nX,1.25\n")
        Path(dst).write_text("{}")
    monkeypatch.setattr(pm, "execute_notebook", execute)
    monkeypatch.setattr(reproduce, "declared", lambda nb: set())


def test_quick_run_touches_no_tracked_file(data_dir, fake_notebooks, tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "FIGURES", tmp_path / "figures")
    before = _tracked_state(), (PROJECT_ROOT / "README.md").read_bytes()
    reproduce.run(quick=True, only=["04_inference"], results=tmp_path / "res", progress=False)
    assert (tmp_path / "figures" / "quick" / "04_inf_summary.csv").is_file()
    assert (tmp_path / "figures" / "quick" / "README.md").is_file()
    assert not (tmp_path / "figures" / "04_inf_summary.csv").exists()
    assert (_tracked_state(), (PROJECT_ROOT / "README.md").read_bytes()) == before


def test_full_run_names_profile_and_date_in_the_readme(data_dir, fake_notebooks, tmp_path,
                                                      monkeypatch):
    monkeypatch.setattr(reproduce, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(reproduce, "PROJECT_ROOT", tmp_path)
    (tmp_path / "README.md").write_text("intro\n<!-- headline:start -->\nold\n"
                                        "<!-- headline:end -->\nrest\n")
    reproduce.run(only=["04_inference"], results=tmp_path / "res", progress=False)
    text = (tmp_path / "README.md").read_text()
    today = datetime.date.today().isoformat()
    assert f"(full profile) on {today}" in text and "1.2" in text and "old" not in text
    assert text.startswith("intro\n") and text.endswith("rest\n")
