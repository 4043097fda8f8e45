"""Datasheet range checks: which figures of a GPU lie outside those of the training GPUs.

The predictors learned from the training GPUs only (``train_gpus`` of
:func:`nslib.kernels.measured.gpu_splits`, read from the data, never listed in code). A GPU whose
datasheet leaves their range is an extrapolation, and every prediction says so:
:func:`out_of_range` lists the figures, :func:`warn_out_of_range` also issues them as
:class:`DatasheetRangeWarning` (a ``UserWarning``) for the Python API.

Checked figures: the datasheet numbers the predictors read (SM count, FP32 peak, memory
bandwidth, device memory, L2; see :data:`nslib.kernels.sizes.GPU_COLS`) and the machine balance
``SingleFLOPs / Mem_Bw`` (FLOP per byte), which decides where kernels turn compute-bound.
The 16-bit GEMM and attention predictors learned from the GPUs measured in the 16-bit data:
:func:`tensor_ranges` and :data:`CHECKED_16` (tensor-core peak and its balance) check those.
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

from nslib.data.cache import JSON, cached
from nslib.data.gpus import GPU, find_gpu, load_gpus, load_mixed_gpus
from nslib.data.mixed_data import attention_table, gemm_table, mixed_hash
from nslib.data.paths import DataNotFoundError, data_root
from nslib.kernels.measured import data_hash, gpu_splits

__all__ = ["CHECKED", "CHECKED_16", "DatasheetRangeWarning", "OutOfRange", "figures",
           "training_ranges", "tensor_ranges", "out_of_range", "range_warnings",
           "warn_out_of_range", "warn_out_of_tensor_range"]

# figure name (NeuSight JSON key, or the derived ratio) -> (GPU attribute or None, unit)
CHECKED = {
    "Num_Sm": ("num_sm", ""),
    "SingleFLOPs": ("peak_gflops", "GFLOP/s"),
    "Mem_Bw": ("mem_bw", "GB/s"),
    "Dev_Mem": ("mem_gb", "GB"),
    "L2Cache": ("l2_mb", "MB"),
    "FLOP/byte": (None, "FLOP/B"),
}
# the same for the 16-bit tensor-core predictors (trained on the 16-bit data's GPUs)
CHECKED_16 = {
    "Num_Sm": ("num_sm", ""),
    "Bf16FLOPs": ("bf16_gflops", "GFLOP/s"),
    "Mem_Bw": ("mem_bw", "GB/s"),
    "L2Cache": ("l2_mb", "MB"),
    "BF16 FLOP/byte": (None, "FLOP/B"),
}
# relative slack: a training GPU's own figures are always in range, and a figure within 1%
# of the range (19,500 against 19,492 GFLOP/s: datasheets round) is not an extrapolation
_TOL = 0.01
_MEMO: dict = {}     # data root -> ranges, for the life of the process


class DatasheetRangeWarning(UserWarning):
    """A prediction for a GPU whose datasheet lies outside the training GPUs' range."""


@dataclass(frozen=True)
class OutOfRange:
    """One datasheet figure of ``gpu`` outside the training GPUs' ``[lo, hi]``."""

    gpu: str
    figure: str
    value: float
    lo: float
    hi: float
    unit: str = ""
    who: str = "training GPU"  # whose range: "16-bit training GPU" for the tensor-core one

    @property
    def above(self) -> bool:
        return self.value > self.hi

    @property
    def factor(self) -> float:
        """How far out: ``value / hi`` above the range, ``lo / value`` below it (>= 1)."""
        return self.value / self.hi if self.above else self.lo / self.value

    def message(self) -> str:
        """E.g. ``"X: Mem_Bw 34,300 GB/s is 22x the largest training GPU's (1,555 GB/s)"``."""
        return f"{self.gpu}: {self.detail()}"

    def detail(self) -> str:
        """:meth:`message` without the GPU's name."""
        unit = f" {self.unit}" if self.unit else ""
        f = self.factor
        times = f"{f:.0f}x" if f >= 10 else f"{f:.2g}x"
        if self.above:
            return (f"{self.figure} {_num(self.value)}{unit} is {times} the largest "
                    f"{self.who}'s ({_num(self.hi)}{unit})")
        return (f"{self.figure} {_num(self.value)}{unit} is {times} below the smallest "
                f"{self.who}'s ({_num(self.lo)}{unit})")


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"


def figures(gpu: GPU, checked: dict = CHECKED) -> dict[str, float]:
    """The checked figures of one datasheet, keyed as ``checked`` (:data:`CHECKED` or
    :data:`CHECKED_16`; a missing tensor-core peak is NaN)."""
    out = {k: float(getattr(gpu, attr) or math.nan) for k, (attr, _) in checked.items() if attr}
    if "FLOP/byte" in checked:
        out["FLOP/byte"] = gpu.peak_gflops / gpu.mem_bw
    if "BF16 FLOP/byte" in checked:
        out["BF16 FLOP/byte"] = float(gpu.bf16_gflops or math.nan) / gpu.mem_bw
    return out


def _compute_ranges(data) -> dict:
    names = gpu_splits(data)["train_gpus"]
    gpus = load_gpus(data)
    sheets = [figures(find_gpu(n, gpus)) for n in names]
    if not sheets:
        raise ValueError("the training split names no GPU: the data's training tables are empty")
    return {"train_gpus": names, "ranges": _span(sheets, CHECKED)}


def _span(sheets: list[dict], checked: dict) -> dict:
    """``{figure: [min, max]}`` over the :func:`figures` of several datasheets."""
    return {k: [min(s[k] for s in sheets), max(s[k] for s in sheets)] for k in checked}


def _cached(memo_key, name: str, checked: dict, compute) -> dict:
    """Ranges from memory, else from ``<cache>/ranges/<name>.json``, else ``compute()`` (then
    written there): a cached prediction pays a file read, not a table scan."""
    hit = _MEMO.get(memo_key)
    if hit is None:
        hit = cached("ranges", name, compute, "training ranges", JSON,
                     valid=lambda v: set(v.get("ranges", {})) == set(checked))
        _MEMO[memo_key] = hit
    return hit


def training_ranges(data=None) -> dict:
    """``{"train_gpus": [Device names], "ranges": {figure: [min, max]}}`` of the training GPUs.

    Read from the data once and cached on disk by the data's content hash (and in memory for
    the process).
    """
    root = str(data_root(data))
    if root in _MEMO:  # a cached prediction skips even the data hash
        return _MEMO[root]
    return _cached(root, f"gpu_range_{data_hash(data)}", CHECKED,
                   lambda: _compute_ranges(data))

def out_of_range(gpu: GPU, data=None, ranges: dict | None = None) -> list[OutOfRange]:
    """The figures of ``gpu`` outside the training GPUs' range (empty when it is inside).

    ``ranges``: the result of :func:`training_ranges` (default: read from ``data``) or of
    :func:`tensor_ranges` (the 16-bit figures, then).
    """
    if ranges is None:
        try:
            ranges = training_ranges(data)
        except DataNotFoundError:
            # no NeuSight data, so no training GPUs to compare with: only a fitted predictor
            # passed in gets this far (a registered one needs the data to train)
            return []
    checked, who = ((CHECKED_16, "16-bit training GPU") if ranges.get("kind") == "tensor"
                    else (CHECKED, "training GPU"))
    out = []
    for k, v in figures(gpu, checked).items():
        lo, hi = ranges["ranges"][k]
        if math.isfinite(v) and (v < lo * (1 - _TOL) or v > hi * (1 + _TOL)):
            out.append(OutOfRange(gpu.name, k, v, float(lo), float(hi), checked[k][1], who))
    return out


def tensor_ranges(mixed=None) -> dict:
    """``{"kind": "tensor", "train_gpus": [...], "ranges": {figure: [min, max]}}`` over the
    GPUs measured in the 16-bit data (GEMM or attention tables), for :data:`CHECKED_16`;
    cached on disk and in memory by the data's content hash."""

    def compute() -> dict:
        names = set(gemm_table(mixed)["gpu"]) | set(attention_table(mixed)["gpu"])
        sheets = [figures(g, CHECKED_16) for g in load_mixed_gpus(mixed).values()
                  if g.name in names]
        return {"kind": "tensor", "train_gpus": sorted(names),
                "ranges": _span(sheets, CHECKED_16)}

    digest = mixed_hash(mixed)
    return _cached(("tensor", digest), f"tensor_range_{digest}", CHECKED_16, compute)


def warn_out_of_tensor_range(gpu: GPU, mixed=None) -> list[str]:
    """:func:`warn_out_of_range` against :func:`tensor_ranges`; none when the 16-bit data is
    absent (only fitted tensor predictors passed in get that far: named ones train on it)."""
    try:
        ranges = tensor_ranges(mixed)
    except DataNotFoundError:
        return []
    return warn_out_of_range(gpu, ranges=ranges, stacklevel=4)


def range_warnings(gpu: GPU, data=None, ranges: dict | None = None) -> list[str]:
    """:func:`out_of_range` as one line per figure."""
    return [o.message() for o in out_of_range(gpu, data, ranges)]


def warn_out_of_range(gpu: GPU, data=None, ranges: dict | None = None,
                      stacklevel: int = 3) -> list[str]:
    """:func:`range_warnings`, each also issued as a :class:`DatasheetRangeWarning`."""
    lines = range_warnings(gpu, data, ranges)
    for line in lines:
        warnings.warn(f"{line}: the forecast extrapolates beyond the training GPUs",
                      DatasheetRangeWarning, stacklevel=stacklevel)
    return lines


@contextmanager
def range_warnings_once():
    """Within it, each distinct :class:`DatasheetRangeWarning` is issued once, at the end.

    An evaluation predicts a GPU dozens of times; Python's own once-per-place filter does not
    hold when other code resets the warning filters in between (the tracer silences
    transformers that way), so every prediction would repeat the same lines. Other warnings
    pass through unchanged.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DatasheetRangeWarning)
        yield
    seen = []
    for w in caught:
        if not issubclass(w.category, DatasheetRangeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif str(w.message) not in seen:
            seen.append(str(w.message))
    for message in seen:
        warnings.warn(message, DatasheetRangeWarning, stacklevel=3)
