"""What the predictors were trained on, and the explorer's warnings when a question leaves it.

:func:`explorer_ranges` reads the training GPUs' datasheet range and the training kernels' sizes
and wave counts; :func:`kernel_waves` gives a traced model's kernels their tiles and waves;
:func:`gpu_warning`, :func:`range_summary` and :func:`kernel_warnings` turn what lies outside
into one-line messages.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from nslib.data.gpus import GPU
from nslib.data.paths import data_root
from nslib.explore.gpus import short_name
from nslib.kernels import sizes
from nslib.kernels.measured import kernel_table
from nslib.kernels.sizes import MODEL_CLASSES
from nslib.kernels.tiles import TileLookup
from nslib.predictors.gpu_range import CHECKED, out_of_range
from nslib.predictors.gpu_range import training_ranges as datasheet_ranges
from nslib.predictors.training import train_frame

# kernel dims checked against the training kernels, per class (elementwise kernels are flat:
# only their element count matters to the measurements and the tile lookup)
RANGE_DIMS = {"bmm": ("B", "M", "N", "K"), "linear": ("M", "N", "K"),
              "elementwise": ("elements",), "softmax": ("B", "H"), "layernorm": ("B", "H")}
# numbers at least this large are shown without decimals in warnings
WHOLE_DISPLAY_FROM = 10


def data_key(data) -> str:
    """The data root as a string: what the explorer's in-process memos are keyed by."""
    return str(data_root(data))


def _elements(frame: pd.DataFrame) -> np.ndarray:
    return (frame["B"] * frame["H"]).to_numpy(float)


def _dim(frame: pd.DataFrame, d: str) -> np.ndarray:
    return _elements(frame) if d == "elements" else frame[d].to_numpy(float)


def explorer_ranges(data=None) -> dict:
    """What the predictors were trained on, from the training kernels (computed once per data).

    ``{"gpus": [Device names], "gpu": {feature: (min, max)}, "datasheet": ...,
    "dims": {cls: {dim: (min, max)}}, "waves": {cls: max waves}}``. Features are the datasheet
    columns of :data:`nslib.kernels.sizes.GPU_COLS`, ``datasheet`` is
    :func:`nslib.predictors.gpu_range.training_ranges` (the one source of the GPU ranges);
    dims those of :data:`RANGE_DIMS`.
    """
    return _explorer_ranges(data_key(data))


@lru_cache(maxsize=None)
def _explorer_ranges(root: str) -> dict:
    sheet = datasheet_ranges(root)
    gpu = {attr: tuple(sheet["ranges"][k]) for k, (attr, _) in CHECKED.items() if attr}
    dims, waves = {}, {}
    for cls in sizes.CLASSES:
        t = kernel_table(cls, "train", root)
        dims[cls] = {d: (float(np.nanmin(_dim(t, d))), float(np.nanmax(_dim(t, d))))
                     for d in RANGE_DIMS[cls]}
        waves[cls] = float(t["waves"].max())
    return {"gpus": list(sheet["train_gpus"]), "gpu": gpu, "datasheet": sheet,
            "dims": dims, "waves": waves}


def tile_lookup(predictor=None, data=None) -> TileLookup:
    """The tile lookup ``predictor`` holds (NeuSight's and the regressors' ``tiles``), or, for a
    predictor without one, a lookup fitted the same way on the training kernels."""
    tiles = getattr(predictor, "tiles", None)
    return tiles if isinstance(tiles, TileLookup) else _training_tiles(data_key(data))


@lru_cache(maxsize=None)
def _training_tiles(root: str) -> TileLookup:
    return TileLookup().fit(train_frame(root))


def clear_range_caches() -> None:
    """Forget the training ranges and fallback tile lookups kept in memory."""
    _explorer_ranges.cache_clear()
    _training_tiles.cache_clear()


def kernel_waves(frame: pd.DataFrame, data=None, predictor=None) -> pd.DataFrame:
    """``frame`` (a predicted kernel frame) with looked-up tiles, ``blocks`` and ``waves``.

    Tiles come from :func:`tile_lookup` of ``predictor``. The trace's own ``flops`` and
    ``bytes`` (real dtypes for memory ops) are kept as ``trace_flops`` and ``trace_bytes``;
    :func:`nslib.kernels.sizes.add_features` recomputes the FP32 ones for the kernel as predicted.
    """
    df = frame.assign(trace_flops=frame["flops"], trace_bytes=frame["bytes"])
    df = tile_lookup(predictor, data).lookup(df)
    return sizes.add_features(df)


# --------------------------------------------------------------------------------------------
# warnings
# --------------------------------------------------------------------------------------------

def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= WHOLE_DISPLAY_FROM else f"{v:,.3g}"


def gpu_warning(gpu: GPU, label: str, ranges: dict) -> str | None:
    """One line naming the datasheet figures of ``gpu`` outside the training GPUs' range
    (:func:`nslib.predictors.gpu_range.out_of_range`), or None when it is inside."""
    items = out_of_range(gpu, ranges=ranges["datasheet"])
    if not items:
        return None
    parts = [o.message().split(": ", 1)[1] for o in items]
    return f"{label} lies outside the training GPUs: {'; '.join(parts)}."


def range_summary(outside: dict[str, list]) -> str | None:
    """The explorer's one line for a scenario's GPUs outside the training range.

    ``outside``: ``{gpu label: [OutOfRange, ...]}`` of the GPUs out of range; the details
    (one line per figure) are folded under this line in the explorer.
    """
    if not outside:
        return None
    worst = [f"{short_name(label)} (up to {max(o.factor for o in items):.2g}x)"
             for label, items in outside.items()]
    return (f"{len(outside)} GPU(s) lie outside the training GPUs' datasheets: "
            f"{', '.join(worst)}. The forecast extrapolates (the roofline bound keeps "
            f"it physical; unbounded predictors such as mlp, xgboost and linreg may not be).")


def _measured_class(kc: str) -> str:
    """The training kernels a kernel class is checked against (memory ops: elementwise)."""
    return "elementwise" if kc == "memory" else kc


def _size_warning(kc: str, sub: pd.DataFrame, dims: dict) -> str | None:
    """One line for the kernels of class ``kc`` whose sizes leave the training ``dims``."""
    bad = np.zeros(len(sub), bool)
    details = []
    for d, (lo, hi) in dims.items():
        v = _dim(sub, d)
        above, below = v > hi, v < lo
        bad |= above | below
        if above.any():
            details.append(f"{d} up to {_num(np.nanmax(v))} (training max {_num(hi)})")
        if below.any():
            details.append(f"{d} down to {_num(np.nanmin(v))} (training min {_num(lo)})")
    if not bad.any():
        return None
    what = "memory ops (predicted as elementwise copies)" if kc == "memory" else f"{kc} kernels"
    return (f"{int(bad.sum())} of {len(sub)} {what} are outside the training "
            f"kernels' sizes: {'; '.join(details)}. Predictors saturate at the "
            f"edge of what they learned there.")


def _wave_warning(kc: str, featured: dict[str, pd.DataFrame], hi: float) -> str | None:
    """One line naming the GPUs on which kernels of class ``kc`` run more than ``hi`` waves."""
    hits, worst = [], 0.0
    for label, fr in featured.items():
        w = fr.loc[fr["kernel_class"] == kc, "waves"].to_numpy(float)
        n = int((w > hi).sum())
        if n:
            hits.append(f"{short_name(label)} ({n})")
            worst = max(worst, float(w.max()))
    if not hits:
        return None
    what = "memory ops" if kc == "memory" else f"{kc} kernels"
    return (f"{what} run more waves than any training {_measured_class(kc)} kernel (up to "
            f"{_num(worst)} waves; training max {_num(hi)}) on: {', '.join(hits)}.")


def kernel_warnings(featured: dict[str, pd.DataFrame], ranges: dict) -> list[str]:
    """Lines for kernels whose sizes or wave counts exceed those of the training kernels.

    ``featured``: ``{gpu label: kernel frame with waves}`` (see :func:`kernel_waves`). Sizes
    are the same on every GPU, so they are checked once; waves depend on the SM count and the
    tile, so they are checked per GPU. Memory ops are predicted as elementwise copies and are
    checked against the elementwise kernels.
    """
    if not featured:
        return []
    first = next(iter(featured.values()))
    lines = []
    for kc in MODEL_CLASSES:
        dims = ranges["dims"].get(_measured_class(kc))
        sub = first[first["kernel_class"] == kc]
        if dims is not None and len(sub):
            lines.append(_size_warning(kc, sub, dims))
    for kc in MODEL_CLASSES:
        hi = ranges["waves"].get(_measured_class(kc))
        if hi is not None:
            lines.append(_wave_warning(kc, featured, hi))
    return [line for line in lines if line]


__all__ = ["RANGE_DIMS", "explorer_ranges", "tile_lookup", "kernel_waves",
           "gpu_warning", "range_summary", "kernel_warnings", "clear_range_caches"]
