"""aiconfigurator's measured serving sample (``silicon_sample.csv``): one row per deployment.

Each row: engine (``backend``: ``vllm``, ``sglang``, ``trtllm``), model (``model_path``, a
HuggingFace id), system (``system``: aiconfigurator's name of the GPU, e.g. ``h100_sxm``),
``precision`` (empty: 16-bit), ``mode`` (``agg``: prefill and decode on the same GPUs;
``disagg``), ``isl``/``osl`` (prompt and output tokens per request), ``batch_size`` (the
concurrency), ``tp_size``/``pp_size``/``attention_dp_size``/``moe_*`` and the measured mean
``silicon_ttft_ms``/``silicon_tpot_ms``.

:func:`serving_rows` reads it and says for every row whether nslib can price it and, if
not, why (the ``reason`` column): nothing is dropped silently.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from nslib.data.gpus import load_mixed_gpus
from nslib.data.mixed_data import AIC_SYSTEMS
from nslib.data.paths import DataNotFoundError, mixed_root

SAMPLE = AIC_SYSTEMS / "silicon_sample.csv"
COLUMNS = ("backend", "model_path", "system", "precision", "mode", "isl", "osl",
           "batch_size", "tp_size", "pp_size", "silicon_ttft_ms", "silicon_tpot_ms")
# words of a system name that say how a GPU is mounted, not which GPU it is (with a count or
# generation: sxm5, nvl72, pcie4)
FORM_WORD = re.compile(r"^(sxm|pcie|server|nvl|hgx|dgx|node|x)\d*$")
CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"  # written from public configs


def sample_path(sample=None, mixed=None) -> Path:
    """``sample`` when given, else the sample in the 16-bit data folder."""
    path = Path(sample) if sample is not None else mixed_root(mixed) / SAMPLE
    if not path.is_file():
        raise DataNotFoundError(f"no serving sample at {path}: pass --sample FILE or fetch "
                                "the 16-bit data (`nslib fetch --mixed`)")
    return path


def model_configs() -> dict[str, Path]:
    """HuggingFace model id -> the config JSON the project keeps for it (the first word of
    its ``_source`` field)."""
    out = {}
    for p in sorted(CONFIG_DIR.glob("*.json")):
        src = pd.read_json(p, typ="series").get("_source", "")
        out[str(src).split(" ")[0]] = p
    return out


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", name.lower()) if w}


def system_gpus(systems, mixed=None) -> dict[str, str]:
    """aiconfigurator system name -> GPU name of a datasheet in the 16-bit data folder: the
    one datasheet whose name holds every word of the system name but the form-factor words
    (``h100_sxm`` -> ``NVIDIA H100 80GB HBM3``); systems with none or several are left out."""
    gpus = [g.name for g in load_mixed_gpus(mixed_root(mixed)).values()]
    out = {}
    for s in systems:
        want = {w for w in _words(str(s)) if not FORM_WORD.match(w)}
        hits = [g for g in gpus if want and want <= _words(g)]
        if len(hits) == 1:
            out[s] = hits[0]
    return out


def serving_rows(sample=None, mixed=None) -> pd.DataFrame:
    """Every row of the sample with ``gpu`` (datasheet name or ""), ``config`` (path or "")
    and ``reason`` ("" when nslib prices the row, else why not)."""
    path = sample_path(sample, mixed)
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the serving sample ({e})") from None
    lacking = [c for c in COLUMNS if c not in df.columns]
    if lacking:
        raise ValueError(f"{path}: missing column(s) {lacking}; is this aiconfigurator's "
                         "silicon_sample.csv?")
    if df.empty:
        raise ValueError(f"{path}: the serving sample has a header but no rows")
    df = df.reset_index(drop=True)
    gpus = system_gpus(pd.unique(df["system"].astype(str)), mixed)
    configs = model_configs()
    df["gpu"] = [gpus.get(s, "") for s in df["system"].astype(str)]
    df["config"] = [str(configs.get(m, "")) for m in df["model_path"]]
    df["framework"] = df["backend"].astype(str).str.lower()
    reason = np.full(len(df), "", dtype=object)

    def mark(mask, why):
        mask = np.asarray(mask, bool) & (reason == "")
        reason[mask] = np.asarray(why, dtype=object)[mask] if not isinstance(why, str) else why

    prec = df["precision"].astype(object).where(df["precision"].notna(), "").astype(str) \
        .str.strip()
    sizes = df[["isl", "osl", "batch_size", "tp_size"]].apply(pd.to_numeric, errors="coerce")
    # what a row is comes before what it lacks: a disaggregated row has no one tp_size
    mark(df["mode"] != "agg", "disaggregated serving (separate prefill and decode workers)")
    mark(~(np.isfinite(sizes) & (sizes >= 1)).all(axis=1).to_numpy(),
         "missing or bad isl / osl / batch_size / tp_size")
    mark(prec != "", "precision " + prec + " (16-bit predictors only)")
    mark(df["config"] == "", "no model config in the project for " +
         df["model_path"].astype(str))
    mark(df["gpu"] == "", "no datasheet for system " + df["system"].astype(str))
    mark(df["pp_size"].fillna(1) != 1, "pipeline parallelism")
    mark(df.get("attention_dp_size", pd.Series(1, index=df.index)).fillna(1) != 1,
         "attention data parallelism")
    mark(~df["framework"].isin(["vllm", "sglang", "trtllm"]), "unknown engine")
    # a value that is not a number is the row's problem, listed with the others
    meas = df[["silicon_ttft_ms", "silicon_tpot_ms"]].apply(pd.to_numeric, errors="coerce")
    df[["silicon_ttft_ms", "silicon_tpot_ms"]] = meas
    mark(~(np.isfinite(meas) & (meas > 0)).all(axis=1).to_numpy(),
         "no positive measured TTFT/TPOT")
    df["reason"] = reason
    return df


def config_for(model_path: str) -> Path:
    """The project's config JSON of a HuggingFace model id (KeyError naming the known ones)."""
    known = model_configs()
    if model_path not in known:
        raise KeyError(f"no serving config for {model_path!r}; known: {', '.join(known)}")
    return known[model_path]


__all__ = ["CONFIG_DIR", "config_for", "model_configs", "sample_path", "serving_rows",
           "system_gpus"]
