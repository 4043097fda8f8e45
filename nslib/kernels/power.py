"""The board's power as a bound on a GEMM's sustained FP32 rate.

A board draws at most its ``TDP`` (W, the datasheet's maximum board power). A long GEMM keeps
every FP32 lane, the register file and the shared memory busy, so its rate is at most what that
power pays for: ``eta x TDP`` GFLOP/s, where ``eta`` (GFLOP/s per W) is how many FLOP a joule
buys on the best board the predictor has seen. A 70 W part (the P4, the T4) throttles its clock
on a long SGEMM well below the boost clock the datasheet peak is quoted at; a 300 W board of the
same peak does not. The bound follows from energy, and only ``eta`` comes from the data:
:func:`learned_eta` takes the most FLOP per joule any training GPU reached on a long GEMM, so
the bound never asks a GPU for better energy efficiency than a measured board showed. It grows
with the TDP and does not depend on the peak, so more power or a higher peak never makes a
kernel slower. A datasheet without ``TDP`` (``tdp_w`` NaN) is not bounded.

Only long GEMMs say what a board sustains: a short one finishes before its power management
reacts (milliseconds), so ``eta`` is taken over GEMMs of at least :data:`LONG_GFLOP`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels import sizes

LONG_GFLOP = 20.0   # a GEMM this long runs >= 1 ms on every training GPU (<= 20 TFLOP/s)


def _gemm_flop(frame: pd.DataFrame) -> np.ndarray:
    """FLOP of each GEMM row of ``frame`` (:func:`sizes.flops_bytes`); 0 for other classes."""
    gemm = frame["cls"].isin(sizes.GEMM_CLASSES).to_numpy()
    return np.where(gemm, np.nan_to_num(sizes.flops_bytes(frame)[0]), 0.0)


def learned_eta(frame: pd.DataFrame) -> float | None:
    """GFLOP/s per W: the most any long GEMM (>= :data:`LONG_GFLOP`) of ``frame`` (measured
    rows with ``latency_ms`` and the datasheet's ``tdp_w``) reached per watt of its board's TDP;
    None when no such row has a TDP (the bound is then off)."""
    if "tdp_w" not in frame or "latency_ms" not in frame or not len(frame):
        return None
    flop, tdp = _gemm_flop(frame), frame["tdp_w"].to_numpy(float)
    ok = (flop >= LONG_GFLOP * 1e9) & np.isfinite(tdp) & (tdp > 0)
    if not ok.any():
        return None
    gflops = flop[ok] / 1e9 / (frame["latency_ms"].to_numpy(float)[ok] / 1e3)
    return float(np.max(gflops / tdp[ok]))


def floor_ms(frame: pd.DataFrame, eta: float | None) -> np.ndarray:
    """Per row, the least time (ms) a GEMM's FLOP take at ``eta x tdp_w`` GFLOP/s; 0 for
    other classes, rows without a TDP, or ``eta`` None."""
    out = np.zeros(len(frame))
    if eta is None or "tdp_w" not in frame or not len(frame):
        return out
    tdp = frame["tdp_w"].to_numpy(float)
    ok = np.isfinite(tdp) & (tdp > 0)
    out[ok] = _gemm_flop(frame)[ok] / (eta * tdp[ok] * 1e9) * 1e3
    return out


def bounded(latency_ms: np.ndarray, frame: pd.DataFrame, eta: float | None) -> np.ndarray:
    """``latency_ms`` (ms per row of ``frame``) no faster than the power bound
    (:func:`floor_ms`)."""
    return np.maximum(np.asarray(latency_ms, float), floor_ms(frame, eta))
