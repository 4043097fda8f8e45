"""Training GEMMs measured while their GPU throttled, left out of nslib's training.

A GEMM's efficiency (FLOP/s over the FP32 peak) does not fall as it grows on a GPU that holds
its clock: more waves amortise the last one and the fixed costs. A campaign whose long GEMMs
(:data:`LONG_GFLOP` and more) run well below the efficiency of the same GPU's mid-sized ones
(:data:`MID_GFLOP`) of the same class was measured while the GPU lowered its clock (thermal or
power management over a long run), which no datasheet figure describes. Learned from, it
teaches the MLP that GPUs of that SM count and shape are slow, and a GPU of the same SM count
held out is priced slow too (docs/decisions.md, section 2). Such a class's long GEMMs are left
out of training: a (GPU, class) is throttled when the median efficiency of its long GEMMs is
under :data:`KEEP` times that of its mid-sized ones. The rule reads only the training
measurements, never a GPU's name.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels import sizes

MID_GFLOP = (1.0, 10.0)   # GEMMs long enough to fill the GPU, short enough to run unthrottled
LONG_GFLOP = 10.0         # >= 0.5 ms on every training GPU: long enough to throttle
KEEP = 0.75               # tolerance for measurement noise before a fall counts as throttling


def throttled(frame: pd.DataFrame) -> np.ndarray:
    """Per row of a measured training ``frame`` (``gpu``, ``cls``, ``latency_ms``,
    ``peak_gflops`` and the GEMM sizes): True for the long GEMMs of a (GPU, class) whose long
    GEMMs' median efficiency is under :data:`KEEP` times its mid-sized GEMMs' (module doc)."""
    out = np.zeros(len(frame), bool)
    gemm = frame["cls"].isin(sizes.GEMM_CLASSES).to_numpy()
    if not gemm.any():
        return out
    gflop = np.where(gemm, np.nan_to_num(sizes.flops_bytes(frame)[0]) / 1e9, 0.0)
    eff = gflop / (frame["latency_ms"].to_numpy(float) / 1e3) / \
        frame["peak_gflops"].to_numpy(float)
    mid = gemm & (gflop >= MID_GFLOP[0]) & (gflop < MID_GFLOP[1])
    long_ = gemm & (gflop >= LONG_GFLOP)
    keys = frame["gpu"].astype(str) + "\0" + frame["cls"].astype(str)
    for key in pd.unique(keys[long_]):
        this = (keys == key).to_numpy()
        if (this & mid).any() and \
                np.median(eff[this & long_]) < KEEP * np.median(eff[this & mid]):
            out |= this & long_
    return out


def summary(frame: pd.DataFrame) -> dict[str, int]:
    """``{"<GPU> <class>": rows}`` :func:`throttled` leaves out of ``frame``."""
    drop = throttled(frame)
    sub = frame[drop]
    return {f"{g} {c}": int(n) for (g, c), n in sub.groupby(["gpu", "cls"]).size().items()}
