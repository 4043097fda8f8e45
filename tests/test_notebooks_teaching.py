"""The teaching notebook (00) and the GPU explorer notebook (08) run under papermill in quick
mode on the real data and write their figures and tables."""
import json

import pandas as pd
import pytest
from conftest import run_notebook


def _figures(folder, names):
    for name in names:
        assert (folder / f"{name}.png").stat().st_size > 1000, name
        assert (folder / f"{name}.pdf").exists(), name


def test_00_ideas(data_dir, tmp_path):
    run_notebook("00_ideas", tmp_path, quick=True)
    _figures(tmp_path, ["00_roofline", "00_tiles", "00_waves_staircase", "00_utilisation",
                        "00_extrapolation"])
    gpus = pd.read_csv(tmp_path / "00_gpus.csv", index_col=0)
    assert gpus["training GPU"].sum() == 5 and (gpus["ridge (FLOP/byte)"] > 1).all()
    ext = pd.read_csv(tmp_path / "00_extrapolation.csv", header=[0, 1], index_col=[0, 1])
    roles = set(ext.index.get_level_values(0))
    assert {"fitted on", "kept back (faster)", "new GPU"} <= roles
    mape = ext["MAPE %"]
    assert set(mape.columns) == {"bounded (nslib)", "unbounded MLP"}
    assert (mape > 0).all().all()


def test_08_gpu_explorer(data_dir, mixed_dir, tmp_path):
    nb = run_notebook("08_gpu_explorer", tmp_path, quick=True)
    _figures(tmp_path, ["08_scenario", "08_what_if", "08_serving"])
    summary = pd.read_csv(tmp_path / "08_scenario.csv", index_col=0)
    assert len(summary) == 4 and (summary["e2e_ms"] > 0).all()
    # the hypothetical GPU (first GPU, twice the bandwidth) is no slower than the first GPU
    assert summary["e2e_ms"].iloc[3] <= summary["e2e_ms"].iloc[0]
    assert not summary["in_training_range"].iloc[0]          # the H100 is out of range
    sweep = pd.read_csv(tmp_path / "08_what_if.csv", index_col=[0, 1])
    assert set(sweep.index.get_level_values(0)) == {"mem_bw", "peak_gflops"}
    per_class = pd.read_csv(tmp_path / "08_per_class.csv", index_col=0)
    assert per_class.sum(axis=1).to_numpy() == pytest.approx(summary["e2e_ms"].to_numpy())
    # the two explorer cells (step, serving) produced widgets, not errors
    cells = json.loads(nb.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    for cell in (code[-1], next(c for c in code if "build_explorer(" in "".join(c["source"]))):
        kinds = {k for o in cell.get("outputs", []) for k in o.get("data", {})}
        assert "application/vnd.jupyter.widget-view+json" in kinds
    assert not [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
