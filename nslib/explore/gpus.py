"""The explorer's GPUs: the datasheets it offers, and hypothetical GPUs made by editing one.

:func:`hypothetical_gpu` makes a GPU that does not exist (a real one with some datasheet numbers
changed), validated like a datasheet file; :func:`explorer_gpus` lists the real ones.
"""
from __future__ import annotations

import math

import numpy as np

from nslib.data.gpus import FIELDS, GPU, OPTIONAL_FIELDS, gpu_from_dict
from nslib.data.registry import all_gpus

# the datasheet numbers a hypothetical GPU may change (the explorer's sliders)
SLIDER_FIELDS = ("num_sm", "peak_gflops", "mem_bw", "mem_gb", "l2_mb")
# dataclass field -> JSON key (the optional ones too: a hypothetical GPU's BF16 peak, TDP, link)
JSON_KEY = {f: k for k, (f, _) in {**FIELDS, **OPTIONAL_FIELDS}.items()}
# datasheet counts: a hypothetical GPU's must be whole numbers
INT_FIELDS = ("num_sm", "cores_per_sm")
# how far (relative) a float count may sit from a whole number and still count as one
WHOLE_TOLERANCE = 1e-6
# a GPU label longer than this (characters, vendor prefix dropped) is cut in charts and warnings
SHORT_NAME_CHARS = 34
VENDOR_PREFIX = "NVIDIA "


def plain_number(v):
    """numpy scalars (from sliders or frames) as Python numbers, which gpu_from_dict accepts."""
    return v.item() if isinstance(v, np.generic) else v


def short_name(name: str, n: int = SHORT_NAME_CHARS) -> str:
    """A GPU label for charts and one-line warnings: no vendor prefix, at most ``n`` characters."""
    name = name.replace(VENDOR_PREFIX, "")
    return name if len(name) <= n else name[: n - 1] + "…"


def _default_name(base: GPU, overrides: dict) -> str:
    parts = []
    for f, v in overrides.items():
        old = getattr(base, f)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and old and v != old:
            parts.append(f"{f} x{v / old:.3g}")
    return f"{base.name} ({', '.join(parts)})" if parts else f"{base.name} (hypothetical)"


def _whole_counts(overrides: dict) -> dict:
    """``overrides`` with float SM and core counts as ints; ValueError for a fractional one."""
    out = dict(overrides)
    for f in INT_FIELDS:
        v = out.get(f)
        if isinstance(v, float) and math.isfinite(v):
            if abs(v - round(v)) > WHOLE_TOLERANCE * max(1.0, abs(v)):
                raise ValueError(f"hypothetical GPU: {f} must be a whole number, got {v!r}")
            out[f] = int(round(v))
    return out


def _ratio(new, old) -> float | None:
    """``new / old`` for two positive numbers, else None (the validation then names the bad
    value)."""
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
             and v > 0 for v in (new, old))
    return new / old if ok else None


def hypothetical_gpu(base: GPU, name: str | None = None, **overrides) -> GPU:
    """A GPU like ``base`` with some datasheet numbers replaced, validated like a datasheet.

    ``overrides``: any of ``num_sm``, ``peak_gflops`` (GFLOP/s), ``mem_bw`` (GB/s), ``mem_gb``,
    ``l2_mb`` (and ``cores_per_sm``, ``clock_mhz``), in the datasheet's units. ``name``: the
    new GPU's name (default: the base name with the changed factors, e.g.
    ``"NVIDIA H100 80GB HBM3 (mem_bw x2)"``). The result goes through
    :func:`nslib.data.gpus.gpu_from_dict`, so a zero, negative or non-numeric value raises the same
    ValueError a bad datasheet file does; an unknown field raises a ValueError listing the
    known ones. SM and core counts must be whole numbers. Unless ``clock_mhz`` is given, the
    clock follows the FP32 peak, SM count and lanes per SM as the datasheet relates them
    (``peak = 2 x SMs x lanes x clock``): a higher peak on the same SMs is a faster clock, which
    the laws that count issue slots and round trips per clock see
    (:mod:`nslib.kernels.issue_rate`, :mod:`nslib.kernels.row_latency`).
    """
    if not isinstance(base, GPU):
        raise TypeError(f"base must be an nslib.data.gpus.GPU (e.g. from load_gpus()), not "
                        f"{type(base).__name__}")
    unknown = sorted(set(overrides) - set(JSON_KEY))
    if unknown:
        raise ValueError(f"unknown GPU field(s) {unknown}; a hypothetical GPU may change "
                         f"{sorted(JSON_KEY)}")
    overrides = _whole_counts({k: plain_number(v) for k, v in overrides.items()})
    asked = dict(overrides)     # the name says what was asked, not the clock that follows
    if "clock_mhz" not in overrides and overrides.keys() & {"peak_gflops", "num_sm",
                                                            "cores_per_sm"}:
        ratio = {f: _ratio(overrides.get(f, getattr(base, f)), getattr(base, f))
                 for f in ("peak_gflops", "num_sm", "cores_per_sm")}
        if all(r is not None for r in ratio.values()):
            overrides["clock_mhz"] = base.clock_mhz * ratio["peak_gflops"] / (
                ratio["num_sm"] * ratio["cores_per_sm"])
    raw = base.to_json()
    for f, v in overrides.items():
        raw[JSON_KEY[f]] = v
    if name is None or not str(name).strip():
        name = _default_name(base, asked)
    raw["Device"] = str(name)
    return gpu_from_dict(raw, source=f"hypothetical GPU {str(name)!r}")


def datasheet_summary(gpu: GPU) -> str:
    """One line of a GPU's datasheet figures for the explorer: SMs, FP32 GFLOP/s, memory GB/s,
    GB, L2 MB, then TDP (maximum board power, W) when the datasheet gives it."""
    parts = [f"{gpu.num_sm} SMs", f"{gpu.peak_gflops:,.0f} GFLOP/s", f"{gpu.mem_bw:,.0f} GB/s",
             f"{gpu.mem_gb:,.0f} GB", f"L2 {gpu.l2_mb:,.3g} MB"]
    if gpu.tdp_w is not None:
        parts.append(f"TDP {gpu.tdp_w:,.0f} W")
    return ", ".join(parts)


def explorer_gpus(data=None) -> dict[str, GPU]:
    """The GPUs the explorer offers: every datasheet of :func:`nslib.data.gpus.all_gpus` (the
    NeuSight data's, the 16-bit data's with ``Bf16FLOPs``, KernelBench's)."""
    return all_gpus(data)


__all__ = ["SLIDER_FIELDS", "INT_FIELDS", "hypothetical_gpu", "explorer_gpus", "short_name",
           "plain_number", "datasheet_summary"]
