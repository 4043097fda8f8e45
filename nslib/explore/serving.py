"""Serving what-ifs as a plain function: one model served on several GPUs (real or
hypothetical) over a range of concurrencies, for the explorer's serving view.

:func:`serving_curves` returns one row per (GPU, concurrency) with TTFT, TPOT and tokens/s
(:func:`nslib.model.serving.serving_forecast`) and a note per GPU it could not forecast
(no ``Bf16FLOPs`` in the datasheet, a ``tp`` that does not divide the heads, weights that
do not fit): nothing is dropped without a word.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from nslib.data.settings import Settings
from nslib.model.serving import Workload, no_fit, serving_forecast, waiting_note

# concurrency points of a curve: powers of two up to the chosen maximum, and the steps between
POINTS_PER_OCTAVE = 2


def concurrencies(most: int) -> np.ndarray:
    """1 .. ``most`` on a log grid (:data:`POINTS_PER_OCTAVE` points per doubling)."""
    n = int(np.log2(max(most, 1)) * POINTS_PER_OCTAVE) + 1
    return np.unique(np.round(np.geomspace(1, max(most, 1), max(n, 1))).astype(int))


def serving_curves(gpus, model, workload: Workload = Workload(), *, most: int = 256,
                   concurrency=None, settings: Settings | None = None) -> dict:
    """``{"curves": frame, "notes": [...], "seconds": s}`` of ``workload`` (a
    :class:`nslib.model.serving.Workload`) on each GPU: the frame has a ``gpu`` column
    and the columns of :func:`nslib.model.serving.serving_forecast`; ``notes`` says which
    GPUs were left out and why, where the KV cache makes requests queue, and when the engine
    keeps requests waiting (:func:`nslib.model.serving.waiting_note`). The curves run
    over ``concurrency`` (default :func:`concurrencies` up to ``most``)."""
    tp = workload.tp
    t0 = time.perf_counter()
    conc = concurrencies(most) if concurrency is None else np.asarray(concurrency)
    parts, notes = [], []
    waits = waiting_note(workload.framework)
    if waits and (conc > 1).any():
        notes.append(waits)
    for g in gpus:
        name = getattr(g, "name", str(g))
        try:
            f = serving_forecast(model, g, conc, workload, settings=settings)
        except (KeyError, ValueError) as e:
            notes.append(f"{name}: not forecast ({str(e).strip(chr(39))})")
            continue
        if not f["fits"].all():   # no curve: its figures would price requests never held
            what, weights = no_fit(f.attrs["memory"], workload.isl + workload.osl)
            notes.append(f"{f.attrs['gpu']}: not forecast: {what} ({tp} GPU(s)); raise tp"
                         + ("" if weights else " or shorten the requests"))
            continue
        if f["kv_bound"].any():
            first = int(f.loc[f["kv_bound"], "concurrency"].iloc[0])
            notes.append(f"{f.attrs['gpu']}: from {first} requests on, the KV cache holds only "
                         f"{int(f['running'].max())}; the rest queue (TTFT includes the wait)")
        parts.append(f.assign(gpu=f.attrs["gpu"]))
    curves = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return {"curves": curves, "notes": notes, "seconds": time.perf_counter() - t0}


__all__ = ["concurrencies", "serving_curves"]
