"""A long softmax row read three times: from the L2 while the rows in flight fit it, from DRAM
when they do not.

PyTorch's FP32 softmax launches one of two kernels by the row length ``H`` (``SoftMax.cu``):
rows of at most :data:`WARP_MAX_H` elements go to ``softmax_warp_forward``, which holds a row in
a warp's registers (one read, one write); longer rows go to ``cunn_SoftMaxForward``, one block
per row, which sweeps the row three times (its maximum, the sum of exponentials, then the
output: three reads and one write). The repeated reads cost no DRAM traffic while the rows the
GPU has in flight stay in its L2 between sweeps. Rows in flight are the blocks resident at
once (at most :data:`nslib.kernels.row_latency.MAX_THREADS_PER_SM` threads per SM, each block
of the threads PyTorch gives a row, :func:`block_threads`), never more rows than the kernel
has.

The law: the share of the repeated reads that miss is the share of the in-flight rows' bytes
beyond the L2's capacity, ``miss = max(0, 1 - L2 / in_flight)``, and the kernel moves
``bytes x (1 + miss)`` (two repeated reads over one read and one write). No constant is
fitted; the evidence (the training GPUs' long rows, leave-one-GPU-out, KernelBench) is in
docs/decisions.md section 19.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.units import MIB
from nslib.kernels.row_latency import MAX_THREADS_PER_SM
from nslib.kernels.sizes import BYTES_PER_ELEM

WARP_MAX_H = 1024          # longest row of PyTorch's warp softmax; longer rows, a block each
ILP = 4                    # floats a thread loads at once (one 16-byte vector)
MAX_BLOCK = 1024           # PyTorch's cap on a softmax block, before halving it
MIN_BLOCK = 32             # at least one warp
REPEATED_READS = 2         # the maximum's and the sum's sweeps, read again by the output's
MINIMUM_PASSES = 2         # one read and one write when every repeated read hits the L2
OPS = ("softmax",)         # the forward; the backward kernels are other loops


def block_threads(H) -> np.ndarray:
    """Threads of ``cunn_SoftMaxForward``'s block for rows of ``H`` elements: the power of two
    at least ``min(H / ILP, MAX_BLOCK) / 2``, at least a warp (PyTorch's
    ``SoftMax_getBlockSize``)."""
    want = np.minimum(np.asarray(H, float) / ILP, MAX_BLOCK) / 2
    return np.maximum(2.0 ** np.ceil(np.log2(np.maximum(want, 1.0))), MIN_BLOCK)


def miss_share(frame: pd.DataFrame) -> np.ndarray:
    """Per kernel row, the share (0-1) of a block softmax's repeated reads that reach DRAM:
    0 for other rows, for warp-softmax rows and where the datasheet gives no L2."""
    n = len(frame)
    if not n or "H" not in frame:
        return np.zeros(n)
    H = frame["H"].to_numpy(float)
    rows = frame["B"].to_numpy(float)
    sm = frame["num_sm"].to_numpy(float)
    l2 = frame["l2_mb"].to_numpy(float) * MIB if "l2_mb" in frame else np.full(n, np.nan)
    block = (frame["op"].isin(OPS).to_numpy() & (H > WARP_MAX_H) & np.isfinite(l2) & (l2 > 0))
    resident = np.floor(MAX_THREADS_PER_SM / block_threads(np.where(block, H, 1.0)))
    in_flight = np.minimum(sm * resident, rows) * H * BYTES_PER_ELEM
    with np.errstate(divide="ignore", invalid="ignore"):
        miss = np.clip(1.0 - l2 / in_flight, 0.0, 1.0)
    return np.where(block & np.isfinite(miss), miss, 0.0)


def dram_bytes(frame: pd.DataFrame) -> np.ndarray:
    """Per kernel row, the bytes (``frame["bytes"]``) with a block softmax's missed repeated
    reads added: ``bytes x (1 + REPEATED_READS / MINIMUM_PASSES x miss)``."""
    return frame["bytes"].to_numpy(float) * (1.0 + REPEATED_READS / MINIMUM_PASSES
                                             * miss_share(frame))


def with_rereads(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``bytes`` as :func:`dram_bytes` (a copy where any row changes)."""
    new = dram_bytes(frame) if len(frame) and "bytes" in frame else None
    if new is None or np.array_equal(new, frame["bytes"].to_numpy(float)):
        return frame
    return frame.assign(bytes=new)
