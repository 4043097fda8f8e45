"""Pipeline parallelism: the blocks split into stages, and the GPipe schedule's arithmetic.

**Pipeline parallel** (``pp=n``, ``microbatches=M``): the blocks are split into ``n``
contiguous stages of ``n_layer / n`` blocks; kernels outside the blocks go with the nearest
block kernel before them in launch order (after it for the leading ones: the embeddings with
the first stage, the head with the last) (:func:`pipeline_stages`). Each GPU runs its stage on
micro-batches of ``batch / M``; between stages the activation (``batch / M * seq * hidden``
FP32 values) is sent forward and its gradient backward. GPipe schedule (:func:`gpipe_time`):
micro-batch ``m`` starts on stage ``s`` when the stage has finished micro-batch ``m - 1`` and
the activation of ``m`` has arrived from stage ``s - 1``; all forwards, then all backwards
through the stages in reverse. With balanced stages of time ``t`` this is ``(M + n - 1) * t``
plus ``n - 1`` transfers per direction; with one micro-batch it is the sum of the stages plus
the transfers.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["pipeline_stages", "gpipe_time"]


def pipeline_stages(trace: pd.DataFrame, n: int, layers: int | None = None) -> np.ndarray:
    """Stage index of each row: block ``l`` -> ``l // (layers / n)``; rows outside the blocks
    take the stage of the nearest block row before them in their phase (after it when none
    precedes)."""
    layer = trace["layer"].to_numpy()
    if layers is None:
        layers = int(layer.max()) + 1 if (layer >= 0).any() else 0
    if layers == 0:
        return np.zeros(len(trace), dtype=np.int64)
    if layers % n:
        raise ValueError(f"pipeline parallelism needs the transformer layers divisible by pp: "
                         f"{layers} layers are not divisible by pp={n}")
    per = layers // n
    stage = pd.Series(np.where(layer >= 0, layer // per, np.nan), index=trace.index, dtype=float)
    phase = trace["phase"].to_numpy()
    out = stage.copy()
    for p in pd.unique(phase):
        mask = phase == p
        out[mask] = stage[mask].ffill().bfill()
    return out.fillna(0).to_numpy().astype(np.int64)


def gpipe_time(stage_ms, microbatches: int, transfer_ms: float) -> float:
    """Finish time of ``microbatches`` through stages of the given times (GPipe recursion)."""
    stage_ms = list(stage_ms)
    done = [0.0] * len(stage_ms)   # finish time of the previous micro-batch on each stage
    for _ in range(microbatches):
        arrive = 0.0
        for s, t in enumerate(stage_ms):
            start = max(done[s], arrive + (transfer_ms if s > 0 else 0.0))
            done[s] = start + t
            arrive = done[s]
    return done[-1] if done else 0.0
