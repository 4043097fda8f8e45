"""Kernel latency predictors, by name: ``get(name)`` builds one, ``available()`` lists them."""
from __future__ import annotations

from importlib import import_module

from nslib.predictors.base import Predictor, PredictorFileError

# name -> (module, class); modules import lazily so listing predictors stays cheap
_REGISTRY = {
    "roofline": ("roofline", "Roofline"),
    "nslib": ("nslib_design", "NslibDesign"),
    "neusight": ("neusight", "NeuSight"),
    "mlp": ("mlp", "UnboundedMLP"),
    "habitat": ("habitat", "Habitat"),
    "li": ("li", "LiEtAl"),
    "linreg": ("regression", "LinearRegression"),
    "xgboost": ("regression", "XGBoost"),
}


def register(name: str, module: str, cls: str) -> None:
    """Add a predictor to the registry (module is relative to nslib.predictors)."""
    _REGISTRY[name] = (module, cls)


def predictor_class(name: str) -> type[Predictor]:
    """The class registered under ``name``; unknown names list the known ones."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown predictor {name!r}; known: {', '.join(_REGISTRY)}")
    module, cls = _REGISTRY[name]
    return getattr(import_module(f".{module}", __name__), cls)


def get(name: str, **params) -> Predictor:
    """A new (untrained) predictor ``name`` built with ``params``."""
    return predictor_class(name)(**params)


def available() -> dict[str, str]:
    """``{name: one-line description}`` for every registered predictor."""
    out = {}
    for n in _REGISTRY:
        try:
            out[n] = predictor_class(n).description
        except (ImportError, AttributeError):  # a predictor module not built yet
            continue
    return out
