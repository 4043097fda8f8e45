"""The datasheet's boost clock and board power in kernel frames.

Two laws count in SM clocks: a layer norm's round trips (:mod:`nslib.kernels.row_latency`) and
a GEMM's issue slots (:mod:`nslib.kernels.issue_rate`); one bounds a GEMM by the board's power
(:mod:`nslib.kernels.power`). The kernel frames' GPU columns
(:meth:`nslib.data.gpus.GPU.columns`, what the predictors train on) have neither, so a frame
priced on a datasheet takes them from :func:`frame_columns`, a table of measured kernels from
:func:`with_clock`, and a training table its power from :func:`with_power`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.gpus import find_gpu


def _tdp(gpu) -> float:
    """The datasheet's TDP (W), NaN when it gives none."""
    return float(gpu.tdp_w) if gpu.tdp_w is not None else np.nan


def frame_columns(gpu) -> dict:
    """The GPU columns of a kernel frame (:meth:`nslib.data.gpus.GPU.columns`) with the boost
    clock ``clock_mhz`` (MHz) and the board power ``tdp_w`` (W, NaN when not given)."""
    return {**gpu.columns(), "clock_mhz": float(gpu.clock_mhz), "tdp_w": _tdp(gpu)}


def _per_gpu(frame: pd.DataFrame, gpus: dict, value) -> np.ndarray:
    """``value(datasheet)`` for each row's ``gpu`` (Device string) among ``gpus``; a GPU
    without a datasheet is a ValueError naming it."""
    values = {}
    for name in frame["gpu"].unique():
        try:
            values[name] = value(find_gpu(name, gpus))
        except KeyError:
            raise ValueError(f"no datasheet for {name!r} among the GPU configs: add its JSON "
                             f"file to data/device_configs") from None
    return frame["gpu"].map(values).to_numpy(float)


def with_clock(frame: pd.DataFrame, gpus: dict) -> pd.DataFrame:
    """``frame`` (rows with a ``gpu`` Device string) with each row's ``clock_mhz`` and
    ``tdp_w`` from its datasheet among ``gpus`` (:func:`nslib.data.gpus.load_gpus`), as
    :func:`frame_columns` gives them."""
    return frame.assign(clock_mhz=_per_gpu(frame, gpus, lambda g: float(g.clock_mhz)),
                        tdp_w=_per_gpu(frame, gpus, _tdp))


def with_power(frame: pd.DataFrame, gpus: dict) -> pd.DataFrame:
    """``frame`` with each row's ``tdp_w`` (W, NaN when not given) from its datasheet: what a
    training table needs to learn the power bound (:func:`nslib.kernels.power.learned_eta`)."""
    return frame.assign(tdp_w=_per_gpu(frame, gpus, _tdp))
