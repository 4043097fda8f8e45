"""Notebook 10 (memory) runs under papermill in quick mode and writes its figures and tables."""
import pandas as pd
from conftest import run_notebook


def test_10_memory(data_dir, tmp_path):
    run_notebook("10_memory", tmp_path, quick=True)
    for name in ("10_breakdown", "10_per_gpu"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / f"{name}.pdf").exists()
    check = pd.read_csv(tmp_path / "10_check_vs_real.csv")
    assert len(check) == 8 and (check["error_pct"].abs() < 10).all()
    korth = pd.read_csv(tmp_path / "10_korthikanti.csv")
    exact = korth[korth["GeLU"] == "gelu"]
    assert ((exact["trace / formula"] - 1).abs() < 0.01).all()
    biggest = pd.read_csv(tmp_path / "10_largest_batch.csv", index_col=[0, 1])
    assert (biggest.to_numpy() >= 0).all()
    per_gpu = pd.read_csv(tmp_path / "10_per_gpu.csv", index_col=0)
    assert per_gpu.loc["tp2", "total"] < per_gpu.loc["1 GPU", "total"]
    assert per_gpu.loc["pp2", "weights"] < per_gpu.loc["1 GPU", "weights"]
