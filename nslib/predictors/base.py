"""The interface every kernel predictor shares: ``fit(frame)``, ``predict(frame) -> ms``,
``save(path)`` and ``load(path)``.

A kernel frame holds one row per kernel with a ``cls`` column (see :mod:`nslib.kernels`);
predictors split it by class themselves, so callers pass whole mixed frames.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..paths import atomic_write_bytes

FORMAT_VERSION = 1


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

    # --- persistence: subclasses provide get_state / set_state with torch-safe values
    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass

    def save(self, path: str | os.PathLike) -> Path:
        """Write the predictor to ``path`` atomically (a torch file of plain values)."""
        buf = io.BytesIO()
        torch.save({"predictor": self.name, "format": FORMAT_VERSION,
                    "state": self.get_state()}, buf)
        return atomic_write_bytes(Path(path), buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Predictor":
        """Read a predictor written by :meth:`save`; clear errors for bad or foreign files."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no predictor file at {path}; train one with `nslib train`")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a damaged file
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
        except (KeyError, TypeError, RuntimeError, ValueError) as e:
            raise PredictorFileError(f"{path}: weights do not match this predictor "
                                     f"({type(e).__name__}: {str(e)[:200]}); retrain") from None
        return obj


def by_class(frame: pd.DataFrame):
    """Yield ``(cls, positional index array, sub-frame)`` for each class present in ``frame``."""
    cls = frame["cls"].to_numpy()
    for c in pd.unique(cls):
        idx = np.flatnonzero(cls == c)
        yield c, idx, frame.iloc[idx]
