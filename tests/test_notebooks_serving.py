"""Notebook 12 (serving) runs under papermill in quick mode and writes its figures and
tables; the error table covers every priced engine and the forecast every GPU given."""
import pandas as pd
from conftest import run_notebook


def test_12_serving(data_dir, mixed_dir, tmp_path):
    # the interval calibration (leave-one-GPU-out folds) is tested in test_intervals
    run_notebook("12_serving", tmp_path, quick=True, intervals=False,
                 forecast_gpus=["H100", "NVIDIA H200", "no such GPU"])
    for name in ("12_serving_scatter", "12_errors_by_concurrency", "12_forecast"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    errors = pd.read_csv(tmp_path / "12_serving_errors.csv")
    assert set(errors["framework"]) == {"vllm", "sglang", "trtllm"}
    assert (errors[["nslib_ttft_mape", "nslib_tpot_mape"]] >= 0).all().all()
    unpriced = pd.read_csv(tmp_path / "12_unpriced.csv")
    assert unpriced["rows"].sum() > 0
    forecast = pd.read_csv(tmp_path / "12_forecast.csv")
    assert set(forecast["gpu"]) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    assert (forecast["tokens_per_s_gpu"] > 0).all()
