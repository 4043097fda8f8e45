"""Notebooks 06 (fusion) and 07 (distributed) run under papermill in quick mode and write their
figures and tables. The roofline predictor keeps them fast (no training); the NeuSight path is
the same code with another predictor."""
import pandas as pd
from conftest import run_notebook


def test_06_fusion(data_dir, tmp_path):
    run_notebook("06_fusion", tmp_path, quick=True, predictors=["roofline"])
    assert (tmp_path / "06_fusion_pred_vs_measured.png").stat().st_size > 1000
    assert (tmp_path / "06_fusion_pred_vs_measured.pdf").exists()
    res = pd.read_csv(tmp_path / "06_fusion_results.csv")
    assert len(res) >= 4 and res["fused error %"].notna().all()
    assert (res["predicted fused ms"] <= res["predicted ms"] + 1e-9).all()
    assert (tmp_path / "06_fusion_error_table.md").exists()
    assert (tmp_path / "06_fusion_groups.csv").exists()
    # a training GPU has fused labels: leave-one-GPU-out beside the paper's protocol (the
    # roofline is not trained, so the two rows agree)
    logo = pd.read_csv(tmp_path / "06_fusion_logo.csv", index_col=0)
    assert (logo.loc["roofline (paper protocol)"] ==
            logo.loc["roofline (leave-one-GPU-out)"]).all()


def test_07_distributed(data_dir, tmp_path):
    run_notebook("07_distributed", tmp_path, quick=True, predictors=["roofline"])
    assert (tmp_path / "07_distributed_scaling.csv").exists()
    for name in ("07_distributed_pred_vs_measured", "07_whatif"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    res = pd.read_csv(tmp_path / "07_distributed_results.csv")
    assert set(res["strategy"]) == {"dp4", "tp4", "pp4_1"}
    assert res["error %"].notna().all()
    whatif = pd.read_csv(tmp_path / "07_whatif.csv")
    assert set(whatif["strategy"]) == {"dp", "tp", "pp", "pp-m"} and (whatif["step_ms"] > 0).all()
