"""nslib's design (`nslib`): bounds, units, persistence, determinism (small real subsets)."""
import numpy as np
import pandas as pd
import pytest
import torch

from nslib.kernels import sizes
from nslib.predictors import PredictorFileError, get
from nslib.predictors.features import roofline_wave_ms
from nslib.predictors.nslib_design import NslibDesign


@pytest.fixture(scope="module")
def small(small_kernels):
    return small_kernels


@pytest.fixture(scope="module")
def fitted(small):
    return get("nslib", seed=3, epochs=3, batch=128).fit(small[0], progress=False)


def test_utilisation_in_unit_interval_and_never_beats_roofline(fitted, small):
    te = small[1]
    u = fitted.utilisation(te)
    assert ((u > 0) & (u <= 1 + 1e-12)).all()
    pred = fitted.predict(te)
    assert (pred >= sizes.roofline_ms(te) * (1 - 1e-9)).all()
    # also with looked-up tiles, as on a GPU never profiled
    assert (fitted.predict(te, lookup=True) >= sizes.roofline_ms(te) * (1 - 1e-9)).all()


def test_hand_checked_units(fitted):
    # one 1024^3 linear on a GPU with 10 SMs, 10 TFLOP/s, 1000 GB/s, tiles 128 x 128
    f = pd.DataFrame({"cls": ["linear"], "op": ["linear"], "B": [1.0], "M": [1024.0],
                      "N": [1024.0], "K": [1024.0], "H": [np.nan], "tile_m": [128.0],
                      "tile_k": [128.0], "num_sm": [10.0], "peak_gflops": [10000.0],
                      "mem_bw": [1000.0], "mem_gb": [16.0], "l2_mb": [4.0]})
    f = sizes.add_features(f)
    assert f["blocks"][0] == 64 and f["waves"][0] == 7
    # tile FLOPs 2*128*1024*128; roofline: compute-bound (intensity 170 FLOP/B > 10)
    wave = roofline_wave_ms(f)[0]
    assert wave == pytest.approx(10 * 2 * 128 * 1024 * 128 / 10e12 * 1e3)
    # the GEMM law is bounded by the kernel's roofline: u is the share of it reached
    u = fitted.utilisation(f)[0]
    assert fitted.predict(f)[0] == pytest.approx(sizes.roofline_ms(f)[0] / u)
    assert sizes.roofline_ms(f)[0] == pytest.approx(2 * 1024**3 / 10e12 * 1e3)


def test_save_load_round_trip_and_bad_files(fitted, small, tmp_path):
    te = small[1]
    path = fitted.save(tmp_path / "ns.npz")
    again = NslibDesign.load(path)
    assert np.array_equal(again.predict(te), fitted.predict(te))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a predictor file")
    with pytest.raises(PredictorFileError, match="not a readable predictor"):
        NslibDesign.load(bad)
    other = get("roofline").save(tmp_path / "roof.npz")
    with pytest.raises(PredictorFileError, match="'roofline' predictor, not 'nslib'"):
        NslibDesign.load(other)
    wrong = NslibDesign.load(path)  # a copy
    wrong.models["bmm"][0][0] = np.zeros((3, 3), np.float32)
    with pytest.raises(PredictorFileError, match="do not match"):
        NslibDesign.load(wrong.save(tmp_path / "mismatch.npz"))
    with pytest.raises(FileNotFoundError, match="nslib train"):
        NslibDesign.load(tmp_path / "missing.npz")


def test_same_seed_same_predictions(small, fitted):
    again = get("nslib", seed=3, epochs=3, batch=128).fit(small[0], progress=False)
    assert np.array_equal(again.predict(small[1]), fitted.predict(small[1]))


def test_unbounded_mlp_is_free_of_the_roofline(small):
    mlp = get("mlp", seed=0, epochs=2, batch=128).fit(small[0], progress=False)
    pred = mlp.predict(small[1])
    assert np.isfinite(pred).all() and (pred > 0).all()
    assert mlp.bounded is False


def test_traced_style_frame_without_tiles_gets_lookup(fitted):
    f = pd.DataFrame({"cls": ["bmm", "elementwise", "softmax"], "op": ["bmm", "gelu", "softmax"],
                      "B": [16.0, 8.0, 64.0], "M": [512.0, np.nan, np.nan],
                      "N": [64.0, np.nan, np.nan], "K": [512.0, np.nan, np.nan],
                      "H": [np.nan, 4096.0, 512.0], "num_sm": 132.0, "peak_gflops": 66908.0,
                      "mem_bw": 3430.0, "mem_gb": 80.0, "l2_mb": 50.0})
    pred = fitted.predict(f)
    assert np.isfinite(pred).all() and (pred >= sizes.roofline_ms(f)).all()


def _ctx(base, waves, mem_ms=(0.0, 0.0), sm_ms=(0.0, 0.0), comp_ms=(0.0, 0.0),
         roof_ms=(0.0, 0.0)):
    return torch.tensor([base, waves, mem_ms, sm_ms, comp_ms, roof_ms], dtype=torch.float64).T


def test_wave_laws_by_hand():
    from nslib.predictors.wave_laws import ADDITIVE_MS, KAPPA, wave_ms
    raw = torch.zeros(2, 2, dtype=torch.float64)           # sigmoid(0) = 0.5, exp(0) = 1
    ctx = _ctx([0.2, 0.2], [1.0, 4.0])                      # ms of one wave at the roofline
    assert wave_ms(raw, ctx, "paper").tolist() == pytest.approx(
        [0.2 / (0.5 * 0.5), 0.2 / (0.5 * (1 - 0.5 / 4))])
    assert wave_ms(raw, ctx, "overhead").tolist() == pytest.approx(
        [0.2 * 2 / 0.5, 0.2 * 5 / (0.5 * 4)])
    assert wave_ms(raw, ctx, "additive").tolist() == pytest.approx(
        [0.2 / 0.5 + ADDITIVE_MS, 0.2 / 0.5 + ADDITIVE_MS / 4])
    raw3 = torch.zeros(2, 3, dtype=torch.float64)
    # stream: launch + bytes / (0.5 * bandwidth) + bytes / (KAPPA * SM peak), per wave
    ctx = _ctx([0.001, 0.001], [1.0, 4.0], mem_ms=[0.1, 0.4], sm_ms=[0.01, 0.04])
    assert wave_ms(raw3, ctx, "stream").tolist() == pytest.approx(
        [ADDITIVE_MS + 0.2 + 0.01 / KAPPA, (ADDITIVE_MS + 0.8 + 0.04 / KAPPA) / 4])
    # series: launch + max(compute / 0.5, bytes / (0.75 * bandwidth)), per wave
    ctx = _ctx([0.001, 0.001], [1.0, 4.0], mem_ms=[0.1, 0.1], comp_ms=[0.3, 0.01])
    assert wave_ms(raw3, ctx, "series").tolist() == pytest.approx(
        [ADDITIVE_MS + 0.6, (ADDITIVE_MS + 0.1 / 0.75) / 4])
    # both kernel laws are bounded by the kernel's own roofline (whole kernel, not per wave)
    ctx = _ctx([0.001, 0.001], [1.0, 4.0], mem_ms=[0.1, 0.1], roof_ms=[5.0, 5.0])
    for form in ("stream", "series"):
        assert wave_ms(raw3, ctx, form).tolist() == pytest.approx([5.0, 5.0 / 4])
    with pytest.raises(ValueError, match="form"):
        wave_ms(raw, ctx, "linear")


def test_launch_cost_of_vector_ops_does_not_scale_with_bandwidth(fitted):
    # a GPU with 5x less bandwidth (and nothing else changed): a tiny elementwise kernel
    # costs mostly its fixed launch time on both, a huge memory-bound one up to 5x more (its
    # DRAM term scales, the SMs' own issue term does not)
    f = pd.DataFrame({"cls": ["elementwise"] * 2, "op": ["add"] * 2, "B": [1.0, 65536.0],
                      "M": np.nan, "N": np.nan, "K": np.nan, "H": [64.0, 4096.0]})
    fast = f.assign(num_sm=58.0, peak_gflops=30000.0, mem_bw=1500.0, mem_gb=24.0, l2_mb=48.0)
    slow = fast.assign(mem_bw=300.0)
    ratio = fitted.predict(slow) / fitted.predict(fast)
    assert 1.0 <= ratio[0] < 1.5
    assert 3.0 <= ratio[1] <= 5.0 * (1 + 1e-9)
