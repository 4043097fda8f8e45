"""The power bound on a GEMM's FP32 rate (nslib.kernels.power), checked by hand."""
import numpy as np
import pandas as pd
import pytest

from nslib.kernels import power


def _frame(rows):
    cols = ["cls", "B", "M", "N", "K", "H", "tdp_w", "latency_ms"]
    f = pd.DataFrame(rows, columns=cols).astype({c: float for c in cols[1:]})
    return f.assign(op=f["cls"].map({"linear": "linear", "bmm": "bmm", "softmax": "softmax",
                                     "elementwise": "add"}))


def test_eta_is_the_most_flop_per_joule_of_a_long_gemm():
    f = _frame([
        # 2 * 4096^3 = 137.4 GFLOP in 10 ms at 250 W: 13744 GFLOP/s, 54.98 GFLOP/s per W
        ("linear", 1, 4096, 4096, 4096, np.nan, 250, 10.0),
        # same GEMM, 70 W board, 30 ms: 4581 GFLOP/s, 65.45 per W (the most)
        ("linear", 1, 4096, 4096, 4096, np.nan, 70, 30.0),
        # short GEMM (2.1 GFLOP) far faster per watt: not long enough to count
        ("bmm", 1, 1024, 1024, 1024, np.nan, 70, 0.001),
        # vector kernels never count
        ("elementwise", 1e6, np.nan, np.nan, np.nan, 4096, 70, 1e-6),
    ])
    assert power.learned_eta(f) == pytest.approx(2 * 4096 ** 3 / 1e9 / 0.030 / 70)


def test_eta_is_none_without_power_figures():
    f = _frame([("linear", 1, 4096, 4096, 4096, np.nan, np.nan, 10.0)])
    assert power.learned_eta(f) is None
    assert power.learned_eta(f.drop(columns="tdp_w")) is None


def test_floor_binds_only_gemms_with_a_tdp():
    f = _frame([("linear", 2, 1000, 1000, 1000, np.nan, 100, np.nan),
                ("linear", 2, 1000, 1000, 1000, np.nan, np.nan, np.nan),
                ("softmax", 4, np.nan, np.nan, np.nan, 1000, 100, np.nan)])
    floor = power.floor_ms(f, eta=50.0)
    # 4 GFLOP at 50 GFLOP/s/W x 100 W = 5000 GFLOP/s: 0.8 ms
    assert floor == pytest.approx([0.8, 0.0, 0.0])
    assert power.bounded(np.array([0.5, 0.5, 0.5]), f, 50.0) == pytest.approx([0.8, 0.5, 0.5])
    assert power.bounded(np.array([0.5, 0.5, 0.5]), f, None) == pytest.approx([0.5] * 3)


def test_more_power_never_slows_a_gemm():
    rows = [("linear", 1, 8192, 8192, 8192, np.nan, w, np.nan) for w in (50, 100, 300, 700)]
    floor = power.floor_ms(_frame(rows), eta=70.0)
    assert np.all(np.diff(floor) < 0)


def test_frames_carry_the_datasheets_power():
    from nslib.data.gpus import GPU
    from nslib.kernels import clock
    from nslib.model.inputs import kernel_frame
    hot = GPU(name="Hot", mem_gb=24, mem_bw=600, num_sm=72, cores_per_sm=128, clock_mhz=1700,
              peak_gflops=31000, l2_mb=6, tdp_w=150)
    bare = GPU(name="Bare", mem_gb=24, mem_bw=600, num_sm=72, cores_per_sm=128,
               clock_mhz=1700, peak_gflops=31000, l2_mb=6)
    trace = pd.DataFrame([{"cls": "linear", "op": "linear", "B": 1.0, "M": 64.0, "N": 64.0,
                           "K": 64.0, "H": np.nan}])
    assert kernel_frame(trace, hot)["tdp_w"].tolist() == [150.0]
    assert np.isnan(clock.frame_columns(bare)["tdp_w"])
    table = pd.DataFrame({"gpu": ["Hot", "Bare"]})
    got = clock.with_power(table, {"h": hot, "b": bare})["tdp_w"].to_numpy()
    assert got[0] == 150.0 and np.isnan(got[1])
    assert clock.with_clock(table, {"h": hot, "b": bare})["tdp_w"].iat[0] == 150.0


def test_nslib_learns_eta_from_its_training_gpus_and_keeps_it(data_dir):
    from nslib.data.settings import Settings
    from nslib.predictors import get, trained
    from nslib.predictors.training import train_frame
    pred = trained("nslib", Settings(progress=False))
    assert pred.power_eta == pytest.approx(power.learned_eta(train_frame()))
    assert 10 < pred.power_eta < 500          # GFLOP/s per W: a physical figure
    again = get("nslib")
    again.set_state(pred.get_state())
    assert again.power_eta == pred.power_eta
    # a big GEMM on a 100 W board: no faster than its power allows; without a TDP, unbounded
    from nslib.evaluation.extrapolation import kernel_frame
    f = kernel_frame(["linear"]).iloc[:1].assign(tdp_w=100.0)
    floor = power.floor_ms(f, pred.power_eta)[0]
    assert pred.predict(f)[0] == pytest.approx(max(floor, pred.predict(
        f.assign(tdp_w=np.nan))[0]))
    assert pred.predict(f)[0] >= floor > 0


class _Bounded:
    """A predictor stand-in: only what ``power_bound`` reads."""
    power_eta = 50.0

    def priced_frame(self, frame):
        return frame


def test_a_step_says_how_much_of_it_the_power_sets(capsys):
    from nslib.cli.common import power_hint
    from nslib.model.stream import power_bound
    f = _frame([("linear", 2, 1000, 1000, 1000, np.nan, 100, np.nan),     # floor 0.8 ms
                ("linear", 2, 1000, 1000, 1000, np.nan, 100, np.nan),
                ("softmax", 4, np.nan, np.nan, np.nan, 1000, 100, np.nan)])
    # the first at its floor (a dispatch below it), the second 1.5x it, the softmax unbounded
    f = f.assign(pred_ms=[0.78, 1.2, 0.02], peak_gflops=20000.0)
    got = power_bound(_Bounded(), f)["power_bound"]
    assert got["share"] == pytest.approx(0.78 / 2.0)
    assert got["tflops"] == pytest.approx(5.0)          # 50 GFLOP/s per W x 100 W
    assert got["of_peak"] == pytest.approx(0.25)
    assert got["gflops_per_w"] == 50.0
    power_hint({"power_bound": got})
    err = capsys.readouterr().err
    assert "sets 39% of this step" in err and "5.0 TFLOP/s (25% of the FP32 peak" in err
    # no bound binding, no TDP, or a predictor without the bound: nothing to say
    assert power_bound(_Bounded(), f.assign(pred_ms=[2.0, 2.0, 0.02])) == {}
    assert power_bound(_Bounded(), f.assign(tdp_w=np.nan)) == {}
    assert power_bound(object(), f) == {}


def test_a_tf32_convolution_is_not_set_by_the_fp32_power_floor():
    from nslib.model.stream import power_bound
    f = _frame([("linear", 2, 1000, 1000, 1000, np.nan, 100, np.nan),
                ("linear", 2, 1000, 1000, 1000, np.nan, 100, np.nan)])
    # both faster than the 0.8 ms floor (a tensor-core price), one marked TF32
    f = f.assign(pred_ms=[0.5, 0.78], peak_gflops=20000.0, tf32=[True, False])
    assert power_bound(_Bounded(), f)["power_bound"]["share"] == pytest.approx(0.78 / 1.28)
