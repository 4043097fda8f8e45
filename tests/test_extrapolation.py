"""NeuSight's forecasts keep their physical properties on synthetic datasheets unlike any
training GPU (nslib.evaluation.extrapolation): scaling, monotonicity in every resource, and sanity
on a GPU with 5x the FLOP/byte balance of every training GPU.

Checked on the shipped (full-profile) predictor: scaling and monotonicity in bandwidth, peak,
L2 and memory hold by construction of the laws, monotonicity in the SM count (an MLP input)
only as trained, and the quick profile's 8 epochs do not always reach it."""
import pytest

from nslib.evaluation.extrapolation import kernel_frame, property_checks
from nslib.predictors.gpu_range import training_ranges
from nslib.predictors.training import trained


@pytest.fixture(scope="module")
def checks(data_dir):
    pred = trained("neusight", progress=False)
    return property_checks(pred, train_balance=training_ranges()["ranges"]["FLOP/byte"][1])


def test_check_kernels_are_built_by_hand():
    f = kernel_frame()
    big = f[f["name"] == "big GEMM"].iloc[0]
    assert big["flops"] == 2 * 8192 * 4096 * 8192
    assert big["bytes"] == 4 * (8192 * 4096 + 4096 * 8192 + 8192 * 8192)
    assert big["waves"] == -(-(8192 // 128) * (8192 // 128) // 80)


@pytest.mark.parametrize("check", ["scale", "more mem_bw", "more peak_gflops", "more l2_mb",
                                   "more mem_gb", "more num_sm", "5x balance"])
def test_property_holds_for_every_kernel(checks, check):
    sub = checks[checks["check"].str.startswith(check)]
    assert len(sub)
    bad = sub[~sub["ok"]]
    assert bad.empty, bad.to_string()
