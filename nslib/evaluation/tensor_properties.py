"""Physical properties the 16-bit GEMM and attention predictors should keep on datasheets unlike
any they were trained on: more of one resource never makes a kernel slower.

The FP32 checks (:mod:`nslib.evaluation.extrapolation`) price a few synthetic kernels; the
16-bit kinds choose their own launch (tile, split-K, key splits) from the shape and the GPU,
so these checks take measured rows as they are (shapes and datasheets of the kind's table),
give one datasheet figure ``k`` times more and count the rows whose forecast does not grow.
A resource is grown the way hardware grows it: more SMs are SMs of the same kind (their share
of the peaks with them, with or without their share of the L2), a faster clock raises the
peaks with it. :func:`tensor_property_checks` returns one row per (check, factor).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

FACTORS = (1.5, 3.0)
TOL = 1e-6           # relative: float noise is not a slower kernel
PEAKS = ("bf16_gflops", "peak_gflops")


def _scaled(frame: pd.DataFrame, cols, k: float) -> pd.DataFrame:
    return frame.assign(**{c: frame[c].to_numpy(float) * k for c in cols})


# check name -> the datasheet columns it multiplies
CHECKS = {
    "more SMs (their peaks and L2)": ("num_sm", *PEAKS, "l2_mb"),
    "more SMs (their peaks, same L2)": ("num_sm", *PEAKS),
    "more BF16 peak": ("bf16_gflops",),
    "more bandwidth": ("mem_bw",),
    "more L2": ("l2_mb",),
    "faster clock (the peaks with it)": ("clock_mhz", *PEAKS),
}


def tensor_property_checks(pred, frame: pd.DataFrame, factors=FACTORS) -> pd.DataFrame:
    """Per check (:data:`CHECKS`) and factor: ``rows`` checked, ``passing`` (%, rows whose
    forecast did not grow) and ``worst`` (the largest forecast ratio, 1 when every row
    passes), for a fitted 16-bit predictor ``pred`` on ``frame`` (rows of its kind's table
    with their datasheet columns)."""
    if not len(frame):
        raise ValueError("no rows to check: pass rows of the kind's table "
                         "(nslib.predictors.mixed_training.kind_table)")
    base = np.asarray(pred.predict(frame), float)
    out = []
    for name, cols in CHECKS.items():
        for k in factors:
            ratio = np.asarray(pred.predict(_scaled(frame, cols, k)), float) / base
            out.append({"check": name, "factor": float(k), "rows": len(frame),
                        "passing": 100.0 * float(np.mean(ratio <= 1 + TOL)),
                        "worst": float(max(ratio.max(), 1.0))})
    return pd.DataFrame(out)


__all__ = ["CHECKS", "FACTORS", "tensor_property_checks"]
