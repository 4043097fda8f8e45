"""Fast scenario sweeps: one model over many (GPU, batch, seq) scenarios.

Transformer kernels keep their sequence when batch or sequence length change; only the dims
move, each as ``c * batch**i * seq**j``. Three small traces give ``c, i, j`` per kernel dim,
so a sweep needs no more tracing (batch 1 launches a slightly different sequence, e.g. no
batched broadcast copies, so it gets its own law from two traces at batch 1): every scenario's kernels are computed by array arithmetic,
identical kernels are merged with a count, and each class is predicted in one batched call.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import kernels
from .launch import LAUNCH_US, stream_ms
from .predict import _predictor, kernel_frame, resolve_gpu, traced

DIMS = ["B", "M", "N", "K", "H"]
# (batch, seq) probes, ratios 1.5 in each direction; batch 1 has its own pair
_BASE = ((2, 32), (3, 32), (2, 48))
_BASE_ONE = ((1, 32), (1, 32), (1, 48))


def scaling_law(model, mode: str, data=None, batch_one: bool = False) -> dict:
    """Per-kernel ``(c, i, j)`` of every dim (and of memory-op bytes) from probe traces."""
    probes = _BASE_ONE if batch_one else _BASE
    a, b, c = (traced(model, bb, ss, mode, data) for bb, ss in probes)
    if not (len(a) == len(b) == len(c) and (a["aten"].to_numpy() == b["aten"].to_numpy()).all()
            and (a["aten"].to_numpy() == c["aten"].to_numpy()).all()):
        raise ValueError("this model's kernel sequence changes with batch or sequence length; "
                         "sweep it with predict_model per scenario instead")
    law = {"base": a}
    for col in DIMS + ["bytes"]:
        x, y, z = (f[col].to_numpy(float) for f in (a, b, c))
        with np.errstate(divide="ignore", invalid="ignore"):
            i = np.log(y / x) / np.log(1.5) if not batch_one else np.zeros_like(x)
            j = np.log(z / x) / np.log(1.5)
        fin = np.isfinite(x)
        i, j = np.where(fin, i, 0.0), np.where(fin, j, 0.0)
        # exponents are whole numbers but for a few tiny mask ops (seq + 1): rounded
        ri, rj = np.round(i), np.round(j)
        law[col] = (x / (probes[0][0] ** ri * probes[0][1] ** rj), ri, rj)
    return law


def scenario_kernels(law: dict, batch: int, seq: int) -> pd.DataFrame:
    """The kernel frame of one (batch, seq) from a scaling law (same columns as a trace)."""
    df = law["base"].copy()
    for col in DIMS + ["bytes"]:
        c, i, j = law[col]
        df[col] = np.round(c * float(batch) ** i * float(seq) ** j)
    meas = df["cls"].isin(kernels.CLASSES).to_numpy()
    if meas.any():
        f, b = kernels.flops_bytes(df[meas])
        df.loc[meas, "flops"], df.loc[meas, "bytes"] = f, b
    return df


def sweep(model, mode: str, scenarios: pd.DataFrame, predictor="neusight", data=None,
          quick: bool = False, launch_us: float | None = LAUNCH_US, memory: bool = True,
          optimizer: str = "adam") -> pd.DataFrame:
    """Predicted ``e2e_ms``, ``fw_ms``, ``bw_ms`` for each row of ``scenarios``.

    ``scenarios`` has columns ``gpu`` (name, alias or GPU), ``batch`` and ``seq``. Identical
    kernels across layers and scenarios are predicted once. The ``warnings`` column names the
    GPU's datasheet figures outside the training GPUs' range ("; "-separated, "" when in
    range; :mod:`nslib.gpu_range`); each GPU out of range also gets one Python warning per
    figure. ``memory``: also the peak memory ``memory_gb``, the GPU's ``capacity_gb`` and
    ``fits`` (:func:`nslib.memory.sweep_memory`, ``optimizer``'s states counted in training);
    the times of a scenario that does not fit are still given, as if it had the memory.
    """
    from .gpu_range import warn_out_of_range
    laws = {one: scaling_law(model, mode, data, batch_one=one)
            for one in pd.unique(scenarios["batch"] == 1)}
    pred = _predictor(predictor, data, quick)
    gpus = {g: resolve_gpu(g, data) for g in pd.unique(scenarios["gpu"])}
    notes = {g: "; ".join(warn_out_of_range(spec, data)) for g, spec in gpus.items()}
    parts = []
    for (batch, seq), grp in scenarios.groupby(["batch", "seq"], sort=False):
        k = scenario_kernels(laws[batch == 1], int(batch), int(seq))
        key = ["phase", "cls", "op"] + DIMS + ["bytes"]
        uniq = k.groupby(key, dropna=False, sort=False).size().rename("count").reset_index()
        for idx, g in grp["gpu"].items():
            parts.append(kernel_frame(uniq, gpus[g]).assign(scenario=idx))
    big = pd.concat(parts, ignore_index=True)
    big["pred_ms"] = stream_ms(pred, big, launch_us, data) * big["count"].to_numpy(float)
    tot = big.pivot_table(index="scenario", columns="phase", values="pred_ms", aggfunc="sum")
    out = scenarios.copy()
    out["fw_ms"] = tot.get("fw", pd.Series(0.0, index=tot.index)).reindex(out.index).fillna(0)
    out["bw_ms"] = tot.get("bw", pd.Series(0.0, index=tot.index)).reindex(out.index).fillna(0)
    out["e2e_ms"] = out["fw_ms"] + out["bw_ms"]
    out["warnings"] = [notes[g] for g in out["gpu"]]
    if memory:
        from .memory import sweep_memory
        out = sweep_memory(model, mode, out, optimizer, data)
    return out
