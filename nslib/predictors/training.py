"""Train predictors on the training GPUs' kernels, and cache them by content.

:func:`cached_fit` is what :func:`nslib.predictors.trained` (every command and notebook) runs
for an FP32 predictor: it returns the predictor trained on the current data with the given
parameters, loading it from the cache (or ``out``) when the data hash, the parameters, the
library version and the code that trains it match, training it otherwise.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from nslib import __version__
from nslib.data.cache import read_cache_entry
from nslib.data.checks import check_int
from nslib.data.paths import CacheError, atomic_write_text, cache_dir, hash_files
from nslib.data.settings import Settings, settings_of
from nslib.data.gpus import load_gpus
from nslib.kernels import measured
from nslib.kernels.clock import with_power
from nslib.predictors import available, get, predictor_class
from nslib.data.sources import code_digest, dependencies

# Per-predictor default parameters, and the quick profile used by tests and --quick runs.
DEFAULTS: dict[str, dict] = {
    # nslib's design: ensembles of 3 (utilisations averaged) for bmm, linear and softmax; epochs
    # per class. Set before the leave-one-GPU-out protocol and kept (docs/decisions.md).
    "nslib": {"epochs": 30, "configs": {"bmm": {"ensemble": 3},
                                           "linear": {"epochs": 15, "ensemble": 3},
                                           "softmax": {"ensemble": 3},
                                           "layernorm": {"epochs": 60}}},
    # NeuSight as published: method.md's 100 epochs; network, learning rate and batch per
    # class from the data's published configs (NeuSight.data_params)
    "neusight": {"epochs": 100},
    "mlp": {"epochs": 40},
    # n_jobs 1: same trees as 2 threads, but 13x faster on a shared 2-core machine (OpenMP
    # threads spin-wait when the cores are oversubscribed)
    "xgboost": {"rounds": 600, "n_jobs": 1},
    "habitat": {"epochs": 60},
}
QUICK: dict[str, dict] = {
    "nslib": {"epochs": 8, "batch": 512},
    # the published network (8 x 512) is the slow part: a small one for tests and --quick
    "neusight": {"epochs": 4, "batch": 512, "layers": 4, "hidden": 128},
    "mlp": {"epochs": 6, "batch": 512},
    "xgboost": {"rounds": 60, "n_jobs": 1},
    "habitat": {"epochs": 6},
}


def train_frame(data=None, exclude_gpus=()) -> pd.DataFrame:
    """All training-split kernels of every class in one frame, without ``exclude_gpus``
    (Device strings: the GPU a leave-one-GPU-out fold holds out), with each GPU's board
    power (``tdp_w``, W: :func:`nslib.kernels.clock.with_power`)."""
    frame = pd.concat(measured.kernel_tables("train", data).values(), ignore_index=True)
    frame = with_power(frame, load_gpus(data))
    if exclude_gpus:
        frame = frame[~frame["gpu"].isin(list(exclude_gpus))].reset_index(drop=True)
    return frame


# Rough training times in seconds (full, quick profile) on a shared 2-core machine, for the
# note printed before training when no earlier training of the predictor was recorded.
ROUGH_SECONDS = {"nslib": (600, 60), "neusight": (1200, 60), "mlp": (300, 40),
                 "habitat": (300, 40), "xgboost": (120, 15), "li": (10, 10), "linreg": (10, 10)}


def epoch_predictors() -> list[str]:
    """Predictors trained for a number of epochs (the others reject ``epochs``)."""
    return sorted(n for n, p in DEFAULTS.items() if "epochs" in p)


def params_for(name: str, quick: bool = False, seed: int = 0, **overrides) -> dict:
    """The full parameter set of a predictor: defaults (or the quick profile), seed, overrides.

    An ``epochs`` override applies to every kernel class (per-class epochs of the defaults
    give way to it); it must be a positive integer, and predictors without epochs reject it.
    """
    base = (QUICK if quick else DEFAULTS).get(name, {})
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "epochs" in overrides:
        if name not in epoch_predictors():
            raise ValueError(f"predictor {name!r} is not trained in epochs, so --epochs does not "
                             f"apply to it (it does to: {', '.join(epoch_predictors())})")
        overrides["epochs"] = check_int("epochs", overrides["epochs"], minimum=1)
        if "configs" in base:
            base = {**base, "configs": {c: {k: v for k, v in cfg.items() if k != "epochs"}
                                        for c, cfg in base["configs"].items()}}
    params = {**base, **overrides}
    if name != "roofline":
        params["seed"] = check_int("seed", seed, minimum=0)
    return params


def cache_key(name: str, params: dict, data=None) -> str:
    """Content key of a trained predictor: data hash, parameters, library version and what
    the code that trains it computes (:func:`nslib.data.sources.code_digest`, so an edited
    predictor never loads stale weights, and edited prose never retrains one): the
    predictor's module, this one, and every module they import (features, laws, the fit loop,
    the kernel sizes, tiles and tables)."""
    sources = dependencies(predictor_class(name).__module__, __name__)
    return hash_files([], extra=[code_digest(sources), name, params, measured.train_hash(data),
                                 __version__])


def cached_fit(name: str, settings: Settings | None = None, *, exclude_gpus=(),
               retrain: bool = False, out=None, **overrides):
    """The FP32 predictor ``name`` trained on the training split of ``settings.data`` with
    its ``quick`` profile and ``seed`` (cached; see module doc): what
    :func:`nslib.predictors.trained` returns for ``kind="fp32"``.

    ``exclude_gpus``: Device strings left out of training (a leave-one-GPU-out fold); the
    returned predictor records them as ``excluded_gpus``.
    Training (no cached weights for this data and these parameters) is announced on stderr
    with what, why and roughly how long; ``settings.progress`` shows the fit's bars. Weights
    are saved only after a fit that finished.
    """
    s = settings_of(settings)
    data, quick, seed, progress = s.data, s.quick, s.seed, s.progress
    cls = predictor_class(name)
    params = params_for(name, quick, seed, **overrides)
    if hasattr(cls, "data_params"):  # settings the data holds (NeuSight's published configs)
        params = {**cls.data_params(data), **params}
    exclude = sorted(exclude_gpus)
    if exclude:
        known = measured.gpu_splits(data)["train_gpus"]
        unknown = [g for g in exclude if g not in known]
        if unknown:
            raise ValueError(f"cannot leave out {unknown}: not training GPUs (Device names "
                             f"{known})")
    if name == "roofline":  # nothing to fit; its dispatch floors still leave `exclude` out
        return _mark(get(name), exclude)
    key = cache_key(name, {**params, "exclude_gpus": exclude} if exclude else params, data)
    folder = Path(out) if out is not None else cache_dir("predictors")
    path = folder / f"{name}-{key}.npz"
    if not retrain:
        pred = read_cache_entry(path, cls.load, f"{name} predictor")
        if pred is not None:
            return _mark(pred, exclude)
    why = "--retrain asked for it" if retrain else "no cached weights for this training data " \
        "and these parameters"
    print(f"nslib: training the {name} predictor ({'quick' if quick else 'full'} profile, "
          f"key {key}): {why}. Roughly {_rough_time(name, quick, folder)}; cached afterwards "
          "(`nslib train --all` trains every predictor ahead).", file=sys.stderr, flush=True)
    meta = {"predictor": name, "params": params, "exclude_gpus": exclude,
            "profile": "quick" if quick else "full", "train_hash": measured.train_hash(data)}
    pred, secs = fit_and_save(
        lambda: get(name, **params).fit(train_frame(data, exclude), progress=progress), path,
        f"{name} predictor", meta)
    print(f"nslib: trained {name} in {secs:.0f} s", file=sys.stderr)
    return _mark(pred, exclude)


def _mark(pred, exclude: list[str]):
    """``pred`` with the GPUs its training left out (``excluded_gpus``), so what reads the
    training kernels on its behalf (the dispatch floors of :mod:`nslib.model.stream`) leaves
    them out too, wherever the fitted predictor goes."""
    pred.excluded_gpus = tuple(exclude)
    return pred


def fit_and_save(fit, path: Path, what: str, meta: dict):
    """``(fit(), seconds)``: the fitted predictor, saved at ``path`` (a cache entry) with
    ``meta``, the training time (``train_seconds``) and the library version in a JSON beside
    it. Saved only after a fit that finished; an unwritable folder is a :class:`CacheError`."""
    t0 = time.time()
    pred = fit()
    secs = round(time.time() - t0, 1)
    try:
        pred.save(path)
    except OSError as e:
        raise CacheError(f"cannot save the trained {what} to {path} ({e.strerror or e}): "
                         "choose a writable --out or NSLIB_CACHE") from None
    meta = {**meta, "nslib": __version__, "train_seconds": secs}
    atomic_write_text(path.with_suffix(".json"), json.dumps(meta, indent=1, default=str))
    return pred, secs


def rough_time(folder: Path, stem: str, same, default_s: float) -> str:
    """How long a fit takes, for the note printed before it: the median ``train_seconds`` of
    the earlier fits recorded in ``folder`` (cache entries ``<stem>-*.json`` whose meta
    ``same(meta)`` accepts: same predictor and profile), else ``default_s``."""
    past = []
    for meta in folder.glob(f"{stem}-*.json"):
        try:
            m = json.loads(meta.read_text())
            if same(m):
                past.append(float(m["train_seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    secs = float(np.median(past)) if past else default_s
    return f"{secs:.0f} s" if secs < 90 else f"{secs / 60:.0f} min"


def _rough_time(name: str, quick: bool, folder: Path) -> str:
    """:func:`rough_time` of an FP32 predictor (else :data:`ROUGH_SECONDS`)."""
    profile = "quick" if quick else "full"
    return rough_time(folder, name, lambda m: m.get("profile") == profile,
                      ROUGH_SECONDS.get(name, (300, 60))[quick])


def held_out(settings: Settings | None = None) -> list[str]:
    """The GPUs an FP32 leave-one-GPU-out holds out in turn: the data's training GPUs."""
    return measured.gpu_splits(settings_of(settings).data)["train_gpus"]


def train_all(settings: Settings | None = None, retrain: bool = False, out=None) -> list[str]:
    """Train (or find cached) every registered FP32 predictor that learns; returns their
    names."""
    names = [n for n in available() if n != "roofline"]
    for n in names:
        cached_fit(n, settings, retrain=retrain, out=out)
    return names


def kernel_eval_frame(data=None) -> pd.DataFrame:
    """All test-split kernels of every class in one frame."""
    return pd.concat(measured.kernel_tables("test", data).values(), ignore_index=True)


__all__ = ["cached_fit", "train_all", "train_frame", "kernel_eval_frame", "params_for", "DEFAULTS",
           "QUICK", "fit_and_save"]
