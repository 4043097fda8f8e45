"""The GPU explorer: what-if questions about GPUs and models, as plain functions plus a UI.

The logic is plain, testable functions; the ipywidgets UI (:func:`build_explorer`) only reads
its controls, calls them and draws the result:

- :func:`hypothetical_gpu` makes a GPU that does not exist (a real one with some datasheet
  numbers changed), validated like a datasheet file.
- :func:`parse_pasted_config` reads a HuggingFace config pasted as text; it never raises, it
  returns an error message instead.
- :func:`scenario` predicts one model configuration on several GPUs and returns a per-GPU
  summary, a per-class breakdown, the largest kernels with their roofline placement, and
  warnings when the question leaves the range the predictors were trained on.
- :func:`plot_scenario` draws a scenario: step time per GPU, the per-class breakdown, the
  largest kernels under each GPU's roofline, and the peak memory per GPU against its capacity
  (:func:`memory_table`); a GPU the step does not fit on is marked "does not fit" instead of
  being given a time.

Traces (``nslib.model.predict``), trained predictors, training ranges and the tile lookup are cached
in memory, so a second question about the same model and sizes answers in well under a second.
"""
from __future__ import annotations

import html
import inspect
import json
import math
import re
import time

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.data.gpus import FIELDS, GPU, gpu_from_dict, load_gpus
from nslib.data.paths import data_root
from nslib.predictors.gpu_range import CHECKED, DatasheetRangeWarning, out_of_range, tensor_ranges, training_ranges as datasheet_ranges
from nslib.model.predict import predict_model
from nslib.model.inputs import MODES, resolve_gpu
from nslib.kernels.dtypes import DTYPES, check_dtype
from nslib.model.config import load_model_config
from nslib.model.memory import memory_of
from nslib.data.gpus import load_mixed_gpus_if_present
from nslib.predictors.training import trained
from nslib.kernels.measured import kernel_table
from nslib.kernels.tiles import TILE_COLS, TileLookup
from nslib.predictors import available

# the datasheet numbers a hypothetical GPU may change (the explorer's sliders)
SLIDER_FIELDS = ("num_sm", "peak_gflops", "mem_bw", "mem_gb", "l2_mb")
_JSON_KEY = {f: k for k, (f, _) in FIELDS.items()}          # dataclass field -> JSON key
_INT_FIELDS = ("num_sm", "cores_per_sm")
# kernel dims checked against the training kernels, per class (elementwise kernels are flat:
# only their element count matters to the measurements and the tile lookup)
RANGE_DIMS = {"bmm": ("B", "M", "N", "K"), "linear": ("M", "N", "K"),
              "elementwise": ("elements",), "softmax": ("B", "H"), "layernorm": ("B", "H")}
CLASS_ORDER = ("linear", "bmm", "elementwise", "softmax", "layernorm", "memory")
PASTED = "(pasted config)"
# arguments of predict_model being built elsewhere: name -> value meaning "off"
FUTURE_ARGS = {"parallel": None, "fused": False}
# parts of the peak memory, in the order the memory bar stacks them
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "kv_cache", "framework", "comm")


# --------------------------------------------------------------------------------------------
# hypothetical GPUs
# --------------------------------------------------------------------------------------------

def _plain(v):
    """numpy scalars (from sliders or frames) as Python numbers, which gpu_from_dict accepts."""
    return v.item() if isinstance(v, np.generic) else v


def _default_name(base: GPU, overrides: dict) -> str:
    parts = []
    for f, v in overrides.items():
        old = getattr(base, f)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and old and v != old:
            parts.append(f"{f} x{v / old:.3g}")
    return f"{base.name} ({', '.join(parts)})" if parts else f"{base.name} (hypothetical)"


def hypothetical_gpu(base: GPU, name: str | None = None, **overrides) -> GPU:
    """A GPU like ``base`` with some datasheet numbers replaced, validated like a datasheet.

    ``overrides``: any of ``num_sm``, ``peak_gflops`` (GFLOP/s), ``mem_bw`` (GB/s), ``mem_gb``,
    ``l2_mb`` (and ``cores_per_sm``, ``clock_mhz``), in the datasheet's units. ``name``: the
    new GPU's name (default: the base name with the changed factors, e.g.
    ``"NVIDIA H100 80GB HBM3 (mem_bw x2)"``). The result goes through
    :func:`nslib.data.gpus.gpu_from_dict`, so a zero, negative or non-numeric value raises the same
    ValueError a bad datasheet file does; an unknown field raises a ValueError listing the
    known ones. SM and core counts must be whole numbers.
    """
    if not isinstance(base, GPU):
        raise TypeError(f"base must be an nslib.data.gpus.GPU (e.g. from load_gpus()), not "
                        f"{type(base).__name__}")
    unknown = sorted(set(overrides) - set(_JSON_KEY))
    if unknown:
        raise ValueError(f"unknown GPU field(s) {unknown}; a hypothetical GPU may change "
                         f"{sorted(_JSON_KEY)}")
    overrides = {k: _plain(v) for k, v in overrides.items()}
    for f in _INT_FIELDS:
        v = overrides.get(f)
        if isinstance(v, float) and math.isfinite(v):
            if abs(v - round(v)) > 1e-6 * max(1.0, abs(v)):
                raise ValueError(f"hypothetical GPU: {f} must be a whole number, got {v!r}")
            overrides[f] = int(round(v))
    raw = base.to_json()
    for f, v in overrides.items():
        raw[_JSON_KEY[f]] = v
    if name is None or not str(name).strip():
        name = _default_name(base, overrides)
    raw["Device"] = str(name)
    return gpu_from_dict(raw, source=f"hypothetical GPU {str(name)!r}")


# --------------------------------------------------------------------------------------------
# pasted configs
# --------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?\s*```\s*$", re.S)


def _known_model_types():
    try:
        from transformers import CONFIG_MAPPING
        return CONFIG_MAPPING
    except Exception:  # noqa: BLE001 - transformers missing or broken: skip this check
        return None


def parse_pasted_config(text) -> tuple[dict | None, str | None]:
    """Read a HuggingFace ``config.json`` pasted as text: ``(config, None)`` or ``(None, error)``.

    Never raises. Accepts surrounding whitespace and a Markdown code fence; rejects empty text,
    invalid JSON (the message gives the line and column, and a hint for Python-style dicts),
    anything but a JSON object, and a missing or unknown ``model_type``. Whether the sizes in
    the config are consistent is only known when the model is traced (the explorer shows that
    error too).
    """
    try:
        if text is None:
            return None, "No config was pasted: paste the contents of a HuggingFace config.json."
        if not isinstance(text, str):
            return None, f"The pasted config must be text (JSON), not {type(text).__name__}."
        body = text.strip()
        m = _FENCE.match(body)
        if m:
            body = m.group(1).strip()
        if not body:
            return None, ("The pasted config is empty: paste the contents of a HuggingFace "
                          "config.json.")
        try:
            cfg = json.loads(body)
        except json.JSONDecodeError as e:
            hint = ""
            if re.search(r"'[^']*'\s*:|\bTrue\b|\bFalse\b|\bNone\b", body):
                hint = (" It looks like a Python dict: JSON needs double quotes and "
                        "true/false/null.")
            elif re.search(r",\s*[}\]]", body):
                hint = " JSON allows no trailing comma before } or ]."
            return None, (f"The pasted config is not valid JSON: {e.msg} at line {e.lineno}, "
                          f"column {e.colno}.{hint}")
        if not isinstance(cfg, dict):
            return None, (f"The pasted config must be a JSON object ({{...}}, a HuggingFace "
                          f"config), not a {type(cfg).__name__}.")
        mt = cfg.get("model_type")
        if not isinstance(mt, str) or not mt.strip():
            return None, ("The pasted config has no 'model_type': add the HuggingFace model type, "
                          "e.g. \"model_type\": \"gpt2\" (or \"bert\", \"opt\", "
                          "\"switch_transformers\").")
        known = _known_model_types()
        if known is not None and mt not in known:
            return None, (f"Unknown model_type {mt!r}: transformers has no such model "
                          f"(e.g. 'gpt2', 'bert', 'opt', 'gptj', 'switch_transformers').")
        return cfg, None
    except Exception as e:  # noqa: BLE001 - the contract is: never raise
        return None, f"Could not read the pasted config ({type(e).__name__}: {e})."


# --------------------------------------------------------------------------------------------
# cached context: predictors, training ranges, tile lookup
# --------------------------------------------------------------------------------------------

_PREDICTORS: dict = {}
_RANGES: dict = {}
_LOOKUPS: dict = {}
_RESULTS: dict = {}   # (predictor, GPU, config, batch, seq, mode) -> predicted frame, summary
_RESULTS_MAX = 256


def _root(data) -> str:
    return str(data_root(data))


def get_predictor(name, data=None, quick: bool = False):
    """A fitted predictor by name (trained on first use, then kept in memory) or as given."""
    if not isinstance(name, str):
        return name
    key = (name, bool(quick), _root(data))
    if key not in _PREDICTORS:
        _PREDICTORS[key] = trained(name, data=data, quick=quick, progress=False)
    return _PREDICTORS[key]


def _elements(frame: pd.DataFrame) -> np.ndarray:
    return (frame["B"] * frame["H"]).to_numpy(float)


def _dim(frame: pd.DataFrame, d: str) -> np.ndarray:
    return _elements(frame) if d == "elements" else frame[d].to_numpy(float)


def training_ranges(data=None) -> dict:
    """What the predictors were trained on, from the training kernels (computed once per data).

    ``{"gpus": [Device names], "gpu": {feature: (min, max)}, "datasheet": ...,
    "dims": {cls: {dim: (min, max)}}, "waves": {cls: max waves}}``. Features are the datasheet
    columns of :data:`nslib.kernels.sizes.GPU_COLS`, ``datasheet`` is
    :func:`nslib.predictors.gpu_range.training_ranges` (the one source of the GPU ranges); dims those of
    :data:`RANGE_DIMS`.
    """
    root = _root(data)
    if root not in _RANGES:
        sheet = datasheet_ranges(data)
        gpu = {attr: tuple(sheet["ranges"][k]) for k, (attr, _) in CHECKED.items() if attr}
        dims, waves = {}, {}
        for cls in sizes.CLASSES:
            t = kernel_table(cls, "train", data)
            dims[cls] = {d: (float(np.nanmin(_dim(t, d))), float(np.nanmax(_dim(t, d))))
                         for d in RANGE_DIMS[cls]}
            waves[cls] = float(t["waves"].max())
        _RANGES[root] = {"gpus": list(sheet["train_gpus"]), "gpu": gpu, "datasheet": sheet,
                         "dims": dims, "waves": waves}
    return _RANGES[root]


def _tile_lookup(data=None):
    """A tile lookup fitted on the training kernels (as NeuSight's), built once per data."""
    root = _root(data)
    if root not in _LOOKUPS:
        keep = ["cls", "B", "M", "N", "K", "H", *sizes.GPU_COLS, "tile_m", "tile_k", "tile"]
        frames = [kernel_table(c, "train", data) for c in TILE_COLS]
        frame = pd.concat([f[[c for c in keep if c in f]] for f in frames], ignore_index=True)
        _LOOKUPS[root] = TileLookup().fit(frame)
    return _LOOKUPS[root]


def kernel_waves(frame: pd.DataFrame, data=None) -> pd.DataFrame:
    """``frame`` (a predicted kernel frame) with looked-up tiles, ``blocks`` and ``waves``.

    The trace's own ``flops`` and ``bytes`` (real dtypes for memory ops) are kept as
    ``trace_flops`` and ``trace_bytes``; :func:`nslib.kernels.sizes.add_features` recomputes the
    FP32 ones for the kernel as predicted.
    """
    df = frame.assign(trace_flops=frame["flops"], trace_bytes=frame["bytes"])
    df = _tile_lookup(data).lookup(df)
    return sizes.add_features(df)


# --------------------------------------------------------------------------------------------
# warnings
# --------------------------------------------------------------------------------------------

def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:,.3g}"


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
    worst = [f"{_short(label)} (up to {max(o.factor for o in items):.2g}x)"
             for label, items in outside.items()]
    return (f"{len(outside)} GPU(s) lie outside the training GPUs' datasheets: "
            f"{', '.join(worst)}. The forecast extrapolates (NeuSight's roofline bound keeps "
            f"it physical; unbounded predictors such as mlp, xgboost and linreg may not be).")


def kernel_warnings(featured: dict[str, pd.DataFrame], ranges: dict) -> list[str]:
    """Lines for kernels whose sizes or wave counts exceed those of the training kernels.

    ``featured``: ``{gpu label: kernel frame with waves}`` (see :func:`kernel_waves`). Sizes
    are the same on every GPU, so they are checked once; waves depend on the SM count and the
    tile, so they are checked per GPU. Memory ops are predicted as elementwise copies and are
    checked against the elementwise kernels.
    """
    out = []
    if not featured:
        return out
    first = next(iter(featured.values()))
    for kc in CLASS_ORDER:
        cls = "elementwise" if kc == "memory" else kc
        if cls not in ranges["dims"]:
            continue
        sub = first[first["kernel_class"] == kc]
        if not len(sub):
            continue
        bad = np.zeros(len(sub), bool)
        details = []
        for d, (lo, hi) in ranges["dims"][cls].items():
            v = _dim(sub, d)
            above, below = v > hi, v < lo
            bad |= above | below
            if above.any():
                details.append(f"{d} up to {_num(np.nanmax(v))} (training max {_num(hi)})")
            if below.any():
                details.append(f"{d} down to {_num(np.nanmin(v))} (training min {_num(lo)})")
        if bad.any():
            what = "memory ops (predicted as elementwise copies)" if kc == "memory" else \
                f"{kc} kernels"
            out.append(f"{int(bad.sum())} of {len(sub)} {what} are outside the training "
                       f"kernels' sizes: {'; '.join(details)}. Predictors saturate at the "
                       f"edge of what they learned there.")
    for kc in CLASS_ORDER:
        cls = "elementwise" if kc == "memory" else kc
        hi = ranges["waves"].get(cls)
        if hi is None:
            continue
        hits, worst = [], 0.0
        for label, fr in featured.items():
            w = fr.loc[fr["kernel_class"] == kc, "waves"].to_numpy(float)
            n = int((w > hi).sum())
            if n:
                hits.append(f"{_short(label)} ({n})")
                worst = max(worst, float(w.max()))
        if hits:
            what = "memory ops" if kc == "memory" else f"{kc} kernels"
            out.append(f"{what} run more waves than any training {cls} kernel (up to "
                       f"{_num(worst)} waves; training max {_num(hi)}) on: {', '.join(hits)}.")
    return out


DOMINANCE_COLS = ("peak_gflops", "mem_bw", "mem_gb", "l2_mb")


def dominance_warnings(specs: list[GPU], labels: list[str], e2e_ms: list[float],
                       tol: float = 0.01) -> list[str]:
    """Lines for GPUs predicted slower than a GPU they beat on every datasheet number.

    With the same SM count, a GPU with at least the FP32 peak, bandwidth, memory and L2 of
    another can never be slower in reality; a forecast that says so (by more than ``tol``) is
    the predictor extrapolating non-physically, and the explorer says so.
    """
    out = []
    for i, a in enumerate(specs):
        for j, b in enumerate(specs):
            if i == j or a.num_sm != b.num_sm:
                continue
            ca, cb = a.columns(), b.columns()
            if not all(ca[c] >= cb[c] for c in DOMINANCE_COLS) or ca == cb:
                continue
            if e2e_ms[i] > e2e_ms[j] * (1 + tol):
                out.append(f"{labels[i]} has at least the datasheet of {labels[j]} in every "
                           f"number, yet is predicted slower ({e2e_ms[i]:,.1f} ms vs "
                           f"{e2e_ms[j]:,.1f} ms): the predictor extrapolates non-physically "
                           f"here; compare the per-class breakdown to see which kernels.")
    return out


# --------------------------------------------------------------------------------------------
# scenario
# --------------------------------------------------------------------------------------------

def _labels(specs: list[GPU]) -> list[str]:
    names = [g.name for g in specs]
    labels = []
    for g in specs:
        lab = g.name if names.count(g.name) == 1 else f"{g.name} [{g.key}]"
        while lab in labels:
            lab += "'"
        labels.append(lab)
    return labels


def _shape(r) -> str:
    dims = ("B", "M", "N", "K") if r["cls"] in sizes.GEMM_CLASSES else ("B", "H")
    return "x".join(str(int(r[d])) if np.isfinite(r[d]) else "?" for d in dims)


def largest_kernels(frame: pd.DataFrame, label: str, spec: GPU, e2e_ms: float,
                    top: int = 10) -> pd.DataFrame:
    """The ``top`` kernels by total predicted time, identical launches grouped.

    A transformer launches the same kernel once per layer, so identical kernels (phase, class,
    op, dims) are one row with their ``count``, ``pred_ms`` (one launch) and ``total_ms``.
    For the roofline placement: ``intensity`` (FLOP/byte, the trace's exact counts),
    ``achieved_gflops`` (FLOPs / predicted time) and ``roofline_gflops``
    (``min(peak, intensity x bandwidth)``); memory ops have no FLOPs (intensity 0).
    """
    keys = ["phase", "kernel_class", "cls", "op", "B", "M", "N", "K", "H"]
    df = frame.copy()
    for k in ("B", "M", "N", "K", "H"):
        df[k] = df[k].astype(float).fillna(-1.0)  # NaN dims group together
    agg = {"count": ("pred_ms", "size"), "pred_ms": ("pred_ms", "mean"),
           "total_ms": ("pred_ms", "sum"),
           "flops": ("trace_flops" if "trace_flops" in df else "flops", "first"),
           "bytes": ("trace_bytes" if "trace_bytes" in df else "bytes", "first")}
    if "waves" in df:
        agg["waves"] = ("waves", "first")
    g = df.groupby(keys, sort=False, dropna=False).agg(**agg).reset_index()
    for k in ("B", "M", "N", "K", "H"):
        g[k] = g[k].where(g[k] >= 0)
    g = g.sort_values("total_ms", ascending=False, kind="stable").head(top).reset_index(drop=True)
    g.insert(0, "gpu", label)
    g["shape"] = [_shape(r) for _, r in g.iterrows()]
    flops, nbytes = g["flops"].to_numpy(float), g["bytes"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        g["intensity"] = np.where(nbytes > 0, flops / nbytes, np.nan)
        g["achieved_gflops"] = flops / (g["pred_ms"].to_numpy(float) * 1e-3) / 1e9
    g["roofline_gflops"] = np.minimum(spec.peak_gflops, g["intensity"] * spec.mem_bw)
    g["share"] = g["total_ms"] / e2e_ms if e2e_ms > 0 else np.nan
    g["peak_gflops"], g["mem_bw"] = spec.peak_gflops, spec.mem_bw
    return g.drop(columns=["cls"])


def clear_caches() -> None:
    """Forget the in-memory predictors, ranges, tile lookup and per-GPU predictions."""
    for d in (_PREDICTORS, _RANGES, _LOOKUPS, _RESULTS):
        d.clear()


def predict_model_args() -> set[str]:
    """The parameters nslib.model.predict.predict_model accepts now."""
    return set(inspect.signature(predict_model).parameters)


def scenario(gpus, model, batch: int, seq: int, mode: str = "inf", predictor="neusight",
             quick: bool = False, data=None, top: int = 10, parallel=None,
             fused: bool = False, dtype: str = "fp32") -> dict:
    """Predict one model configuration on several GPUs.

    ``gpus``: a list of names/aliases, spec JSON paths or :class:`GPU` objects (hypothetical
    ones from :func:`hypothetical_gpu`); ``model``: a config name, a JSON path or a config dict;
    ``mode``: ``"inf"`` or ``"train"``; ``predictor``: a name (trained on first use and kept in
    memory) or a fitted predictor; ``top``: how many of the largest kernels per GPU.
    ``parallel`` / ``fused``: passed on to :func:`nslib.model.predict.predict_model` once it takes
    them; until then a non-default value gives a warning and the plain step is predicted.
    ``dtype``: ``fp32`` (the paper's setting) or ``bf16``/``fp16`` (the model traced in 16 bits,
    its GEMMs and attention priced by the 16-bit tensor-core predictors; every GPU needs
    ``Bf16FLOPs`` in its datasheet). The FP32 kernel range checks do not apply in 16 bits.

    Returns a dict: ``summary`` (one row per GPU: gpu, e2e_ms, fw_ms, bw_ms, n_kernels, the
    datasheet numbers, ``in_training_range``), ``per_class`` (ms per kernel class, one row
    per GPU), ``top_kernels`` (:func:`largest_kernels` of each GPU), ``warnings`` (list of
    strings: one line for the GPUs outside the training range (:func:`range_summary`), kernels
    outside it, :func:`dominance_warnings`, arguments not available yet), ``range_details``
    (one line per datasheet figure out of range, :mod:`nslib.predictors.gpu_range`; folded under that
    line in the explorer), ``frames`` (``{gpu: predicted kernel frame}``), ``gpus``
    (the :class:`GPU` objects), ``memory`` (:func:`memory_table`; the summary also gains
    ``memory_gb`` and ``fits``, and a GPU the step does not fit on gets a warning),
    ``params`` and ``seconds``. Raises ValueError, KeyError or
    FileNotFoundError for a bad mode, GPU, model or size (the explorer shows them as messages).
    """
    import warnings as pywarnings


    t0 = time.perf_counter()
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(gpus, (str, GPU)) or not hasattr(gpus, "__iter__"):
        gpus = [gpus]
    gpus = list(gpus)
    if not gpus:
        raise ValueError("no GPU selected: pass at least one GPU")
    for name, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(_plain(v), int) or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v!r}")
    warns: list[str] = []
    accepted = predict_model_args()
    dtype = check_dtype(dtype)
    extra = {} if dtype == "fp32" else {"dtype": dtype}
    for name, value in (("parallel", parallel), ("fused", fused)):
        if value == FUTURE_ARGS[name]:
            continue
        if name in accepted:
            extra[name] = value
        else:
            warns.append(f"{name}={value!r} is not available yet (nslib.model.predict.predict_model "
                         f"does not take it): showing the plain {mode} step instead.")
    specs = [resolve_gpu(g, data) for g in gpus]
    labels = _labels(specs)
    pred = get_predictor(predictor, data, quick)
    ranges = training_ranges(data)

    config_key = json.dumps(load_model_config(model, data), sort_keys=True, default=str)
    pred_key = (predictor, bool(quick), _root(data)) if isinstance(predictor, str) else id(pred)

    rows, per_class, tops, frames, featured, outside = [], [], [], {}, {}, {}
    for spec, label in zip(specs, labels):
        key = (pred_key, spec, config_key, int(batch), int(seq), mode,
               tuple(sorted((k, repr(v)) for k, v in extra.items())))
        hit = _RESULTS.get(key)
        if hit is None:
            with pywarnings.catch_warnings():
                pywarnings.simplefilter("ignore", DatasheetRangeWarning)  # one line below
                frame, summ = predict_model(spec, model, int(batch), int(seq), mode,
                                            predictor=pred, data=data, **extra)
            try:
                frame, has_waves = (kernel_waves(frame, data), True) if dtype == "fp32" \
                    else (frame, None)  # FP32 tiles and ranges say nothing of 16-bit kernels
            except (ValueError, KeyError) as e:  # waves are for warnings and placement only
                frame, has_waves = frame, f"{e}"
            hit = (frame, summ, has_waves)
            _RESULTS[key] = hit
            while len(_RESULTS) > _RESULTS_MAX:
                _RESULTS.pop(next(iter(_RESULTS)))
        frame, summ, has_waves = hit
        frame = frame.copy()
        if has_waves is True:
            featured[label] = frame
        elif has_waves is not None:
            warns.append(f"{label}: could not compute tiles and waves of the kernels "
                         f"({has_waves}).")
        frames[label] = frame
        issues = out_of_range(spec, ranges=ranges["datasheet"] if dtype == "fp32"
                              else tensor_ranges())
        if issues:
            outside[label] = issues
        rows.append({"gpu": label, "e2e_ms": summ["e2e_ms"], "fw_ms": summ["fw_ms"],
                     "bw_ms": summ["bw_ms"], "n_kernels": summ["n_kernels"],
                     **{c: v for c, v in spec.columns().items() if c != "gpu"},
                     "in_training_range": not issues})
        per_class.append({"gpu": label, **summ["per_class_ms"]})
        tops.append(largest_kernels(frame, label, spec, summ["e2e_ms"], top))
    line = range_summary(outside)
    warns = ([line] if line else []) + warns + kernel_warnings(featured, ranges)
    warns += dominance_warnings(specs, labels, [r["e2e_ms"] for r in rows])
    mem = memory_table(specs, labels, model, batch, seq, mode, data, dtype=dtype)
    warns += memory_warnings(mem)

    summary = pd.DataFrame(rows)
    summary["memory_gb"] = mem["total"].reindex(summary["gpu"]).to_numpy()
    summary["fits"] = mem["fits"].reindex(summary["gpu"]).to_numpy()
    pc = pd.DataFrame(per_class).set_index("gpu").fillna(0.0)
    order = [c for c in CLASS_ORDER if c in pc] + [c for c in pc if c not in CLASS_ORDER]
    return {"summary": summary, "per_class": pc[order], "top_kernels": pd.concat(tops,
            ignore_index=True), "warnings": warns, "frames": frames,
            "range_details": [o.message() for items in outside.values() for o in items],
            "gpus": specs, "memory": mem,
            "params": {"model": model if not isinstance(model, dict) else
                       model.get("model_type", "config"), "batch": int(batch), "seq": int(seq),
                       "mode": mode, "predictor": predictor if isinstance(predictor, str)
                       else getattr(pred, "name", type(pred).__name__), "quick": quick,
                       "dtype": dtype},
            "seconds": time.perf_counter() - t0}


def memory_table(specs: list[GPU], labels: list[str], model, batch: int, seq: int,
                 mode: str = "inf", data=None, optimizer: str = "adam",
                 dtype: str = "fp32") -> pd.DataFrame:
    """Peak memory of the step on each GPU (:func:`nslib.model.memory.memory_of`), GB: one row per
    GPU label with the breakdown, ``total``, ``capacity`` and ``fits``."""
    rows = []
    for spec, label in zip(specs, labels):
        d = memory_of(spec, model, int(batch), int(seq), mode, optimizer, data=data,
                      dtype=dtype).to_dict()
        rows.append({"gpu": label, **{k: d[k] for k in MEMORY_PARTS},
                     "total": d["total"], "capacity": d["capacity"], "fits": d["fits"]})
    return pd.DataFrame(rows).set_index("gpu")


def memory_warnings(mem: pd.DataFrame) -> list[str]:
    """One 'does not fit (needs X GB of Y)' message per GPU the step does not fit on."""
    out = []
    for label, r in mem[~mem["fits"]].iterrows():
        big = max(MEMORY_PARTS, key=lambda k: r[k])
        out.append(f"{label}: does not fit (needs {r['total']:.1f} GB of {r['capacity']:g}; "
                   f"largest part: {big} {r[big]:.1f} GB): its time is what the step would "
                   f"take with enough memory, and is not shown.")
    return out


# --------------------------------------------------------------------------------------------
# plotting
# --------------------------------------------------------------------------------------------

def plot_scenario(result: dict, title: str | None = None):
    """Four panels: step time per GPU ("does not fit" instead of a time where the step does
    not fit in memory), ms per kernel class, the largest kernels' roofline, peak memory."""
    import matplotlib.pyplot as plt

    summary, pc, top = result["summary"], result["per_class"], result["top_kernels"]
    n = len(summary)
    fig, axes = plt.subplots(1, 4, figsize=(20, 2.0 + 0.55 * max(n, 3)),
                             gridspec_kw={"width_ratios": [1, 1.2, 1.3, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    gcol = {g: colors[i % len(colors)] for i, g in enumerate(summary["gpu"])}
    y = np.arange(n)
    fits = summary["fits"].to_numpy(bool) if "fits" in summary else np.ones(n, bool)

    ax = axes[0]
    shown = summary.assign(fw_ms=np.where(fits, summary["fw_ms"], 0.0),
                           bw_ms=np.where(fits, summary["bw_ms"], 0.0))
    ax.barh(y, shown["fw_ms"], color=[gcol[g] for g in summary["gpu"]], label="forward")
    if (summary["bw_ms"] > 0).any():
        ax.barh(y, shown["bw_ms"], left=shown["fw_ms"], color=[gcol[g] for g in summary["gpu"]],
                alpha=0.5, hatch="//", label="backward")
    for yi, v, ok in zip(y, summary["e2e_ms"], fits):
        ax.text(v if ok else 0, yi, f" {v:,.1f}" if ok else " does not fit in memory",
                va="center", fontsize=8, color="k" if ok else "firebrick")
    ax.set_yticks(y, [_short(g) for g in summary["gpu"]], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted step time (ms)")
    ax.set_xlim(0, summary["e2e_ms"].max() * 1.25 if n else 1)
    ax.set_title("step time per GPU" + (" (hatched: backward)" if (summary["bw_ms"] > 0).any()
                                        else ""), fontsize=10)

    ax = axes[1]
    left = np.zeros(n)
    cmap = plt.get_cmap("tab10")
    for i, c in enumerate(pc.columns):
        vals = np.where(fits, pc[c].reindex(summary["gpu"]).fillna(0).to_numpy(float), 0.0)
        ax.barh(y, vals, left=left, color=cmap(i % 10), label=c)
        left += vals
    ax.set_yticks(y, [""] * n)
    ax.invert_yaxis()
    ax.set_xlabel("predicted ms per kernel class")
    ax.set_xlim(0, left.max() * 1.05 if n else 1)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=8,
               ncol=min(8, len(names)), frameon=False, title="kernel class", title_fontsize=8)
    ax.set_title("where the time goes", fontsize=10)

    ax = axes[2]
    pts = top[(top["flops"] > 0) & np.isfinite(top["intensity"])]
    if len(pts):
        lo = max(pts["intensity"].min() / 4, 1e-2)
        hi = max(pts["intensity"].max() * 4, 1e3)
        xs = np.logspace(np.log10(lo), np.log10(hi), 200)
        half = result.get("params", {}).get("dtype", "fp32") != "fp32"
        for spec, label in zip(result["gpus"], summary["gpu"]):
            # 16 bits: GEMMs and attention run under the tensor-core roof (dashed: FP32 roof)
            roofs = [(spec.bf16_gflops, "-"), (spec.peak_gflops, ":")] if half else [
                (spec.peak_gflops, "-")]
            for peak, style in roofs:
                ax.plot(xs, np.minimum(peak, xs * spec.mem_bw), style, color=gcol[label], lw=1)
            sub = pts[pts["gpu"] == label]
            ax.scatter(sub["intensity"], sub["achieved_gflops"], s=12 + 120 * sub["share"],
                       color=gcol[label], alpha=0.7, edgecolor="k", linewidth=0.3)
        ax.set(xscale="log", yscale="log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved GFLOP/s (predicted)")
    ax.set_title("largest kernels under each roofline (size: share of step)", fontsize=10)
    if "memory" in result:
        _memory_panel(axes[3], result["memory"].reindex(summary["gpu"]))
    else:
        axes[3].set_axis_off()
    p = result.get("params", {})
    fig.suptitle(title or f"{p.get('model')} {p.get('mode')} batch {p.get('batch')} seq "
                 f"{p.get('seq')} ({p.get('predictor')}, {p.get('dtype', 'fp32')})", fontsize=11)
    # fixed margins: tight_layout would draw the figure once more (slow in the explorer)
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.12, right=0.985, wspace=0.25, bottom=1.1 / h, top=1 - 0.65 / h)
    return fig


def _memory_panel(ax, mem: pd.DataFrame) -> None:
    """Stacked peak-memory bars per GPU (GB) with each GPU's capacity as a black tick."""
    import matplotlib.pyplot as plt

    y = np.arange(len(mem))
    left = np.zeros(len(mem))
    cmap = plt.get_cmap("Set2")
    for i, part in enumerate(MEMORY_PARTS):
        vals = mem[part].to_numpy(float)
        if (vals > 0).any():
            ax.barh(y, vals, left=left, color=cmap(i % 8), label=part)
            left += vals
    ax.scatter(mem["capacity"], y, marker="|", s=400, color="k", label="GPU memory", zorder=3)
    for yi, total, ok in zip(y, mem["total"], mem["fits"]):
        ax.text(total, yi, f" {total:,.1f}" + ("" if ok else " (does not fit)"), va="center",
                fontsize=8, color="k" if ok else "firebrick")
    ax.set_yticks(y, [""] * len(y))
    ax.invert_yaxis()
    ax.set_xlim(0, max(mem["total"].max(), mem["capacity"].max()) * 1.3 if len(mem) else 1)
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4,
              frameon=False, columnspacing=0.8, handlelength=1.2)
    ax.set_title("will it fit? (tick: the GPU's memory)", fontsize=10)


def _short(name: str, n: int = 34) -> str:
    name = name.replace("NVIDIA ", "")
    return name if len(name) <= n else name[: n - 1] + "…"


# --------------------------------------------------------------------------------------------
# the interactive explorer
# --------------------------------------------------------------------------------------------

def _gpu_options(gpus: dict[str, GPU]) -> list[tuple[str, str]]:
    names = [g.name for g in gpus.values()]
    return [(g.name if names.count(g.name) == 1 else f"{g.name} [{k}]", k)
            for k, g in gpus.items()]


def explorer_gpus(data=None) -> dict[str, GPU]:
    """The GPUs the explorer offers: the NeuSight data's datasheets, joined by the 16-bit
    data's (which carry ``Bf16FLOPs``; they win for a stem both folders have) when that folder
    is there."""
    return {**load_gpus(data), **load_mixed_gpus_if_present()}


def _model_names(data=None) -> list[str]:
    folder = data_root(data) / "data" / "DLmodel_configs"
    return sorted(p.stem for p in folder.glob("*.json"))


class Explorer:
    """The explorer UI; ``widget`` is the ipywidgets box, :meth:`update` recomputes.

    Every control calls :meth:`update`, which reads the controls, calls :func:`scenario` and
    draws :func:`plot_scenario` into ``output``; warnings and errors go to ``message`` as
    text (never a traceback). ``result`` holds the last scenario, ``error`` the last error
    message (or None), ``seconds`` the time of the last update's prediction.
    """

    def __init__(self, gpus=None, model="gpt2_large", batch=4, seq=1024, mode="inf",
                 predictor="neusight", quick=False, data=None, top=10, hypothetical=None,
                 auto=True, dtype="fp32"):
        import ipywidgets as W

        self.data, self.quick, self.top = data, quick, top
        self.result, self.error, self.seconds, self.figure = None, None, None, None
        self._busy = False
        self.gpus = explorer_gpus(data)
        opts = _gpu_options(self.gpus)
        keys = [k for _, k in opts]
        chosen = [resolve_gpu(g, data).key for g in (gpus or [])]
        chosen = [k for k in chosen if k in keys] or keys[-1:]
        self.gpu_select = W.SelectMultiple(options=opts, value=tuple(chosen),
                                           rows=min(8, len(opts)), description="GPUs",
                                           layout=W.Layout(width="420px"))
        self.base_gpu = W.Dropdown(options=opts, value=chosen[0], description="base GPU",
                                   layout=W.Layout(width="420px"))
        hyp = dict(hypothetical or {})
        self.use_custom = W.Checkbox(value=bool(hyp), description="add a hypothetical GPU",
                                     indent=False)
        self.custom_name = W.Text(value="", placeholder="name (optional)", description="name",
                                  layout=W.Layout(width="420px"))
        self.sliders = {f: W.FloatLogSlider(value=float(hyp.get(f, 1.0)), base=2, min=-3, max=4,
                                            step=0.25, description=f"{f} x",
                                            continuous_update=False, readout_format=".3g",
                                            style={"description_width": "110px"},
                                            layout=W.Layout(width="420px"))
                        for f in SLIDER_FIELDS}
        self.custom_info = W.HTML()
        models = _model_names(data)
        start = model if isinstance(model, str) and model in models else PASTED
        self.model = W.Dropdown(options=models + [PASTED], value=start, description="model")
        pasted = json.dumps(model, indent=1) if isinstance(model, dict) else ""
        self.pasted = W.Textarea(value=pasted,
                                 placeholder="paste a HuggingFace config.json here",
                                 layout=W.Layout(width="420px", height="120px"),
                                 continuous_update=False)
        self.batch = W.BoundedIntText(value=int(batch), min=1, max=1 << 16, description="batch")
        self.seq = W.BoundedIntText(value=int(seq), min=1, max=1 << 20, description="seq")
        self.mode = W.Dropdown(options=list(MODES), value=mode, description="mode")
        self.dtype = W.Dropdown(options=list(DTYPES), value=check_dtype(dtype),
                                description="dtype")
        preds = list(available())
        self.predictor = W.Dropdown(options=preds, value=predictor if predictor in preds
                                    else preds[0], description="predictor")
        self.button = W.Button(description="update", icon="refresh")
        self.message = W.HTML()
        self.output = W.Output()

        for w in (self.gpu_select, self.base_gpu, self.use_custom, self.custom_name,
                  *self.sliders.values(), self.model, self.batch, self.seq, self.mode,
                  self.dtype, self.predictor):
            w.observe(self._changed, names="value")
        self.pasted.observe(self._pasted_changed, names="value")
        self.button.on_click(lambda _: self.update())

        left = W.VBox([W.HTML("<b>GPUs</b>"), self.gpu_select, W.HTML("<b>what if</b>"),
                       self.use_custom, self.base_gpu, self.custom_name,
                       *self.sliders.values(), self.custom_info])
        right = W.VBox([W.HTML("<b>workload</b>"), self.model, self.pasted, self.batch, self.seq,
                        self.mode, self.dtype, self.predictor, self.button])
        self.widget = W.VBox([W.HBox([left, right]), self.message, self.output])
        self._show_custom()
        if auto:
            self.update()

    # ----- display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # ----- callbacks
    def _changed(self, change=None):
        if not self._busy:
            self.update()

    def _pasted_changed(self, change):
        if self._busy:
            return
        if change["new"].strip() and self.model.value != PASTED:
            self._busy = True
            try:
                self.model.value = PASTED
            finally:
                self._busy = False
        self.update()

    def custom_gpu(self) -> GPU | None:
        """The hypothetical GPU the controls describe (None when unticked)."""
        if not self.use_custom.value:
            return None
        base = self.gpus[self.base_gpu.value]
        ov = {}
        for f, s in self.sliders.items():
            if abs(s.value - 1.0) > 1e-9:
                v = getattr(base, f) * s.value
                ov[f] = max(1, int(round(v))) if f in _INT_FIELDS else float(v)
        return hypothetical_gpu(base, name=self.custom_name.value.strip() or None, **ov)

    def _show_custom(self):
        try:
            g = self.custom_gpu()
        except ValueError as e:
            self.custom_info.value = f"<span style='color:#b00'>{html.escape(str(e))}</span>"
            return
        if g is None:
            self.custom_info.value = ""
            return
        self.custom_info.value = (f"<small>{html.escape(g.name)}: {g.num_sm} SMs, "
                                  f"{g.peak_gflops:,.0f} GFLOP/s, {g.mem_bw:,.0f} GB/s, "
                                  f"{g.mem_gb:,.0f} GB, L2 {g.l2_mb:,.3g} MB</small>")

    def _model_value(self):
        if self.model.value != PASTED:
            return self.model.value, None
        return parse_pasted_config(self.pasted.value)

    def _say(self, warnings=(), error=None, note=None, details=()):
        parts = []
        if error:
            parts.append(f"<div style='color:#b00'><b>Error:</b> {html.escape(error)}</div>")
        for i, w in enumerate(warnings):
            if i == 0 and details:  # the range line: one line, its figures folded
                items = "".join(f"<li>{html.escape(d)}</li>" for d in details)
                parts.append(f"<details style='color:#8a5a00'><summary>&#9888; "
                             f"{html.escape(w)}</summary><ul>{items}</ul></details>")
                continue
            parts.append(f"<div style='color:#8a5a00'>&#9888; {html.escape(w)}</div>")
        if note:
            parts.append(f"<div style='color:#555'><small>{html.escape(note)}</small></div>")
        self.message.value = "".join(parts)

    def update(self):
        """Recompute from the controls and redraw; returns the scenario dict or None."""
        from IPython.display import clear_output, display

        self._show_custom()
        self.error = None
        try:
            model, err = self._model_value()
            if err:
                raise _UserError(err)
            gpus = list(self.gpu_select.value)
            custom = self.custom_gpu()
            if custom is not None:
                gpus.append(custom)
            if not gpus:
                raise _UserError("select at least one GPU (or tick 'add a hypothetical GPU')")
            self._say(note="computing... (the first use of a predictor trains or loads it)")
            res = scenario([self.gpus[g] if isinstance(g, str) else g for g in gpus], model,
                           self.batch.value, self.seq.value, self.mode.value,
                           self.predictor.value, quick=self.quick, data=self.data, top=self.top,
                           dtype=self.dtype.value)
        except Exception as e:  # noqa: BLE001 - every failure becomes a message, not a traceback
            msg = str(e) if isinstance(e, _UserError) else f"{type(e).__name__}: {e}"
            self.error = msg.strip("'\"")
            self._say(error=self.error)
            with self.output:
                clear_output(wait=True)
            return None
        self.result, self.seconds = res, res["seconds"]
        import matplotlib.pyplot as plt
        fig = plot_scenario(res)
        self.figure = fig
        with self.output:
            clear_output(wait=True)
            display(fig)
            display(res["summary"][["gpu", "e2e_ms", "fw_ms", "bw_ms", "n_kernels",
                                    "memory_gb", "fits"]].round(2).set_index("gpu"))
        plt.close(fig)
        self._say(res["warnings"], note=f"predicted in {res['seconds']:.2f} s",
                  details=res.get("range_details", ()))
        return res


class _UserError(Exception):
    """A problem with the user's input: shown as its message alone."""


def build_explorer(gpus=None, model="gpt2_large", batch=4, seq=1024, mode="inf",
                   predictor="neusight", quick=False, data=None, top=10, hypothetical=None,
                   auto=True, dtype="fp32") -> Explorer:
    """Build the explorer (display the returned object, or its ``widget``, in a notebook).

    ``gpus``: names/aliases selected at start; ``hypothetical``: slider factors to start with,
    e.g. ``{"mem_bw": 2}`` (ticks 'add a hypothetical GPU'); ``auto``: run the first update
    now. See :class:`Explorer`.
    """
    return Explorer(gpus=gpus, model=model, batch=batch, seq=seq, mode=mode, predictor=predictor,
                    quick=quick, data=data, top=top, hypothetical=hypothetical, auto=auto,
                    dtype=dtype)


def render(**kwargs) -> Explorer:
    """Build the explorer and display it now (for use inside a cell); returns it."""
    from IPython.display import display
    ex = build_explorer(**kwargs)
    display(ex.widget)
    return ex


__all__ = ["hypothetical_gpu", "parse_pasted_config", "scenario", "plot_scenario",
           "build_explorer", "render", "Explorer", "training_ranges", "kernel_waves",
           "kernel_warnings", "gpu_warning", "range_summary", "dominance_warnings",
           "largest_kernels", "get_predictor", "clear_caches", "SLIDER_FIELDS"]
