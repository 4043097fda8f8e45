"""nslib.explore.parallel: the what-if grid by hand, and the engine on a tiny GPT-2 (4 heads,
4 layers) with a constant-latency predictor: which points run, which are skipped and why, and
what must hold between them."""
import numpy as np
import pytest

from nslib.data.gpus import GPU
from nslib.explore.parallel import (STRATEGIES, link_sweep_degree, parallel_whatif,
                                         strategy_args, whatif_points)
from nslib.model.predict import predict_model
from nslib.model.step import Parallel, Step

CFG = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 64,
       "vocab_size": 500}
GPU0 = GPU(name="Test GPU", mem_gb=40, mem_bw=1500, num_sm=100, cores_per_sm=64,
           clock_mhz=1400, peak_gflops=19000, l2_mb=40)
BATCH, SEQ = 4, 16
PCIE3_GBPS = 32.0   # the default link of a GPU whose name matches no NVLink/PCIe rule
pytestmark = pytest.mark.filterwarnings(
    "ignore::nslib.predictors.gpu_range.DatasheetRangeWarning")


class Const:
    """A predictor: every kernel takes 1 ms."""

    def predict(self, frame):
        return np.ones(len(frame))


def test_strategy_args_by_hand():
    assert strategy_args("dp", 4, 8) == {"dp": 4}
    assert strategy_args("tp", 2, 8) == {"tp": 2}
    assert strategy_args("pp", 4, 8) == {"pp": 4}
    # one sample per micro-batch, except on one GPU (no pipeline)
    assert strategy_args("pp-m", 4, 8) == {"pp": 4, "microbatches": 8}
    assert strategy_args("pp-m", 1, 8) == {"pp": 1, "microbatches": 1}
    with pytest.raises(ValueError, match="unknown strategy"):
        strategy_args("ep", 2, 8)


def test_link_sweep_degree():
    assert link_sweep_degree([1, 2, 4, 8]) == 4
    assert link_sweep_degree([1, 2]) == 2
    assert link_sweep_degree([8, 2, 16]) == 16


def test_whatif_points_by_hand():
    pts = whatif_points([1, 2], [32, 900])
    assert pts == [("dp", 1, None), ("dp", 2, None), ("tp", 1, None), ("tp", 2, None),
                   ("pp", 1, None), ("pp", 2, None), ("pp-m", 1, None), ("pp-m", 2, None),
                   ("dp", 2, 32), ("dp", 2, 900), ("tp", 2, 32), ("tp", 2, 900),
                   ("pp", 2, 32), ("pp", 2, 900), ("pp-m", 2, 32), ("pp-m", 2, 900)]


@pytest.fixture(scope="module")
def whatif(data_dir):
    # each point is a full prediction: its dispatch floors come from the data's kernels
    return parallel_whatif(GPU0, CFG, Step(BATCH, SEQ, "train"), [1, 2, 3, 4], [50, 100],
                           Const())


def test_whatif_skips_degrees_that_do_not_divide_the_model(whatif):
    frame, skipped = whatif
    # 3 divides neither the batch (4), the heads (4) nor the layers (4)
    assert [s.split(":")[0] for s in skipped] == ["dp3", "tp3", "pp3", "pp-m3"]
    assert "batch 4 is not divisible by dp=3" in skipped[0]
    assert 3 not in set(frame["degree"])
    # 4 strategies x degrees 1, 2, 4 on the default link, then x 2 bandwidths at degree 4
    assert len(frame) == 4 * 3 + 4 * 2
    assert list(frame.columns) == ["strategy", "degree", "link_gbps", "step_ms", "comm_ms"]


def test_whatif_rows_hold_what_they_say(whatif):
    frame, _ = whatif
    default = frame.iloc[:12]
    assert (default["link_gbps"] == PCIE3_GBPS).all()
    assert frame.iloc[12:]["link_gbps"].tolist() == [50.0, 100.0] * 4
    assert (frame.iloc[12:]["degree"] == 4).all()
    # on one GPU every strategy is the same single-GPU step, without communication
    one = frame[frame["degree"] == 1]
    assert set(one["strategy"]) == set(STRATEGIES)
    assert one["step_ms"].nunique() == 1 and (one["comm_ms"] == 0).all()
    # a faster link never slows a step; on several GPUs something is communicated
    sweep = frame[frame["degree"] == 4]
    for _, g in sweep.groupby("strategy"):
        g = g.sort_values("link_gbps")
        assert g["comm_ms"].is_monotonic_decreasing and g["step_ms"].is_monotonic_decreasing
        assert (g["comm_ms"] > 0).all()


def test_whatif_point_is_the_models_prediction(whatif):
    frame, _ = whatif
    _, s = predict_model(GPU0, CFG, Step(BATCH, SEQ, "train"), Const(),
                         parallel=Parallel(pp=4, microbatches=BATCH, link=100))
    row = frame[(frame["strategy"] == "pp-m") & (frame["link_gbps"] == 100)].iloc[0]
    assert row["step_ms"] == s["e2e_ms"] and row["comm_ms"] == s["comm_ms"]
