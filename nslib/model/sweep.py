"""Fast scenario sweeps: one model over many (GPU, batch, seq) scenarios.

Transformer kernels keep their sequence when batch or sequence length change; only the dims
move, each as ``c * batch**i * seq**j``. Three small traces give ``c, i, j`` per kernel dim,
so a sweep needs no more tracing (batch 1 launches a slightly different sequence, e.g. no
batched broadcast copies, so it gets its own law from two traces at batch 1): every scenario's
kernels are computed by array arithmetic, identical kernels are merged with a count, and each class
is predicted in one batched call.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.settings import Settings, settings_of
from nslib.kernels import clock, sizes
from nslib.model.inputs import (LAW_POINTS, LAW_POINTS_ONE, get_predictor, kernel_frame,
                                resolve_gpu, traced)
from nslib.model.memory import sweep_memory
from nslib.model.stream import LAUNCH_US, stream_terms
from nslib.predictors.gpu_range import warn_out_of_range
from nslib.predictors.intervals import calibration

DIMS = ["B", "M", "N", "K", "H"]
# (batch, seq) probes, ratios 1.5 in each direction; batch 1 has its own pair


def scaling_law(model, mode: str, data=None, batch_one: bool = False) -> dict:
    """Per-kernel ``(c, i, j)`` of every dim (and of memory-op bytes) from probe traces."""
    probes = LAW_POINTS_ONE if batch_one else LAW_POINTS
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
    return _scaled(law, np.array([batch]), np.array([seq])).drop(columns="pair")


def _scaled(law: dict, batch: np.ndarray, seq: np.ndarray) -> pd.DataFrame:
    """The kernels of every (``batch[p]``, ``seq[p]``) pair at once, one trace after another;
    column ``pair`` holds p (one array computation instead of a frame per pair)."""
    n, m = len(law["base"]), len(batch)
    df = law["base"].iloc[np.tile(np.arange(n), m)].reset_index(drop=True)
    df["pair"] = np.repeat(np.arange(m), n)
    b, s = np.repeat(np.asarray(batch, float), n), np.repeat(np.asarray(seq, float), n)
    for col in DIMS + ["bytes"]:
        c, i, j = (np.tile(a, m) for a in law[col])
        df[col] = np.round(c * b ** i * s ** j)
    meas = df["cls"].isin(sizes.CLASSES).to_numpy()
    if meas.any():
        f, by = sizes.flops_bytes(df[meas])
        df.loc[meas, "flops"], df.loc[meas, "bytes"] = f, by
    return df


def _distinct(law: dict) -> tuple[dict, np.ndarray]:
    """The law of the distinct kernels only (same phase, class, op and scaling of every dim,
    e.g. one per layer stack) and how many times each occurs."""
    cols = DIMS + ["bytes"]
    base = law["base"][["phase", "cls", "op"] + cols + ["flops"]]
    key = base[["phase", "cls", "op"]].assign(**{f"{c}{k}": law[c][k] for c in cols
                                                 for k in range(3)})
    first, count = identical_rows(key)
    small = {"base": base.iloc[first].reset_index(drop=True),
             **{c: tuple(a[first] for a in law[c]) for c in cols}}
    return small, count


def identical_rows(keys: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first of each distinct row of ``keys``, in order of appearance; how many
    rows each stands for): kernels a model repeats (one per layer) are priced once."""
    group = keys.groupby(list(keys.columns), dropna=False, sort=False).ngroup().to_numpy()
    return np.unique(group, return_index=True)[1], np.bincount(group)


def _pair_kernels(laws: dict, pairs: np.ndarray) -> pd.DataFrame:
    """Distinct kernels of each (batch, seq) row of ``pairs`` with their ``count``, sorted by
    ``pair`` (the row of ``pairs``)."""
    parts = []
    for one, law in laws.items():
        sel = np.flatnonzero((pairs[:, 0] == 1) == one)
        if len(sel):
            small, count = _distinct(law)
            k = _scaled(small, pairs[sel, 0], pairs[sel, 1])
            parts.append(k.assign(pair=sel[k["pair"].to_numpy()], count=np.tile(count, len(sel))))
    key = ["pair", "phase", "cls", "op"] + DIMS + ["bytes"]
    uniq = pd.concat(parts, ignore_index=True).groupby(key, dropna=False, sort=False)["count"]
    return uniq.sum().reset_index().sort_values("pair", kind="stable", ignore_index=True)


def sweep(model, mode: str, scenarios: pd.DataFrame, predictor="nslib", *,
          launch_us: float | None = LAUNCH_US, memory: bool = True, optimizer: str = "adam",
          settings: Settings | None = None) -> pd.DataFrame:
    """Predicted ``e2e_ms``, ``fw_ms``, ``bw_ms`` for each row of ``scenarios``.

    ``scenarios`` has columns ``gpu`` (name, alias or GPU), ``batch`` and ``seq``. Identical
    kernels across layers and scenarios are predicted once. The ``warnings`` column names the
    GPU's datasheet figures outside the training GPUs' range ("; "-separated, "" when in
    range; :mod:`nslib.predictors.gpu_range`); each GPU out of range also gets one Python warning
    per figure. ``memory``: also the peak memory ``memory_gb``, the GPU's ``capacity_gb`` (GiB) and
    ``fits`` (:func:`nslib.model.memory.sweep_memory`, ``optimizer``'s states counted in training);
    the times of a scenario that does not fit are still given, as if it had the memory.
    With a cached calibration of ``predictor`` (``nslib calibrate``), ``interval_lo_ms`` and
    ``interval_hi_ms`` bound each step (:func:`nslib.model.predict.with_interval`).
    ``settings``: the data and training profile.
    """
    st = settings_of(settings)
    data, quick = st.data, st.quick
    laws = {one: scaling_law(model, mode, data, batch_one=one)
            for one in pd.unique(scenarios["batch"] == 1)}
    pred = get_predictor(predictor, data, quick)
    gpus = {g: resolve_gpu(g, data) for g in pd.unique(scenarios["gpu"])}
    notes = {g: "; ".join(warn_out_of_range(spec, data)) for g, spec in gpus.items()}
    # each distinct (GPU, batch, seq) is predicted once: its kernels are its pair's, with
    # the GPU's columns
    pairs, pair_of = np.unique(scenarios[["batch", "seq"]].to_numpy(int), axis=0,
                               return_inverse=True)
    combos = pd.DataFrame({"gpu": scenarios["gpu"].to_numpy(), "pair": pair_of.ravel()})
    combo_of = combos.groupby(["gpu", "pair"], sort=False).ngroup().to_numpy()
    combos = combos.drop_duplicates(ignore_index=True)
    uniq = kernel_frame(_pair_kernels(laws, pairs), next(iter(gpus.values())))
    sizes = np.bincount(uniq["pair"].to_numpy(), minlength=len(pairs))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    c_pair = combos["pair"].to_numpy()
    rows = np.concatenate([np.arange(starts[p], starts[p] + sizes[p]) for p in c_pair])
    big = uniq.iloc[rows].reset_index(drop=True)
    combo_row = np.repeat(np.arange(len(combos)), sizes[c_pair])
    sheet = pd.DataFrame([clock.frame_columns(gpus[g]) for g in combos["gpu"]])
    for col in sheet.columns:
        big[col] = sheet[col].to_numpy()[combo_row]
    count = big["count"].to_numpy(float)
    _, pred_ms, host_ms = stream_terms(pred, big, launch_us, data)
    # the host's dispatches bound each phase (nslib.model.stream.host_bound)
    pred_ms, host_ms = pred_ms * count, host_ms * count
    out = scenarios.copy()
    for phase in ("fw", "bw"):
        mask = (big["phase"] == phase).to_numpy()
        per_combo = np.maximum(
            np.bincount(combo_row[mask], pred_ms[mask], minlength=len(combos)),
            np.bincount(combo_row[mask], host_ms[mask], minlength=len(combos)))
        out[f"{phase}_ms"] = per_combo[combo_of]
    out["e2e_ms"] = out["fw_ms"] + out["bw_ms"]
    _add_interval(out, predictor, st, big["kernel_class"], pred_ms,
                  (combo_row, combo_of, len(combos)))
    out["warnings"] = [notes[g] for g in out["gpu"]]
    if memory:
        out = sweep_memory(model, mode, out, optimizer, data)
    return out


def _add_interval(out: pd.DataFrame, predictor, settings: Settings, classes, pred_ms,
                  groups: tuple) -> None:
    """``interval_lo_ms``/``interval_hi_ms`` columns of ``out`` when ``predictor`` has a cached
    calibration: as :func:`nslib.model.predict.with_interval`, per scenario. ``groups``:
    (each kernel row's combination, each scenario's combination, how many combinations)."""
    combo_row, combo_of, n_combos = groups
    cal = calibration(predictor, settings.data, settings.quick, build=False) \
        if isinstance(predictor, str) else None
    if cal is None:
        return
    lo, hi = cal.factors(list(classes))
    total = np.bincount(combo_row, pred_ms, minlength=n_combos)[combo_of]
    for col, f in (("interval_lo_ms", lo), ("interval_hi_ms", hi)):
        part = np.bincount(combo_row, pred_ms * f, minlength=n_combos)[combo_of]
        out[col] = out["e2e_ms"] * np.where(total > 0, part / np.maximum(total, 1e-300), 1.0)
