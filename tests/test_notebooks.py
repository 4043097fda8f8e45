"""Every notebook runs under papermill in quick mode on the real data and writes its files."""
import pandas as pd
import pytest

from conftest import run_notebook


def test_01_kernel_data(data_dir, tmp_path):
    run_notebook("01_kernel_data", tmp_path, quick=True)
    for name in ("01_latency_vs_size", "01_gemm_roofline", "01_roofline_error_heatmap"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / f"{name}.pdf").exists()
    tab = pd.read_csv(tmp_path / "01_roofline_error.csv", index_col=0)
    assert 35 < tab.loc["bmm", "train_gpus"] < 45
    assert set(tab.index) == {"bmm", "linear", "elementwise", "softmax", "layernorm"}
