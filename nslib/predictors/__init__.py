"""Kernel latency predictors, by kind and name: one registry and one way to get them trained.

Kinds: ``fp32`` (NeuSight's five FP32 kernel classes), ``gemm`` and ``attention`` (16-bit
tensor-core GEMMs and FlashAttention). ``get(name, kind=...)`` builds a predictor,
``available(kind)`` lists them, and ``trained(name, settings, kind=...)`` returns one trained on
the measured GPUs (from the cache when its code, data and parameters are unchanged).
"""
from __future__ import annotations

from importlib import import_module

from nslib.predictors.base import Predictor, PredictorFileError

KINDS = ("fp32", "gemm", "attention")
# the module that trains (and caches) each kind's predictors
_TRAINING = {"fp32": "training", "gemm": "mixed_training", "attention": "mixed_training"}
_TENSOR_BASELINES = {"roofline": "Roofline", "roofline_eff": "RooflineEfficiency",
                     "xgboost": "XGBoostBaseline", "mlp": "MLPBaseline"}
# (kind, name) -> (module, class); modules import lazily so listing predictors stays cheap
_REGISTRY = {
    ("fp32", "roofline"): ("roofline", "Roofline"),
    ("fp32", "nslib"): ("nslib_design", "NslibDesign"),
    ("fp32", "neusight"): ("neusight", "NeuSight"),
    ("fp32", "mlp"): ("mlp", "UnboundedMLP"),
    ("fp32", "habitat"): ("habitat", "Habitat"),
    ("fp32", "li"): ("li", "LiEtAl"),
    ("fp32", "linreg"): ("regression", "LinearRegression"),
    ("fp32", "xgboost"): ("regression", "XGBoost"),
    ("gemm", "nslib"): ("tc_gemm", "TensorGemm"),
    ("attention", "nslib"): ("attention", "TensorAttention"),
    **{(k, n): ("tensor_baselines", c) for k in ("gemm", "attention")
       for n, c in _TENSOR_BASELINES.items()},
}


def check_kind(kind: str) -> str:
    """``kind`` if it is one of :data:`KINDS`, else a ValueError listing them."""
    if kind not in KINDS:
        raise ValueError(f"unknown predictor kind {kind!r}; known: {', '.join(KINDS)}")
    return kind


def register(name: str, module: str, cls: str, kind: str = "fp32") -> None:
    """Add a predictor to the registry (module is relative to nslib.predictors)."""
    _REGISTRY[(check_kind(kind), name)] = (module, cls)


def names(kind: str = "fp32") -> list[str]:
    """The registered predictor names of ``kind``, in registration order."""
    check_kind(kind)
    return [n for k, n in _REGISTRY if k == kind]


def predictor_class(name: str, kind: str = "fp32") -> type[Predictor]:
    """The class registered under ``name`` for ``kind``; unknown names list the known ones."""
    if (check_kind(kind), name) not in _REGISTRY:
        raise KeyError(f"unknown predictor {name!r} of kind {kind}; known: "
                       f"{', '.join(names(kind))}")
    module, cls = _REGISTRY[(kind, name)]
    return getattr(import_module(f".{module}", __name__), cls)


def get(name: str, kind: str = "fp32", **params) -> Predictor:
    """A new (untrained) predictor ``name`` of ``kind`` built with ``params`` (16-bit ones as
    their trainer builds them: ``seed`` and ``quick``)."""
    if check_kind(kind) != "fp32":
        return import_module(f".{_TRAINING[kind]}", __name__).make(kind, name, **params)
    return predictor_class(name, kind)(**params)


def available(kind: str = "fp32") -> dict[str, str]:
    """``{name: one-line description}`` for every registered predictor of ``kind``."""
    out = {}
    for n in names(kind):
        try:
            out[n] = predictor_class(n, kind).description
        except (ImportError, AttributeError):  # a predictor module not built yet
            continue
    return out


def trained(name: str, settings=None, *, kind: str = "fp32", exclude_gpus=(),
            retrain: bool = False, out=None, table=None, **overrides) -> Predictor:
    """Predictor ``name`` of ``kind`` trained on every measured GPU of the kind's data except
    ``exclude_gpus`` (Device names: a leave-one-GPU-out fold), cached by content.

    ``settings``: the run's :class:`nslib.data.settings.Settings` (data folders, quick profile,
    seed, progress bars); ``retrain``: fit again even when cached; ``out``: the folder to
    cache in (FP32; default the cache); ``table``: the kind's measured table when the caller
    holds it (16-bit); ``overrides``: training parameters (FP32: ``epochs``, a class's
    settings). A cached predictor is loaded without training.
    """
    trainer = import_module(f".{_TRAINING[check_kind(kind)]}", __name__)
    if kind == "fp32":
        if table is not None:
            raise ValueError("table= applies to the 16-bit kinds; the FP32 predictors read "
                             "their training kernels from the data")
        return trainer.cached_fit(name, settings, exclude_gpus=exclude_gpus, retrain=retrain,
                                  out=out, **overrides)
    if retrain or out is not None or overrides:
        raise ValueError("retrain, out and training overrides apply to the FP32 predictors; "
                         "the 16-bit ones train with their own settings")
    return trainer.cached_fit(kind, name, settings, exclude_gpus=exclude_gpus, table=table)


def folds(name: str, settings=None, *, kind: str = "fp32", table=None, **overrides):
    """The leave-one-GPU-out folds of ``kind``, the one fold loop of every table: ``(held-out
    Device name, predictor name trained without that GPU)`` for each GPU in turn (FP32: the
    training GPUs; 16-bit: every GPU the kind's ``table`` measures), each fold trained once
    and cached (:func:`trained`). ``settings.progress`` shows a bar over the folds."""
    from tqdm.auto import tqdm

    from nslib.data.settings import settings_of
    s = settings_of(settings)
    trainer = import_module(f".{_TRAINING[check_kind(kind)]}", __name__)
    gpus = trainer.held_out(s) if kind == "fp32" else trainer.held_out(kind, s, table)
    for g in tqdm(gpus, desc=f"{name} leave-one-GPU-out", disable=not s.progress):
        yield g, trained(name, s.but(progress=False), kind=kind, exclude_gpus=[g], table=table,
                         **overrides)


__all__ = ["Predictor", "PredictorFileError", "KINDS", "get", "available", "names",
           "predictor_class", "register", "trained", "folds", "check_kind"]
