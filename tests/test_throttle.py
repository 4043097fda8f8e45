"""A throttled campaign's long training GEMMs: found from the measurements alone, by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.predictors.throttle import KEEP, summary, throttled

PEAK = 10_000.0   # GFLOP/s


def gemms(gpu: str, cls: str, gflops, efficiency) -> pd.DataFrame:
    """Square GEMMs of ``gflops`` GFLOP each, timed at ``efficiency`` of the peak."""
    gflops = np.asarray(gflops, float)
    m = np.cbrt(gflops * 1e9 / 2)
    return pd.DataFrame({"gpu": gpu, "cls": cls, "op": cls, "B": 1.0, "M": m, "N": m, "K": m,
                         "H": np.nan, "peak_gflops": PEAK,
                         "latency_ms": gflops / (efficiency * PEAK) * 1e3})


def test_a_campaign_slower_on_long_gemms_is_throttled():
    mid, long_ = [1, 2, 5, 8], [12, 40, 100]
    frame = pd.concat([
        gemms("steady", "linear", mid, 0.6), gemms("steady", "linear", long_, 0.7),
        # a fall, but within the noise the rule tolerates
        gemms("noisy", "linear", mid, 0.6), gemms("noisy", "linear", long_, 0.6 * KEEP + 0.01),
        gemms("hot", "linear", mid, 0.6), gemms("hot", "linear", long_, 0.3),
        gemms("hot", "bmm", mid, 0.5), gemms("hot", "bmm", long_, 0.55),   # its bmm held
        pd.DataFrame({"gpu": "hot", "cls": "elementwise", "op": "add", "B": 1.0, "M": np.nan,
                      "N": np.nan, "K": np.nan, "H": 1e9, "peak_gflops": PEAK,
                      "latency_ms": [5.0]}),
    ], ignore_index=True)
    drop = throttled(frame)
    expected = ((frame["gpu"] == "hot") & (frame["cls"] == "linear") &
                (frame["M"] > np.cbrt(10e9 / 2))).to_numpy()
    assert (drop == expected).all()
    assert summary(frame) == {"hot linear": 3}


def test_no_mid_sized_gemms_no_verdict():
    frame = pd.concat([gemms("a", "linear", [0.1, 0.5], 0.2), gemms("a", "linear", [50], 0.1)],
                      ignore_index=True)
    assert not throttled(frame).any()
    assert not throttled(frame[frame["cls"] == "softmax"]).any()
