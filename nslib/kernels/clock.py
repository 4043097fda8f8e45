"""The datasheet's boost clock in kernel frames.

Two laws count in SM clocks: a layer norm's round trips (:mod:`nslib.kernels.row_latency`) and
a GEMM's issue slots (:mod:`nslib.kernels.issue_rate`). The kernel frames' GPU columns
(:meth:`nslib.data.gpus.GPU.columns`, what the predictors train on) have no clock, so a frame
priced on a datasheet takes it from :func:`frame_columns`, and a table of measured kernels
from :func:`with_clock`.
"""
from __future__ import annotations

import pandas as pd

from nslib.data.gpus import find_gpu


def frame_columns(gpu) -> dict:
    """The GPU columns of a kernel frame (:meth:`nslib.data.gpus.GPU.columns`) with the boost
    clock ``clock_mhz`` (MHz)."""
    return {**gpu.columns(), "clock_mhz": float(gpu.clock_mhz)}


def with_clock(frame: pd.DataFrame, gpus: dict) -> pd.DataFrame:
    """``frame`` (rows with a ``gpu`` Device string) with each row's ``clock_mhz`` from its
    datasheet among ``gpus`` (:func:`nslib.data.gpus.load_gpus`); a GPU without one is a
    ValueError naming it."""
    clocks = {}
    for name in frame["gpu"].unique():
        try:
            clocks[name] = float(find_gpu(name, gpus).clock_mhz)
        except KeyError:
            raise ValueError(f"no datasheet for {name!r} among the GPU configs: add its JSON "
                             f"file to data/device_configs") from None
    return frame.assign(clock_mhz=frame["gpu"].map(clocks).to_numpy(float))
