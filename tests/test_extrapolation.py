"""NeuSight's forecasts keep their physical properties on synthetic datasheets unlike any
training GPU (nslib.evaluation.extrapolation): scaling, monotonicity in every resource, and sanity
on a GPU with 5x the FLOP/byte balance of every training GPU.

Checked on the shipped (full-profile) predictor: scaling and monotonicity in bandwidth, peak,
L2 and memory hold by construction of the laws, monotonicity in the SM count (an MLP input)
only as trained, and the quick profile's 8 epochs do not always reach it."""
import pytest

from nslib.evaluation.extrapolation import kernel_frame, property_checks
from nslib.predictors.gpu_range import training_ranges
from nslib.data.settings import Settings
from nslib.predictors import trained


@pytest.fixture(scope="module")
def checks(data_dir):
    pred = trained("nslib", Settings(progress=False))
    return property_checks(pred, train_balance=training_ranges()["ranges"]["FLOP/byte"][1])


def test_check_kernels_are_built_by_hand():
    f = kernel_frame()
    big = f[f["name"] == "big GEMM"].iloc[0]
    assert big["flops"] == 2 * 8192 * 4096 * 8192
    assert big["bytes"] == 4 * (8192 * 4096 + 4096 * 8192 + 8192 * 8192)
    assert big["waves"] == -(-(8192 // 128) * (8192 // 128) // 80)


@pytest.mark.parametrize("check", ["scale", "more mem_bw", "more peak_gflops", "more l2_mb",
                                   "more mem_gb", "more num_sm", "more lanes", "more tdp_w",
                                   "5x balance"])
def test_property_holds_for_every_kernel(checks, check):
    sub = checks[checks["check"].str.startswith(check)]
    assert len(sub)
    bad = sub[~sub["ok"]]
    assert bad.empty, bad.to_string()


# GEMM shapes the training GPUs never ran, on datasheets unlike theirs (split-K, matrix-vector)
DATASHEETS = [{}, {"mem_bw": 450.0}, {"mem_bw": 3600.0}, {"peak_gflops": 56000.0},
              {"num_sm": 160.0, "peak_gflops": 28000.0}, {"num_sm": 20.0, "peak_gflops": 3500.0}]


def _gemm(pred, M, N, K, **gpu):
    import numpy as np
    import pandas as pd

    from nslib.evaluation.extrapolation import BASE
    from nslib.kernels import sizes
    # the board's power follows its peak, as on the synthetic datasheets of the scale check
    power = {"tdp_w": BASE["tdp_w"] * gpu.get("peak_gflops", BASE["peak_gflops"])
             / BASE["peak_gflops"]}
    f = pd.DataFrame([{"cls": "linear", "op": "linear", "B": 1.0, "M": float(M), "N": float(N),
                       "K": float(K), "H": np.nan, **BASE, **power, **gpu}])
    mem_ms = sizes.flops_bytes(f)[1][0] / (f["mem_bw"].iat[0] * 1e9) * 1e3
    return float(pred.predict(f)[0]), float(sizes.roofline_ms(f)[0]), mem_ms


@pytest.mark.parametrize("gpu", DATASHEETS)
def test_matrix_vector_is_near_bytes_over_bandwidth(data_dir, gpu):
    pred = trained("nslib", Settings(progress=False))
    for M, N, K in ((8192, 65536, 1), (1, 16384, 16384)):
        t, roof, mem_ms = _gemm(pred, M, N, K, **gpu)
        assert roof <= t <= 3.0 * mem_ms + 0.06, (M, N, K, t, mem_ms)  # + a launch


@pytest.mark.parametrize("gpu", DATASHEETS)
def test_long_reduction_splits_over_the_sms(data_dir, gpu):
    from nslib.evaluation.extrapolation import GEMM_FACTOR
    pred = trained("nslib", Settings(progress=False))
    t, roof, _ = _gemm(pred, 256, 524288, 256, **gpu)
    assert roof <= t <= GEMM_FACTOR * roof + 0.06, (t, roof)


def _gemms(gpu):
    """GEMM rows without tiles (as a model's trace gives them) on datasheet ``gpu``."""
    import pandas as pd

    from nslib.kernels.clock import frame_columns
    shapes = [("linear", 1, 512, 512, 512), ("linear", 1, 4096, 4096, 4096),
              ("linear", 1, 128, 1024, 4096), ("bmm", 16, 512, 64, 512),
              ("bmm", 64, 1024, 1024, 128)]
    return pd.DataFrame([{"cls": c, "op": c, "B": b, "M": m, "N": n, "K": k,
                          "H": float("nan"), **frame_columns(gpu)} for c, b, m, n, k in shapes])


def test_fastest_tiles_never_make_more_of_a_resource_slower(data_dir):
    """``tiles="fastest"`` (GEMMs): a GPU never profiled takes the fastest of the training
    GPUs' tile choices, so more bandwidth, peak or power on a datasheet near a training GPU's
    never prices its GEMMs slower (the nearest GPU's tile, the default, changes as a figure
    crosses another GPU's, and does); its own datasheet keeps its own choices."""
    import dataclasses

    import numpy as np

    from nslib.data.gpus import load_gpus
    s = Settings(quick=True, progress=False)
    fastest = {c: {"tiles": "fastest"} for c in ("bmm", "linear")}
    pred = trained("nslib", s, configs=fastest)
    nearest = trained("nslib", s)
    t4 = next(g for g in load_gpus().values() if g.name == "Tesla T4")
    own = _gemms(t4)
    assert np.allclose(pred.predict(own), nearest.predict(own))
    for field, values in (("mem_bw", (320, 400, 640, 900, 1280)),
                          ("peak_gflops", (8141, 9000, 12000, 16000)),
                          ("tdp_w", (70, 100, 150, 300))):
        sheets = [_gemms(dataclasses.replace(t4, name="What-if T4", **{field: v}))
                  for v in values]
        times = np.array([pred.predict(f) for f in sheets])
        assert (np.diff(times, axis=0) <= 1e-9 * times[1:]).all(), (field, times)
        # never slower than the nearest GPU's choice (for these dims one of the candidates)
        assert all((pred.predict(f) <= nearest.predict(f) * (1 + 1e-9)).all() for f in sheets)
    with pytest.raises(ValueError, match="tiles must be one of"):
        trained("nslib", s, configs={"softmax": {"tiles": "fastest"}})
