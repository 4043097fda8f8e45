"""What a model prediction starts from: the GPU (name, spec file or :class:`GPU`), the model's
kernel trace (cached by config content), the trace as predictor input, and the predictor.

The single-GPU and multi-GPU predictions (:mod:`nslib.model.predict`,
:mod:`nslib.model.parallel`) and the sweeps and memory model all start here.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from nslib import __version__
from nslib.data.cache import PARQUET, Format, cached
from nslib.data.checks import check_int
from nslib.data.gpus import GPU, load_gpu_file
from nslib.data.registry import find_any
from nslib.data.paths import hash_files
from nslib.data.settings import Settings
from nslib.kernels import clock
from nslib.kernels.dtypes import check_dtype
from nslib.kernels.sizes import BYTES_PER_ELEM
from nslib.model.config import load_model_config
from nslib.model.moe import expert_tokens
from nslib.model.step import MODES, Step  # MODES: the one list of modes
from nslib.model.storages import MEMORY_COLUMNS
from nslib.model.tf32 import tf32_peak, tf32_rows
from nslib.model.trace import TRACE_VERSION, trace, warn_model_notes
from nslib.predictors import trained


def resolve_gpu(gpu: str | GPU | os.PathLike, data=None) -> GPU:
    """A GPU from a :class:`GPU`, a spec file path (any suffix), or a name/alias of any
    datasheet in the data (:func:`nslib.data.registry.find_any`)."""
    if isinstance(gpu, GPU):
        return gpu
    if not isinstance(gpu, (str, os.PathLike)):
        raise TypeError(f"gpu must be a name, a spec file path or a GPU, not "
                        f"{type(gpu).__name__}")
    path = spec_path(gpu)
    return load_gpu_file(path) if path is not None else find_any(str(gpu), data)


def spec_path(gpu) -> Path | None:
    """``gpu`` as a spec file path, or None when it is a name (or a :class:`GPU`).

    A path whatever its suffix (``spec.txt``): a ``Path``, anything ending in ``.json`` or
    holding a path separator (GPU names never do), or an existing file or folder.
    """
    if isinstance(gpu, os.PathLike):
        return Path(gpu)
    if not isinstance(gpu, str):
        return None
    if gpu.endswith(".json") or "/" in gpu or os.sep in gpu or Path(gpu).expanduser().exists():
        return Path(gpu)
    return None


def traced(model, batch: int, seq: int, mode: str, data=None,
           imbalance: float = 1.0, dtype: str = "fp32") -> pd.DataFrame:
    """The kernel trace of a model (name, path or config dict), cached by config content.

    ``imbalance``: the mixture-of-experts routing (:func:`nslib.model.moe.expert_tokens`);
    ``dtype``: ``fp32`` (default) or a 16-bit format (:func:`nslib.model.trace.trace`).
    """
    batch, seq = check_int("batch", batch), check_int("seq", seq)
    expert_tokens(1, 1, 1, imbalance)  # validates it
    dtype = check_dtype(dtype)
    config = load_model_config(model, data)
    extra = [config, int(batch), int(seq), mode, __version__, TRACE_VERSION]
    if imbalance != 1.0:
        extra.append(float(imbalance))
    if dtype != "fp32":  # FP32 keys stay those of the traces cached before the dtype existed
        extra.append(dtype)
    key = hash_files([], extra=extra)
    frame = _traced(key, json.dumps(config, sort_keys=True), int(batch), int(seq), mode,
                    imbalance, dtype).copy()
    warn_model_notes(config, seq)  # on every call: the trace may come from the cache
    return frame


# trace columns holding tuples of ints (parquet stores them as lists)
TUPLE_COLUMNS = ("inputs", "allocs", "frees")


@lru_cache(maxsize=64)
def _traced(key: str, config_json: str, batch: int, seq: int, mode: str,
            imbalance: float = 1.0, dtype: str = "fp32") -> pd.DataFrame:
    step = Step(batch, seq, mode, dtype, imbalance=imbalance)
    return cached("traces", key, lambda: trace(json.loads(config_json), step, notes=False),
                  "model trace", TRACE_FORMAT)


def _read_trace(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    for c in TUPLE_COLUMNS:
        df[c] = df[c].map(lambda v: tuple(int(i) for i in v))
    return df


# parquet stores tuple columns as lists
TRACE_FORMAT = Format(".parquet", lambda df: PARQUET.to_bytes(
    df.assign(**{c: df[c].map(list) for c in TUPLE_COLUMNS})), _read_trace)


def one_algorithm(trace: pd.DataFrame, gpu: GPU, tf32: np.ndarray | None = None
                  ) -> pd.DataFrame:
    """A copy of ``trace`` with one algorithm per op that two can run (its
    ``attrs["alternatives"]``: a 3x3 convolution's implicit GEMM and Winograd rows): the one
    whose rows take less time at ``gpu``'s datasheet peak and bandwidth (the roofline, sum of
    ``max(flops / peak, bytes / bandwidth)``; rows flagged in ``tf32`` at the TF32 peak and
    their DRAM bytes, ``4 x dram_elems``), as cuDNN's heuristics pick the faster algorithm
    for a shape. The flags become the ``tf32`` column (all False without them). The losing
    rows are dropped (their memory and dependencies kept, :func:`_drop_kernels`)."""
    alts = trace.attrs.get("alternatives") or ()
    df = trace.copy()
    df.attrs.pop("alternatives", None)
    df["tf32"] = np.zeros(len(df), bool) if tf32 is None else np.asarray(tf32, bool)
    if not alts:
        return df
    peak, nbytes = gpu.peak_gflops, df["bytes"].to_numpy(float)
    if df["tf32"].any():   # rows on the tensor cores: their peak, the bytes they move
        on = df["tf32"].to_numpy()
        peak = np.where(on, tf32_peak(gpu), peak)
        nbytes = np.where(on, BYTES_PER_ELEM * df["dram_elems"].to_numpy(float), nbytes)
    row_s = np.maximum(df["flops"].to_numpy(float) / (peak * 1e9), nbytes / (gpu.mem_bw * 1e9))
    cost = pd.Series(row_s, index=df["kid"].to_numpy())
    moved = {}   # a dropped kid -> the kept form's last kernel
    for a, b in alts:
        keep, lose = (a, b) if cost[list(a)].sum() <= cost[list(b)].sum() else (b, a)
        moved.update(dict.fromkeys(lose, keep[-1]))
    return _drop_kernels(df, moved)


def _drop_kernels(df: pd.DataFrame, moved: dict) -> pd.DataFrame:
    """``df`` without the kernels ``moved`` maps (kid -> kid): what the storage model filed
    under a dropped kernel (allocations, frees, parameters) goes to the kernel it maps to, and
    dependencies on it point there too."""
    pos = dict(zip(df["kid"].tolist(), range(len(df))))
    kids = df["kid"].tolist()
    df["inputs"] = [tuple(dict.fromkeys(moved.get(k, k) for k in ins if moved.get(k, k) != me))
                    for ins, me in zip(df["inputs"], kids)]
    if set(MEMORY_COLUMNS) <= set(df.columns):
        allocs, frees = [tuple(a) for a in df["allocs"]], [tuple(f) for f in df["frees"]]
        params, trainable = (df[c].to_numpy(float).copy() for c in ("params", "trainable"))
        for k, to in moved.items():
            i, j = pos[k], pos[to]
            allocs[j], frees[j] = allocs[j] + allocs[i], frees[j] + frees[i]
            params[j] += params[i]
            trainable[j] += trainable[i]
        df["allocs"] = allocs
        df["frees"] = [tuple(moved.get(f, f) for f in fs) for fs in frees]
        df["params"], df["trainable"] = params, trainable
    return df[~df["kid"].isin(list(moved))].reset_index(drop=True)


def kernel_frame(trace: pd.DataFrame, gpu: GPU, tf32: bool = False) -> pd.DataFrame:
    """Trace rows as predictor input on ``gpu``: GPU columns added, memory ops as copies.

    Memory ops (copies, gathers, concatenations) are predicted as a one-input elementwise
    kernel (``addu``: read one element, write one) over the elements they write. ``tf32``:
    the convolutions may run in TF32 (PyTorch's default; off by default here, see
    docs/decisions.md), and the ``tf32`` column flags the rows that can
    (:func:`nslib.model.tf32.tf32_rows`).
    An op two algorithms can run keeps the one :func:`one_algorithm` picks on ``gpu``.
    """
    df = one_algorithm(trace, gpu, tf32_rows(trace, gpu) if tf32 else None)
    cls = df["cls"].to_numpy()
    mem = cls == "memory"
    if mem.any():
        n = np.maximum(df.loc[mem, "bytes"].to_numpy(float) / 8.0, 1.0)
        df.loc[mem, ["cls", "op"]] = ["elementwise", "addu"]
        df.loc[mem, "B"], df.loc[mem, "H"] = 1.0, np.ceil(n)
    for k, v in clock.frame_columns(gpu).items():
        df[k] = v
    df["kernel_class"] = np.where(mem, "memory", cls)
    return df


def get_predictor(predictor, data=None, quick: bool = False, seed: int = 0):
    """``predictor`` itself when fitted; a registered name is trained with ``seed`` (or read
    from the cache)."""
    if not isinstance(predictor, str):
        return predictor
    # training on first use is announced and shows its bars (minutes of silence look a hang)
    return trained(predictor, Settings(data=data, quick=quick, seed=seed))



# (batch, seq) points a scaling law is fitted at (:func:`nslib.model.sweep.scaling_law`,
# :func:`nslib.model.memory.storage_law`): three traces pin a law linear in batch and seq
LAW_POINTS = ((2, 32), (3, 32), (2, 48))
LAW_POINTS_ONE = ((1, 32), (1, 32), (1, 48))  # the same with batch held at 1
