"""Kernel-level evaluation of any registered predictor on the test split (method.md section 8)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import data as nsdata
from .evaluate import class_table
from .training import kernel_eval_frame, trained


def predict_test(name: str, lookup: bool = False, data=None, **train_kw) -> pd.DataFrame:
    """The test kernels with a ``pred_ms`` column from predictor ``name``.

    Kernels of GPUs that are not training GPUs take looked-up tiles (as on a GPU never
    profiled); ``lookup=True`` looks up every kernel's tile.
    """
    frame = kernel_eval_frame(data)
    splits = nsdata.gpu_splits(data)
    pred = trained(name, data=data, **train_kw)
    if hasattr(pred, "tiles"):
        new = ~frame["gpu"].isin(splits["train_gpus"]).to_numpy()
        if lookup:
            new[:] = True
        out = np.empty(len(frame))
        if (~new).any():
            out[~new] = pred.predict(frame[~new])
        if new.any():
            out[new] = pred.predict(frame[new], lookup=True)
    else:
        out = pred.predict(frame)
    return frame.assign(pred_ms=out)


def evaluate_predictor(name: str, lookup: bool = False, data=None, **train_kw) -> pd.DataFrame:
    """Per-class mean APE (%) on training GPUs and new GPUs, as ``nslib eval-kernels`` prints."""
    frame = predict_test(name, lookup=lookup, data=data, **train_kw)
    splits = nsdata.gpu_splits(data)
    return class_table(frame, frame["pred_ms"], splits["train_gpus"], splits["new_gpus"])
