"""Shared test set-up: the data location, a private cache, and a papermill runner."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "neusight"
SHARED_MIXED = ROOT.parent / "shared" / "mixed"
SHARED_KERNELBENCH = ROOT.parent / "shared" / "kernelbench"
os.environ.setdefault("NSLIB_DATA", str(SHARED_DATA))
os.environ.setdefault("NSLIB_MIXED", str(SHARED_MIXED))
os.environ.setdefault("NSLIB_KERNELBENCH", str(SHARED_KERNELBENCH))
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    """One cache folder for the whole session (tables and quick predictors are reused)."""
    if "NSLIB_CACHE" not in os.environ or os.environ.get("CI") != "true":
        os.environ["NSLIB_CACHE"] = str(tmp_path_factory.mktemp("nslib-cache"))
    yield


def _root_or_skip(find):
    """``find()`` (a data-folder finder of nslib.data), or skip the test when that data is
    not there."""
    from nslib.data import paths
    try:
        return find()
    except paths.DataNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def data_dir():
    from nslib.data.paths import data_root
    return _root_or_skip(data_root)


@pytest.fixture(scope="session")
def mixed_dir():
    from nslib.data.paths import mixed_root
    return _root_or_skip(mixed_root)


@pytest.fixture(scope="session")
def kernelbench_dir():
    from nslib.data.kernelbench import kernelbench_root
    return _root_or_skip(kernelbench_root)


def run_notebook(name: str, out_dir: Path, **params) -> Path:
    """Execute notebooks/<name>.ipynb through papermill; returns the executed notebook path."""
    import papermill as pm
    executed = out_dir / f"{name}.ipynb"
    pm.execute_notebook(str(ROOT / "notebooks" / f"{name}.ipynb"), str(executed),
                        parameters={"out": str(out_dir), **params}, kernel_name="python3",
                        cwd=str(ROOT / "notebooks"), progress_bar=False)
    return executed


@pytest.fixture(scope="session")
def small_kernels(data_dir):
    """A few hundred training and test kernels of every class: ``(train, test)`` frames."""
    import pandas as pd

    from nslib.kernels import measured, sizes
    tr = pd.concat([measured.kernel_table(c, "train").sample(400, random_state=0)
                    for c in sizes.CLASSES], ignore_index=True)
    te = pd.concat([measured.kernel_table(c, "test").sample(150, random_state=0)
                    for c in sizes.CLASSES], ignore_index=True)
    return tr, te
