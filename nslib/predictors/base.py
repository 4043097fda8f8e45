"""The interface every kernel predictor shares: ``fit(frame)``, ``predict(frame) -> ms``,
``save(path)`` and ``load(path)``.

A kernel frame holds one row per kernel with a ``cls`` column (see :mod:`nslib.kernels.sizes`);
predictors split it by class themselves, so callers pass whole mixed frames.

Weights files are numpy ``.npz`` archives (no pickles): the state's arrays, plus its plain
values as JSON. Tensors in a state are stored as arrays and given back as tensors, so only a
predictor whose state holds tensors imports torch to load; NeuSight keeps numpy arrays and a
cached prediction never imports torch (about 1.5 s of a 2.5 s command).
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from nslib.data.paths import atomic_write_bytes

FORMAT_VERSION = 2  # 2: .npz of arrays and JSON (1 was a torch file)


class PredictorFileError(ValueError):
    """A weights file is corrupt, of another predictor, or of an incompatible version."""


class Predictor:
    """Base class. Subclasses set ``name`` and ``description`` and implement the hooks."""

    name = "base"
    description = ""

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "Predictor":
        """Train on a frame of measured kernels (needs ``latency_ms``); returns self."""
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Predicted latency in ms, one per row of ``frame``, in row order."""
        raise NotImplementedError

    # --- persistence: subclasses provide get_state / set_state of plain values and arrays
    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass

    def save(self, path: str | os.PathLike) -> Path:
        """Write the predictor to ``path`` atomically (an ``.npz`` whatever the suffix)."""
        arrays: dict[str, np.ndarray] = {}
        tree = _encode({"predictor": self.name, "format": FORMAT_VERSION,
                        "state": self.get_state()}, arrays)
        buf = io.BytesIO()
        np.savez(buf, __tree__=np.frombuffer(json.dumps(tree).encode(), np.uint8), **arrays)
        return atomic_write_bytes(Path(path), buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Predictor":
        """Read a predictor written by :meth:`save`; clear errors for bad or foreign files."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no predictor file at {path}; train one with `nslib train`")
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            blob = _decode(json.loads(arrays.pop("__tree__").tobytes()), arrays)
        except Exception as e:  # zip, numpy and json raise many types for a damaged file
            raise PredictorFileError(f"{path} is not a readable predictor file ({type(e).__name__}:"
                                     f" {str(e)[:200]}); delete it and retrain") from None
        if not isinstance(blob, dict) or blob.get("predictor") != cls.name:
            got = blob.get("predictor") if isinstance(blob, dict) else type(blob).__name__
            raise PredictorFileError(f"{path} holds a {got!r} predictor, not {cls.name!r}")
        if blob.get("format") != FORMAT_VERSION:
            raise PredictorFileError(f"{path} has format {blob.get('format')}, this nslib reads "
                                     f"{FORMAT_VERSION}; retrain with `nslib train`")
        obj = cls.__new__(cls)
        Predictor.__init__(obj)
        try:
            obj.set_state(blob["state"])
        except (KeyError, TypeError, RuntimeError, ValueError, IndexError) as e:
            raise PredictorFileError(f"{path}: weights do not match this predictor "
                                     f"({type(e).__name__}: {str(e)[:200]}); retrain") from None
        return obj


def _encode(value, arrays: dict):
    """``value`` as JSON-able data; arrays (and tensors) go to ``arrays`` under a reference.

    Markers keep what JSON would lose: ``{"__array__": k}``, ``{"__tensor__": k}``,
    ``{"__tuple__": [...]}`` and ``{"__items__": [[key, value], ...]}`` for dicts whose keys
    are not all strings.
    """
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("torch"):
        kind = "__array__" if isinstance(value, np.ndarray) else "__tensor__"
        if kind == "__tensor__" and not hasattr(value, "numpy"):
            raise TypeError(f"cannot store a {type(value).__name__} in a predictor file")
        key = f"a{len(arrays)}"
        arrays[key] = value if kind == "__array__" else value.detach().cpu().numpy()
        if arrays[key].dtype == object:
            raise TypeError("cannot store an object array in a predictor file")
        return {kind: key}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, arrays) for k, v in value.items()}
        return {"__items__": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, arrays) for v in value]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a predictor file")


def _decode(value, arrays: dict):
    """The inverse of :func:`_encode` (torch imported only when the file holds tensors)."""
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if "__array__" in value:
        return arrays[value["__array__"]]
    if "__tensor__" in value:
        import torch  # only predictors that keep tensors in their state pay for torch
        return torch.from_numpy(arrays[value["__tensor__"]])
    if "__tuple__" in value:
        return tuple(_decode(v, arrays) for v in value["__tuple__"])
    if "__items__" in value:
        return {_hashable(_decode(k, arrays)): _decode(v, arrays) for k, v in value["__items__"]}
    return {k: _decode(v, arrays) for k, v in value.items()}


def _hashable(key):
    """A dict key decoded from JSON: lists (JSON's tuples) back to tuples."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def by_class(frame: pd.DataFrame):
    """Yield ``(cls, positional index array, sub-frame)`` for each class present in ``frame``."""
    cls = frame["cls"].to_numpy()
    for c in pd.unique(cls):
        idx = np.flatnonzero(cls == c)
        yield c, idx, frame.iloc[idx]


def with_defaults(who: str, defaults: dict, params: dict) -> dict:
    """``defaults`` updated by ``params`` (a predictor's settings); a name not among the
    defaults is a TypeError naming it and the known ones."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise TypeError(f"{who} has no setting {', '.join(unknown)}; known: "
                        f"{', '.join(defaults)}")
    return {**defaults, **params}
