"""The NeuSight paper's own result tables, read into tidy frames.

They sit in ``summary/`` of the NeuSight data (``scripts/asplos/summary`` of the repository;
the README of the data folder lists them):

- ``summary.csv``: one row per evaluated configuration (model, sequence, batch, GPU label
  folder, ``inf``/``train``, option: none, ``fusion``, ``dp4``, ``tp4``, ``pp4_1``): the measured
  latency and every method's predicted latency and error (%), end to end and per kernel class.
  The per-GPU bar charts (``nvidia_inf.csv``, ``nvidia_train.csv``), the fusion table
  (``fusion_inf.csv``) and the distributed table (``distributed.csv``) are these rows pivoted.
- ``perop.csv``: each method's mean error (%) per kernel class, in and out of distribution.

The summary's ``device`` is the label folder's name (``gpu_key`` elsewhere in nslib), so a
GPU's reported rows meet its labels with no list of GPUs. Latencies in ms, errors in percent.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from nslib.data.paths import data_root

# the summary's method prefixes -> nslib's predictor names ("micro" is Li et al.)
METHODS = {"roofline": "roofline", "habitat": "habitat", "micro": "li", "neusight": "neusight"}
# the paper's figure labels -> nslib's names (methods, models and kernel classes)
FIGURE_METHODS = {"Roofline": "roofline", "Habitat": "habitat", "Li et al.": "li",
                  "NeuSight": "neusight"}
FIGURE_MODELS = {"BERT-Large": "bert_large", "GPT2-Large": "gpt2_large", "GPT3-XL": "gpt3_xl",
                 "OPT-1.3B": "opt_13", "GPT3-2.7B": "gpt3_27", "SwitchTrans": "switchxl4"}
PEROP_CLASSES = {"BMM": "bmm", "FC": "linear", "EW": "elementwise", "Softmax": "softmax",
                 "LN": "layernorm"}
# the summary's per-class column groups -> nslib's kernel classes; VEC is every elementwise op
# (VECadd, VECgelu, ...) without softmax and layer norm; the rest (embedding, masks, host
# operators) is "other"
SUMMARY_CLASSES = {"Linear": "linear", "BMM": "bmm", "VEC": "elementwise",
                   "VECsoftmax": "softmax", "VECln": "layernorm"}
KEYS = ["gpu_key", "model", "seq", "batch", "mode", "variant"]


def summary_dir(data=None) -> Path:
    """The folder of the paper's result tables; a clear error when the data has none."""
    folder = data_root(data) / "summary"
    if not (folder / "summary.csv").is_file():
        raise FileNotFoundError(
            f"no paper result tables at {folder} (summary.csv missing): they come with the "
            "NeuSight repository (`nslib fetch`, or NSLIB_DATA pointing at a full copy)")
    return folder


def _read(name: str, data=None, **kw) -> pd.DataFrame:
    path = summary_dir(data) / name
    try:
        return pd.read_csv(path, **kw)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable table ({e}); restore it from the NeuSight "
                         "repository (`nslib fetch`)") from None


def _need(frame: pd.DataFrame, cols, path: str) -> None:
    missing = [c for c in cols if c not in frame]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}: is it the NeuSight paper's "
                         "summary table? Restore it from the repository (`nslib fetch`)")


def _config_keys(raw: pd.DataFrame) -> pd.DataFrame:
    """:data:`KEYS` of each row of ``summary.csv`` in nslib's names."""
    return pd.DataFrame({
        "gpu_key": raw["device"].astype(str), "model": raw["model_name"].astype(str),
        "seq": raw["seqlen"].astype(int), "batch": raw["batch"].astype(int),
        "mode": raw["mode"].astype(str), "variant": raw["option"].fillna("").astype(str)})


def reported_configs(data=None) -> pd.DataFrame:
    """One row per (configuration, method) of ``summary.csv``: :data:`KEYS`, ``method``
    (nslib's name), ``measured_ms`` (the label the paper scored against), ``pred_ms``,
    ``err`` (%, recomputed from the two latencies) and ``ood`` (the paper's
    out-of-distribution flag)."""
    raw = _read("summary.csv", data)
    cols = ["model_name", "seqlen", "batch", "device", "mode", "option",
            "label_all_e2e_latency", "OOD"] + [f"{m}_all_e2e_latency" for m in METHODS]
    _need(raw, cols, "summary.csv")
    base = _config_keys(raw).assign(
        measured_ms=raw["label_all_e2e_latency"].astype(float),
        ood=raw["OOD"].astype(str).str.lower() == "true")
    parts = []
    for prefix, name in METHODS.items():
        pred = raw[f"{prefix}_all_e2e_latency"].astype(float)
        parts.append(base.assign(method=name, pred_ms=pred))
    out = pd.concat(parts, ignore_index=True)
    out["err"] = 100 * (out["pred_ms"] - out["measured_ms"]).abs() / out["measured_ms"]
    return out.dropna(subset=["pred_ms"]).reset_index(drop=True)


def reported_class_ms(data=None, method: str = "neusight") -> pd.DataFrame:
    """Per configuration of ``summary.csv`` (:data:`KEYS`) and kernel class
    (:data:`SUMMARY_CLASSES`, plus ``other``: embedding, masks, host operators): the measured
    (``label_ms``, from the label's per-operator times, so the classes need not add up to the
    end-to-end label) and ``method``'s predicted (``pred_ms``) forward + backward ms the paper
    attributes to the class; NaN where the paper has no prediction of the configuration."""
    raw = _read("summary.csv", data)
    prefix = {v: k for k, v in METHODS.items()}[method]
    rows = []
    for who, col_prefix in (("label_ms", "label"), ("pred_ms", prefix)):
        total = raw[f"{col_prefix}_all_e2e_latency"].astype(float)
        groups = [c[len(col_prefix) + 1:-len("_e2e_latency")] for c in raw.columns
                  if c.startswith(f"{col_prefix}_") and c.endswith("_e2e_latency")]
        # the elementwise ops' own groups (VECadd, ...) are inside VEC; "all" is the total
        other = [g for g in groups if g != "all" and g not in SUMMARY_CLASSES
                 and not g.startswith("VEC")]
        for cls, cols in [(cls, [g]) for g, cls in SUMMARY_CLASSES.items()] + [("other", other)]:
            vals = sum(raw[f"{col_prefix}_{g}_e2e_latency"].astype(float).fillna(0.0)
                       for g in cols if g in groups)
            # NaN where the method has no prediction of the configuration at all
            vals = (vals + 0.0 * total) if len(cols) else total * np.nan
            rows.append(pd.DataFrame({"i": raw.index, "cls": cls, "who": who, "ms": vals}))
    long = pd.concat(rows).pivot_table(index=["i", "cls"], columns="who", values="ms")
    long = long.reset_index()
    return _config_keys(raw).join(long.set_index("i"), how="inner").reset_index(drop=True)


def reported_gpu_errors(mode: str, data=None) -> pd.DataFrame:
    """The paper's per-GPU bar charts (``nvidia_inf.csv`` / ``nvidia_train.csv``) as one row
    per (``gpu_key``, ``model``, ``batch``, ``method``) with its error ``err`` (%); cells the
    paper left empty (a model that does not fit) are absent."""
    if mode not in ("inf", "train"):
        raise ValueError(f"mode must be 'inf' or 'train', got {mode!r}")
    name = f"nvidia_{mode}.csv"
    lines = (summary_dir(data) / name).read_text().splitlines()
    rows, gpu, models, batches = [], None, [], []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if not any(cells):
            gpu = None
            continue
        if gpu is None:
            gpu = cells[0]
        elif cells[0] == "Model":
            models = _spread(cells[1:])
        elif cells[0] == "Batch":
            batches = cells[1:]
        elif cells[0] in FIGURE_METHODS:
            for model, batch, val in zip(models, batches, cells[1:]):
                if val and model:
                    rows.append({"gpu_key": gpu, "model": FIGURE_MODELS.get(model, model),
                                 "batch": int(batch), "method": FIGURE_METHODS[cells[0]],
                                 "err": float(val)})
        else:
            raise ValueError(f"{name}: unexpected row {cells[0]!r} under {gpu}: is it the "
                             "NeuSight paper's per-GPU table?")
    return pd.DataFrame(rows, columns=["gpu_key", "model", "batch", "method", "err"])


def _spread(cells: list[str]) -> list[str]:
    """A header row whose names span two columns (``BERT-Large,,GPT2-Large,,``) filled right."""
    out, last = [], ""
    for c in cells:
        last = c or last
        out.append(last)
    return out


def reported_per_class(data=None) -> pd.DataFrame:
    """``perop.csv``: one row per (``method``, ``dist``: ``in-distribution`` or
    ``out-of-distribution``, ``cls``) with the paper's mean error ``err`` (%)."""
    lines = [[c.strip() for c in ln.split(",")]
             for ln in (summary_dir(data) / "perop.csv").read_text().splitlines() if ln.strip()]
    if len(lines) < 3:
        raise ValueError("perop.csv: expected two header rows and one row per method")
    raw = pd.DataFrame([ln + [""] * (max(map(len, lines)) - len(ln)) for ln in lines])
    dists = _spread(list(raw.iloc[0, 1:]))
    classes = list(raw.iloc[1, 1:])
    rows = []
    for _, r in raw.iloc[2:].iterrows():
        if r.iloc[0] not in FIGURE_METHODS:
            raise ValueError(f"perop.csv: unknown method row {r.iloc[0]!r}")
        for dist, cls, val in zip(dists, classes, r.iloc[1:]):
            if val and cls in PEROP_CLASSES:
                rows.append({"method": FIGURE_METHODS[r.iloc[0]],
                             "dist": dist.lower().replace(" ", "-"),
                             "cls": PEROP_CLASSES[cls], "err": float(val)})
    return pd.DataFrame(rows, columns=["method", "dist", "cls", "err"])
