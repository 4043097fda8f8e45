"""Memory of many scenarios without tracing each: storage sizes as laws of batch and sequence
length (:func:`storage_law`), sweeps, and the largest batch that fits; and the published
per-layer activation formula, for comparison (:func:`korthikanti_bytes`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.model.inputs import LAW_POINTS, LAW_POINTS_ONE, resolve_gpu, traced
from nslib.model.memory.step import (GIB, Memory, framework_bytes, saved_bytes, step_memory,
                                     storage_lifetimes)

__all__ = ["storage_law", "law_memory", "sweep_memory", "largest_batch", "korthikanti_bytes",
           "layer_saved_bytes"]

# --------------------------------------------------------------------------------------------
# Sweeps: storage sizes as laws of batch and sequence length
# --------------------------------------------------------------------------------------------

def storage_law(model, mode: str, data=None, batch_one: bool = False) -> dict:
    """Every storage's bytes as ``c * batch**i * seq**j`` from the sweep's three probe traces
    (:func:`nslib.model.sweep.scaling_law`; batch 1 has its own), so a sweep sizes the memory of
    any (batch, seq) without tracing it. Raises ValueError when the storages differ between
    the probes (then use :func:`nslib.model.memory.memory_of` per scenario)."""
    probes = LAW_POINTS_ONE if batch_one else LAW_POINTS
    frames = [traced(model, b, s, mode, data) for b, s in probes]
    st = [storage_lifetimes(f) for f in frames]
    if not all(len(x[2]) == len(st[0][2]) and (x[0] == st[0][0]).all()
               and (x[1] == st[0][1]).all() for x in st[1:]):
        raise ValueError("this model's storages change with batch or sequence length: compute "
                         "its memory per scenario with nslib.model.memory.memory_of")
    x, y, z = st[0][2], st[1][2], st[2][2]
    with np.errstate(divide="ignore", invalid="ignore"):
        i = np.zeros_like(x) if batch_one else np.round(np.log(y / x) / np.log(1.5))
        j = np.round(np.log(z / x) / np.log(1.5))
    i, j = np.nan_to_num(i), np.nan_to_num(j)
    c = x / (probes[0][0] ** i * probes[0][1] ** j)
    return {"base": frames[0], "first": st[0][0], "last": st[0][1], "c": c, "i": i, "j": j}


def law_memory(law: dict, batch: int, seq: int, mode: str, optimizer: str = "adam",
               **kw) -> Memory:
    """:func:`step_memory` of the trace of (``batch``, ``seq``) sized by a :func:`storage_law`
    (``kw``: framework, capacity... as step_memory takes)."""
    nbytes = np.round(law["c"] * float(batch) ** law["i"] * float(seq) ** law["j"])
    return step_memory(law["base"], mode, optimizer,
                       storages=(law["first"], law["last"], nbytes), **kw)


def sweep_memory(model, mode: str, scenarios: pd.DataFrame, optimizer: str = "adam",
                 data=None) -> pd.DataFrame:
    """``scenarios`` (columns ``gpu``, ``batch``, ``seq``) with ``memory_gb`` (the peak),
    ``capacity_gb`` and ``fits`` added (one GPU each, no KV cache). Both figures in GiB (2**30
    bytes), the datasheet's ``Dev_Mem`` read as GiB as the driver reports it."""
    laws = {one: storage_law(model, mode, data, batch_one=one)
            for one in pd.unique(scenarios["batch"] == 1)}
    gpus = {g: resolve_gpu(g, data) for g in pd.unique(scenarios["gpu"])}
    ctx = {g: framework_bytes(spec, data)[0] for g, spec in gpus.items()}
    own = {(b, s): law_memory(laws[b == 1], int(b), int(s), mode, optimizer).total
           for b, s in set(zip(scenarios["batch"], scenarios["seq"]))}
    out = scenarios.copy()
    total = np.array([own[(b, s)] + ctx[g] for g, b, s in
                      zip(out["gpu"], out["batch"], out["seq"])])
    cap = np.array([float(gpus[g].mem_gb) * GIB for g in out["gpu"]])
    out["memory_gb"], out["capacity_gb"], out["fits"] = total / GIB, cap / GIB, total <= cap
    return out


def largest_batch(model, mode: str, seq: int, gpus, optimizer: str = "adam", data=None,
                  limit: int = 1 << 16) -> pd.DataFrame:
    """The largest batch of ``seq`` tokens whose step fits on each GPU (0: not even batch 1),
    by bisection over :func:`law_memory` (the peak grows with the batch). Columns ``gpu``,
    ``seq``, ``largest_batch``, ``memory_gb`` (at that batch), ``capacity_gb`` (both GiB)."""
    laws = {one: storage_law(model, mode, data, batch_one=one) for one in (True, False)}

    def need(b: int) -> float:
        return law_memory(laws[b == 1], b, seq, mode, optimizer).total

    rows = []
    for g in gpus:
        spec = resolve_gpu(g, data)
        room = float(spec.mem_gb) * GIB - framework_bytes(spec, data)[0]
        lo, hi = 0, limit + 1        # need(lo) fits (lo=0: nothing), need(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid) <= room else (lo, mid)
        used = need(lo) + float(spec.mem_gb) * GIB - room if lo else 0.0
        rows.append({"gpu": g, "seq": int(seq), "largest_batch": lo, "memory_gb": used / GIB,
                     "capacity_gb": float(spec.mem_gb)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# The published formula, for comparison
# --------------------------------------------------------------------------------------------

def korthikanti_bytes(seq: int, batch: int, hidden: int, heads: int, elem_bytes: int = 2,
                      mask_bytes: int = 1) -> float:
    """Activation bytes one transformer layer saves for its backward, by Korthikanti et al.
    (2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1):
    ``s*b*h*(34 + 5*a*s/h)`` for 16-bit activations and 1-byte dropout masks. Written per
    element size: ``s*b*h*(16*e + 2*m) + a*s*s*b*(2*e + m)`` (``e`` bytes per activation,
    ``m`` per mask element; ``e = 4`` for the FP32 steps nslib traces)."""
    s, b, h, a = (float(v) for v in (seq, batch, hidden, heads))
    return s * b * h * (16 * elem_bytes + 2 * mask_bytes) + a * s * s * b * (2 * elem_bytes +
                                                                           mask_bytes)


def layer_saved_bytes(trace: pd.DataFrame, layer: int) -> float:
    """Bytes the forward kernels of transformer block ``layer`` leave alive for the backward
    (a training trace): the trace's counterpart of :func:`korthikanti_bytes`."""
    sel = (trace["layer"].to_numpy() == layer) & (trace["phase"].to_numpy() == "fw")
    if not sel.any():
        raise ValueError(f"the trace has no forward kernels in block {layer}")
    return saved_bytes(trace, select=sel)
