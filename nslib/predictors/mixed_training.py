"""Train the 16-bit kernel predictors (BF16 GEMMs, FlashAttention) and cache them by content.

Two kinds, each with its table and its bounded nslib predictor plus the generic baselines of
:mod:`nslib.predictors.tensor_baselines` (all in the registry of :mod:`nslib.predictors`).
:func:`cached_fit` (what :func:`nslib.predictors.trained` runs for a 16-bit kind) returns a
predictor trained on every measured GPU but the excluded ones, from the cache when the table
files, datasheets, the parameters and the code that trains it are unchanged.
:func:`kind_table` is the table a kind trains and is evaluated on (the quick profile keeps a
fixed, seeded subsample per GPU).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pandas as pd

from nslib import __version__
from nslib.data import mixed_data
from nslib.data.cache import read_cache_entry
from nslib.data.checks import check_int
from nslib.data.paths import cache_dir, hash_files
from nslib.data.settings import Settings, settings_of
from nslib.data.sources import code_digest, dependencies
from nslib.predictors import names as registered, predictor_class, tensor_baselines
from nslib.predictors.training import fit_and_save, rough_time

# kind name -> (module of its nslib predictor, kind object, table)
KINDS = {"gemm": ("nslib.predictors.tc_gemm", "GEMM", mixed_data.gemm_table),
         "attention": ("nslib.predictors.attention", "ATTENTION", mixed_data.attention_table)}
QUICK_ROWS = 1500  # rows per GPU in the quick profile (tests, --quick)


def check_kind(kind: str) -> str:
    """``kind`` if known, else a ValueError listing the kinds."""
    if kind not in KINDS:
        raise ValueError(f"unknown 16-bit kernel kind {kind!r}; known: {', '.join(KINDS)}")
    return kind


def kind_object(kind: str):
    """The kind object (FLOPs, bytes, shape features) of ``kind``."""
    module, attr, _ = KINDS[check_kind(kind)]
    return getattr(importlib.import_module(module), attr)


def predictors(kind: str) -> dict[str, type]:
    """Predictor classes of ``kind`` by name (the registry's): the kind's own (``nslib``) and
    the baselines."""
    return {n: predictor_class(n, check_kind(kind)) for n in registered(kind)}


def kind_table(kind: str, quick: bool = False, mixed=None) -> pd.DataFrame:
    """The measured table of ``kind``; with ``quick``, :data:`QUICK_ROWS` rows per GPU drawn
    with a fixed seed (so the quick profile is the same everywhere)."""
    table = KINDS[check_kind(kind)][2](mixed)
    if quick:
        # one sample per GPU (a handful of groups); groupby.apply drops the grouping column
        # under pandas 3, so the groups are concatenated by hand
        table = pd.concat([g.sample(min(len(g), QUICK_ROWS), random_state=0)
                           for _, g in table.groupby("gpu", sort=False)])
    return table.reset_index(drop=True)


def make(kind: str, name: str, seed: int = 0, quick: bool = False):
    """A fresh, untrained predictor ``name`` of ``kind``; unknown names list the known ones."""
    classes = predictors(kind)
    if name not in classes:
        raise ValueError(f"unknown predictor {name!r} of kind {kind}; known: "
                         f"{', '.join(classes)}")
    seed = check_int("seed", seed, minimum=0)
    cls = classes[name]
    if issubclass(cls, tensor_baselines.KindPredictor):
        extra = {"epochs": 8} if quick and name == "mlp" else {}
        extra.update({"rounds": 60} if quick and name == "xgboost" else {})
        return cls(kind_object(kind), seed=seed, **extra)
    return cls(seed=seed, quick=quick)


def held_out(kind: str, settings: Settings | None = None, table=None) -> list[str]:
    """The GPUs a leave-one-GPU-out over ``kind`` holds out in turn: every GPU its table (the
    caller's ``table``, else :func:`kind_table` of the settings) measures."""
    s = settings_of(settings)
    return mixed_data.measured_gpus(kind_table(kind, s.quick, s.mixed) if table is None
                                    else table)


def _key(kind: str, name: str, seed: int, quick: bool, exclude: list, mixed) -> str:
    """Content key of a trained 16-bit predictor: its code, parameters, the kind's table files
    and the datasheets (:func:`nslib.data.mixed_data.table_files`), and the library version."""
    # every file a 16-bit predictor's training can run: its module, this one (table loaders)
    # and all they import (fit loop, kinds, tile heuristic)
    sources = dependencies(predictors(kind)[name].__module__, KINDS[kind][0], __name__)
    data = mixed_data.table_files(kind, mixed)
    root = mixed_data.mixed_root(mixed)
    return hash_files(data, extra=[code_digest(sources), kind, name, seed, quick, exclude,
                                   __version__, [str(p.relative_to(root)) for p in data]])


def _rough_time(folder: Path, kind: str, name: str, quick: bool) -> str:
    """:func:`nslib.predictors.training.rough_time` of a 16-bit fit (else a minute, two
    seconds quick, on a 2-core machine)."""
    return rough_time(folder, f"{kind}-{name}", lambda m: m.get("quick") == quick,
                      2.0 if quick else 60.0)


def cached_fit(kind: str, name: str = "nslib", settings: Settings | None = None, *,
               exclude_gpus=(), table=None):
    """Predictor ``name`` of ``kind`` trained on every measured GPU of ``settings.mixed``
    except ``exclude_gpus`` (Device names), with the settings' ``quick`` profile and ``seed``,
    cached by content (see module doc). A cached predictor is loaded without reading the
    tables; ``table``: the kind's :func:`kind_table` when the caller holds it."""
    s = settings_of(settings)
    seed, quick, mixed, progress = s.seed, s.quick, s.mixed, s.progress
    exclude = sorted(exclude_gpus)
    if table is None and exclude:
        table = kind_table(kind, quick, mixed)
    unknown = [g for g in exclude if g not in set(table["gpu"])]
    if unknown:
        raise ValueError(f"cannot leave out {unknown}: not measured in the {kind} table "
                         f"(measured: {mixed_data.measured_gpus(table)})")
    pred = make(kind, name, seed, quick)
    if name == "roofline":
        return pred
    path = cache_dir("mixed") / f"{kind}-{name}-{_key(kind, name, seed, quick, exclude, mixed)}.npz"
    loaded = read_cache_entry(path, type(pred).load, f"{kind} {name} predictor")
    if loaded is not None:
        if hasattr(pred, "kind"):
            loaded.kind = pred.kind  # baselines keep their kind object, not in the file
        return loaded
    print(f"nslib: training the 16-bit {kind} {name} predictor ({'quick' if quick else 'full'}"
          f" profile{', without ' + ', '.join(exclude) if exclude else ''}). Roughly "
          f"{_rough_time(path.parent, kind, name, quick)}; cached afterwards",
          file=sys.stderr, flush=True)
    table = kind_table(kind, quick, mixed) if table is None else table
    rows = table[~table["gpu"].isin(exclude)].reset_index(drop=True)
    meta = {"kind": kind, "predictor": name, "seed": seed, "quick": quick, "exclude": exclude}
    return fit_and_save(lambda: pred.fit(rows, progress=progress), path,
                        f"16-bit {kind} {name} predictor", meta)[0]
