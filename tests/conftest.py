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


# Tests over 30 s (from --durations): every executed notebook, and the two that train the
# shipped predictors to check a property on every kernel. `make test-fast` leaves them out.
SLOW_TESTS = ("test_property_holds_for_every_kernel",
              "test_numpy_forward_equals_torch_forward_for_every_class")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__.startswith("test_notebooks") or \
                item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


_DATA_SKIP = "nslib data not here: "


def pytest_terminal_summary(terminalreporter):
    """One line for every test skipped for want of data, saying how to get it."""
    skipped = terminalreporter.stats.get("skipped", [])
    missing = sorted({r.longrepr[2].split(_DATA_SKIP, 1)[1].split(" (")[0] for r in skipped
                      if isinstance(r.longrepr, tuple) and _DATA_SKIP in r.longrepr[2]})
    n = sum(1 for r in skipped if isinstance(r.longrepr, tuple) and _DATA_SKIP in r.longrepr[2])
    if n:
        terminalreporter.write_line(
            f"{n} test{'s' if n > 1 else ''} skipped: no {', no '.join(missing)} data. `make data` fetches it (or "
            f"point NSLIB_DATA, NSLIB_MIXED, NSLIB_KERNELBENCH at a copy) and `make test` "
            f"runs them")


def _root_or_skip(find):
    """``find()`` (a data-folder finder of nslib.data), or skip the test when that data is
    not there."""
    from nslib.data import paths
    try:
        return find()
    except paths.DataNotFoundError as e:
        what = {"data_root": "NeuSight", "mixed_root": "16-bit",
                "kernelbench_root": "KernelBench"}.get(find.__name__, find.__name__)
        pytest.skip(f"{_DATA_SKIP}{what} ({e})")


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
