"""Calibrated intervals: conformal quantiles, per-class bounds and the comonotone step by
hand, the nested check, the summary's interval, and ``nslib calibrate`` on the roofline."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from nslib.cli import main
from nslib.model.predict import with_interval
from nslib.predictors import intervals
from nslib.predictors.intervals import (Calibration, mape_band_coverage, nested_coverage,
                                        weighted_quantile)
from nslib.model.step import Step


def test_weighted_quantile_is_the_conformal_rank():
    r = np.arange(1.0, 10.0)                     # 9 values: rank ceil(10 * 0.9) = 9
    w = np.ones(9)
    assert weighted_quantile(r, w, 0.9) == 9.0
    assert weighted_quantile(r, w, 0.1) == 1.0   # floor(10 * 0.1) = 1
    assert weighted_quantile(r, w, 0.5) == 5.0


def _residuals():
    # GPU a: 90 kernels at r = -0.1 .. 0.1; GPU b: 10 kernels at r = 0.5 (too slow by e^0.5)
    a = pd.DataFrame({"gpu": "a", "cls": "linear", "r": np.linspace(-0.1, 0.1, 90)})
    b = pd.DataFrame({"gpu": "b", "cls": "linear", "r": np.full(10, 0.5)})
    out = pd.concat([a, b], ignore_index=True)
    out["latency_ms"] = 1.0
    out["pred_ms"] = np.exp(out["r"])
    return out


def test_every_gpu_weighs_the_same():
    cal = Calibration.fit(_residuals(), 0.8)
    lo, hi = cal.bounds["linear"]
    # unweighted, b's 10 kernels would sit above the 90% rank; weighted, they hold half
    assert hi == pytest.approx(0.5)
    # a's kernels weigh 100 / 180 each: the rank floor(101 * 0.1) = 10 is a's 18th smallest
    assert lo == pytest.approx(-0.1 + 0.2 * 17 / 89)
    f_lo, f_hi = cal.factors(["linear", "comm"])
    assert f_lo[0] == pytest.approx(np.exp(-0.5)) and f_hi[0] == pytest.approx(np.exp(-lo))
    assert f_lo[1] == f_hi[1] == 1.0             # no calibration: the prediction itself


def test_step_interval_adds_class_bounds_together():
    cal = Calibration("p", 0.8, {"linear": (-0.2, 0.4), "elementwise": (0.0, 0.1)})
    lo, hi = cal.step_interval({"linear": 10.0, "memory": 2.0, "comm": 1.0})
    # memory rows are priced as elementwise kernels
    assert lo == pytest.approx(10 * np.exp(-0.4) + 2 * np.exp(-0.1) + 1)
    assert hi == pytest.approx(10 * np.exp(0.2) + 2 * 1.0 + 1)
    assert Calibration.from_dict(cal.to_dict()) == cal


def test_nested_and_baseline_coverage():
    res = _residuals()
    nested = nested_coverage(res, 0.8).set_index("gpu")
    # b held out: a's bounds (+-0.1) miss every b kernel; a held out: b's single value misses
    assert nested.loc["b", "covered"] == 0.0
    assert nested.loc["a", "covered"] < 5.0
    band = mape_band_coverage(res).set_index("gpu")
    assert set(band.index) == {"a", "b"} and (band["half_width"] > 0).all()


def test_ensemble_members_price_alone(monkeypatch):
    from nslib.evaluation import interval_eval

    class Ens:
        """Prices a kernel at the mean of its class's members (numbers stand for MLPs)."""
        def __init__(self, models):
            self.models = models

        def predict(self, frame, lookup=False):
            return np.array([np.mean(self.models[c]) for c in frame["cls"]], float)

    pred = Ens({"bmm": [1.0, 3.0], "linear": [2.0]})
    parts = interval_eval.members(pred)
    assert list(parts) == ["bmm"]                        # single-model classes have no spread
    assert [m.models["bmm"] for m in parts["bmm"]] == [[1.0], [3.0]]
    assert pred.models["bmm"] == [1.0, 3.0]              # the predictor itself is untouched

    frame = pd.DataFrame({"gpu": ["g"] * 3, "cls": ["bmm"] * 3, "latency_ms": [2.0, 3.0, 5.0]})
    monkeypatch.setattr(interval_eval, "kernel_eval_frame", lambda data=None: frame)
    # the one fold loop of the kernel tables, with one training GPU whose fold is `pred`
    monkeypatch.setattr(interval_eval, "folds", lambda *a, **k: iter([("g", pred)]))
    out = interval_eval.ensemble_spread_coverage().iloc[0]
    # members price 1 and 3 ms: 2 and 3 inside, 5 outside; half the range over the mean 2
    assert out["covered"] == pytest.approx(200 / 3) and out["half_width"] == pytest.approx(50.0)
    assert out["members"] == 2


def test_bad_coverage():
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        Calibration.fit(_residuals(), 1.0)


def test_summary_interval_scales_the_step(monkeypatch):
    summ = {"e2e_ms": 20.0, "per_class_ms": {"linear": 10.0}}
    assert with_interval(summ, object()) is summ                    # a fitted predictor
    monkeypatch.setattr("nslib.model.predict.calibration", lambda *a, **k: None)
    assert "interval_ms" not in with_interval(summ, "nslib")       # nothing cached
    cal = Calibration("nslib", 0.8, {"linear": (-0.1, 0.2)})
    monkeypatch.setattr("nslib.model.predict.calibration", lambda *a, **k: cal)
    got = with_interval(summ, "nslib")
    # the classes sum to 10 ms of a 20 ms step (a floor, a schedule): the ratio carries over
    assert got["interval_ms"] == pytest.approx([20 * np.exp(-0.2), 20 * np.exp(0.1)])
    assert got["interval_coverage"] == 0.8


def test_calibrate_cli_roofline(data_dir, capsys):
    assert main(["calibrate", "--predictor", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["calibration"]["coverage"] == 0.8
    assert set(out["kernels"]) >= {"linear", "bmm", "elementwise"}
    for row in out["kernels"].values():
        assert 0 <= row["covered"] <= 100 and row["half_width"] > 0
    if out["calibration16"] is not None:   # with the 16-bit data: its nested check too
        assert set(out["kernels16"]) == {"gemm", "attention"}
        assert all(0 <= r["covered"] <= 100 for r in out["kernels16"].values())
    cal = intervals.calibration("roofline", build=False)
    assert cal is not None and cal.bounds


def test_sweep_interval_matches_predict(data_dir, monkeypatch):
    from nslib.model.predict import predict_model
    from nslib.model.sweep import sweep
    cal = Calibration("nslib", 0.8, {"linear": (-0.1, 0.3), "elementwise": (-0.05, 0.05)})
    monkeypatch.setattr("nslib.model.predict.calibration", lambda *a, **k: cal)
    monkeypatch.setattr("nslib.model.sweep.calibration", lambda *a, **k: cal)
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4,
           "n_positions": 256, "vocab_size": 500}
    out = sweep(cfg, "inf", pd.DataFrame({"gpu": ["V100"], "batch": [2], "seq": [64]}),
                predictor="roofline", memory=False)
    _, s = predict_model("V100", cfg, Step(2, 64, "inf"), "roofline")
    assert out["e2e_ms"].iloc[0] == pytest.approx(s["e2e_ms"])
    assert [out["interval_lo_ms"].iloc[0], out["interval_hi_ms"].iloc[0]] == \
        pytest.approx(s["interval_ms"])


def test_interval16_splits_tensor_and_vector_kernels(monkeypatch):
    from nslib.model.predict import with_interval16
    frame = pd.DataFrame({"cls": ["linear", "attention", "elementwise"],
                          "kernel_class": ["linear", "attention", "elementwise"],
                          "B": [1.0, 1.0, 1.0], "M": [64.0, 64.0, np.nan],
                          "N": [64.0, 64.0, np.nan], "K": [64.0, 64.0, np.nan],
                          "H": [np.nan, 4.0, 4096.0], "op": ["linear", "attention", "add"],
                          # a 16-bit GEMM: 2 bytes per element
                          "bytes": [2.0 * 3 * 64 * 64, 1.0, 3 * 4 * 4096.0],
                          "pred_ms": [3.0, 2.0, 1.0]})
    summ = {"e2e_ms": 6.0}
    monkeypatch.setattr("nslib.model.predict.tensor_calibration", lambda *a, **k: None)
    assert "interval_ms" not in with_interval16(summ, frame, "nslib", "nslib")
    tensor = Calibration("nslib", 0.8, {"gemm": (-0.1, 0.2), "attention": (0.0, 0.4)})
    vector = Calibration("nslib", 0.8, {"elementwise": (-0.3, 0.3)})
    monkeypatch.setattr("nslib.model.predict.tensor_calibration", lambda *a, **k: tensor)
    monkeypatch.setattr("nslib.model.predict.calibration", lambda *a, **k: vector)
    got = with_interval16(summ, frame, "nslib", "nslib")["interval_ms"]
    lo = 3 * np.exp(-0.2) + 2 * np.exp(-0.4) + 1 * np.exp(-0.3)
    hi = 3 * np.exp(0.1) + 2 * 1.0 + 1 * np.exp(0.3)
    assert got == pytest.approx([lo, hi])
