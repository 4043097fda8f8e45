"""Notebook 13 (intervals) runs under papermill in quick mode and writes its tables and
figures; the coverages are percentages and the end-to-end table covers the new GPUs."""
import pandas as pd
from conftest import run_notebook


def test_13_intervals(data_dir, mixed_dir, tmp_path):
    run_notebook("13_intervals", tmp_path, quick=True, predictor="roofline", modes=["inf"],
                 mixed=str(mixed_dir))
    for name in ("13_coverage_curve", "13_e2e_intervals"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    tab = pd.read_csv(tmp_path / "13_kernel_coverage.csv", index_col=0)
    assert {"linear", "bmm"} <= set(tab.index)
    assert ((tab["covered"] >= 0) & (tab["covered"] <= 100)).all()
    tab16 = pd.read_csv(tmp_path / "13_kernel_coverage_16bit.csv", index_col=0)
    assert set(tab16.index) == {"gemm", "attention"}
    assert ((tab16["covered"] >= 0) & (tab16["covered"] <= 100)).all()
    kb = tmp_path / "13_kernelbench_coverage.csv"
    if kb.exists():   # with KernelBench's timings: its campaigns as a second family
        kb = pd.read_csv(kb, index_col=0)
        assert "linear" in kb.index and "mean over GPUs" in kb.columns
        assert ((kb.fillna(0) >= 0) & (kb.fillna(0) <= 100)).all().all()
    e2e = pd.read_csv(tmp_path / "13_e2e_coverage.csv")
    assert len(e2e) >= 1 and (e2e["labels"] > 0).all()
