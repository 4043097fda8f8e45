"""Notebook 14 (a GPU measured with `nslib collect`) runs under papermill over the committed
collections in quick mode and writes every table and figure it promises, one set per GPU."""
import pandas as pd
from conftest import run_notebook

from nslib.evaluation import measured_gpu as mg


def test_14_measured_gpu(data_dir, mixed_dir, tmp_path):
    run_notebook("14_measured_gpu", tmp_path, quick=True, fp32_predictors=["roofline"],
                 tensor_predictors=["roofline"], step_predictors=["roofline"])
    folders = mg.collections(mg.DEFAULT_ROOT)
    assert folders, "datasets/measured holds the project's own collections"
    for f in folders:
        stem = mg.stem_of({"gpu": mg.datasheet(f).name})
        for name in ("14_fp32", "14_fp32_scatter", "14_tensor", "14_steps"):
            assert (tmp_path / f"{name}_{stem}.png").stat().st_size > 1000
        fp32 = pd.read_csv(tmp_path / f"14_fp32_{stem}.csv", index_col=0)
        assert {"linear", "bmm", "elementwise", "softmax", "layernorm"} == set(fp32.index)
        assert (fp32["roofline"] > 0).all() and (fp32["n"] > 0).all()
        steps = pd.read_csv(tmp_path / f"14_steps_{stem}.csv")
        assert (steps["latency_ms"] > 0).all() and steps["pred_roofline"].notna().all()
