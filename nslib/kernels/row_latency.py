"""A layer norm's rows take at least one memory round trip per step, however few they are.

PyTorch's FP32 layer norm (``vectorized_layer_norm_kernel``; the NeuSight measurements record
its blocks as 32 x 4 threads) gives each row one block of :data:`THREADS` threads. A thread
loads :data:`VEC` elements, waits for them, folds them into its running mean and variance, and
loads the next: each block keeps only ``THREADS x VEC`` elements in flight, so a row costs
``ceil(H / (THREADS x VEC))`` steps per sweep, and the kernel sweeps a row twice (statistics,
then the normalised output; a traced group norm, priced as ``ln`` rows of ``N x groups``,
sweeps once before a separate elementwise pass). A step is a memory round trip plus a few dependent FP32
operations, :data:`STEP_CYCLES` cycles of the SM clock.

When the grid is small (16 rows of 4M elements use 16 SMs of 108) nothing else overlaps these
round trips, and the rows take ``2 x steps x STEP_CYCLES / clock`` however high the bandwidth:
Little's law for one block. With more blocks than SMs hold at once (at most
:data:`MAX_THREADS_PER_SM` threads each), they run in rounds. The result is a lower bound on
the kernel's GPU time (:func:`floor_ms`): a loaded memory system only lengthens a round trip.
The training GPUs never show it (their rows are at most 4K elements, under the host's dispatch
floor); the constant and the evidence are in docs/decisions.md ("Layer-norm rows: one round
trip per step").
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.units import MEGA, MS_PER_S

THREADS = 128              # threads per block of PyTorch's layer norm (32 x 4)
VEC = 4                    # elements a thread loads per step
SWEEPS = 2                 # statistics, then the output
# a group norm's moments kernel sweeps each row once; its output is a separate elementwise pass
GROUP_NORM_SWEEPS = 1
MAX_THREADS_PER_SM = 2048  # no NVIDIA SM holds more resident threads
# cycles of one step: a memory round trip plus the step's Welford updates (docs/decisions.md)
STEP_CYCLES = 890.0
OPS = ("ln",)              # the forward layer norm; its backward kernels are other loops


def floor_ms(frame: pd.DataFrame) -> np.ndarray:
    """Per kernel row of ``frame``, the least GPU time (ms) of a forward layer norm as its
    blocks' round trips allow (module docstring); 0 for every other kernel. ``B`` rows of
    ``H`` elements; ``num_sm`` and ``clock_mhz`` from the datasheet
    (:func:`nslib.kernels.clock.frame_columns`)."""
    out = np.zeros(len(frame))
    if not len(frame) or "op" not in frame.columns:
        return out
    rows = frame["op"].isin(OPS).to_numpy()
    if not rows.any():
        return out
    if "clock_mhz" not in frame.columns:
        raise ValueError("a layer-norm row lacks the GPU's clock_mhz: build the frame's GPU "
                         "columns with nslib.kernels.clock.frame_columns(gpu)")
    sub = frame.loc[rows]
    blocks = sub["B"].to_numpy(float)
    at_once = sub["num_sm"].to_numpy(float) * (MAX_THREADS_PER_SM // THREADS)
    sweeps = np.full(len(sub), float(SWEEPS))
    if "aten" in sub.columns:   # traced rows say which op; a group norm is an ``ln`` row too
        sweeps[sub["aten"].astype(str).str.contains("group_norm").to_numpy()] = GROUP_NORM_SWEEPS
    steps = sweeps * np.ceil(sub["H"].to_numpy(float) / (THREADS * VEC))
    cycles = np.ceil(blocks / at_once) * steps * STEP_CYCLES
    out[rows] = cycles / (sub["clock_mhz"].to_numpy(float) * MEGA) * MS_PER_S
    return out
