"""The FP32 rate a GEMM can issue: an SM issues 128 lane-operations a clock, whatever its lanes.

An SM has four schedulers, each issuing one instruction for 32 threads a clock:
:data:`ISSUE_PER_CLOCK` lane-operations a clock in all. On an SM of 64 FP32 lanes (every
NeuSight training GPU) an FFMA holds its lanes for two clocks, so a GEMM loop's shared-memory
loads and loop arithmetic issue in between and the lanes stay busy. On an SM of 128 lanes
(the datasheet's ``Core_Per_SM``; Ampere GA10x, Ada, Hopper) the FFMAs alone need every issue
slot, and each other instruction of the loop takes one from them. An SGEMM thread computing an
8 x 8 output tile issues, per step of the reduction, 64 FFMA, four 128-bit shared loads and
about one copy, address or loop instruction: :data:`FFMA_SHARE` = 64 / 69 of its issue slots.

So a GEMM's FP32 rate is at most ``FFMA_SHARE x 2 x ISSUE_PER_CLOCK x SMs x clock``
(:func:`issue_gflops`), below the datasheet peak exactly when the SM has more than
``FFMA_SHARE x 128`` lanes: 1.86x the peak on every 64-lane GPU (never binding), 0.93x on a
128-lane one whose peak is ``2 x SMs x lanes x clock``. It grows with the clock and the SM
count and does not depend on the lanes, so more ``Core_Per_SM`` (a higher peak at the same
clock) never makes a kernel slower. A datasheet whose peak exceeds ``2 x SMs x lanes x clock``
(a peak quoted at a higher clock than ``Freq``) is bounded lower than 0.93 of it. Not fitted:
the share is the loop's instruction count (docs/decisions.md section 17).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.units import GHZ_PER_MHZ
from nslib.kernels import sizes

ISSUE_PER_CLOCK = 128        # 4 schedulers x 32 threads
FFMA_SHARE = 64.0 / 69.0     # 64 FFMA of 69 instructions per reduction step (8 x 8 thread tile)
FLOP_PER_FFMA = 2


def issue_gflops(frame: pd.DataFrame) -> np.ndarray:
    """Per row, the FP32 GFLOP/s the SMs can issue as a GEMM loop's FFMAs (module docstring):
    FLOP per clock of the SMs times the clock in GHz."""
    return (FFMA_SHARE * FLOP_PER_FFMA * ISSUE_PER_CLOCK * frame["num_sm"].to_numpy(float)
            * frame["clock_mhz"].to_numpy(float) * GHZ_PER_MHZ)


def bounded(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each FP32 GEMM row's ``peak_gflops`` at most :func:`issue_gflops`.
    A frame without ``clock_mhz`` is returned as it is: the training tables (64-lane GPUs,
    where the bound never binds) go without it; frames built from a datasheet
    (:func:`nslib.kernels.clock.frame_columns`) and the test tables as evaluated
    (:func:`nslib.kernels.clock.with_clock`) carry it."""
    if "clock_mhz" not in frame.columns or not len(frame):
        return frame
    gemm = frame["cls"].isin(sizes.GEMM_CLASSES).to_numpy()
    if not gemm.any():
        return frame
    peak = frame["peak_gflops"].to_numpy(float)
    capped = np.where(gemm, np.minimum(peak, issue_gflops(frame)), peak)
    if np.array_equal(capped, peak):
        return frame
    return frame.assign(peak_gflops=capped)
