"""Model-level prediction: trace a model into kernels, predict every kernel, sum.

``predict_model(gpu, model, batch, seq, mode, predictor)`` returns the kernel frame (one row
per launched kernel with ``pred_ms``) and a summary: ``e2e_ms``, ``fw_ms``, ``bw_ms`` and ms
per kernel class. All kernels of a class are predicted in one batched call. ``fused=True``
predicts the trace after :func:`nslib.fusion.fuse`; ``dp``/``tp``/``pp`` (with
``microbatches`` and ``link``) a multi-GPU step through :mod:`nslib.parallel`.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__
from .checks import check_float, check_int
from .dtypes import check_dtype
from .gpus import GPU, find_gpu, load_gpu_file, load_gpus
from .launch import LAUNCH_US, stream_ms
from .paths import cache_dir, hash_files, read_cache_entry, write_cache_entry

MODES = ("inf", "train")


def resolve_gpu(gpu: str | GPU | os.PathLike, data=None) -> GPU:
    """A GPU from a :class:`GPU`, a spec file path (any suffix), or a name/alias in the data."""
    if isinstance(gpu, GPU):
        return gpu
    if not isinstance(gpu, (str, os.PathLike)):
        raise TypeError(f"gpu must be a name, a spec file path or a GPU, not "
                        f"{type(gpu).__name__}")
    path = spec_path(gpu)
    return load_gpu_file(path) if path is not None else find_gpu(str(gpu), load_gpus(data))


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

    ``imbalance``: the mixture-of-experts routing (:func:`nslib.graph.expert_tokens`);
    ``dtype``: ``fp32`` (default) or a 16-bit format (:func:`nslib.graph.trace`).
    """
    from .graph import TRACE_VERSION, expert_tokens, load_model_config
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
    return _traced(key, json.dumps(config, sort_keys=True), int(batch), int(seq), mode,
                   imbalance, dtype).copy()


# trace columns holding tuples of ints (parquet stores them as lists)
_TUPLE_COLUMNS = ("inputs", "allocs", "frees")


@lru_cache(maxsize=64)
def _traced(key: str, config_json: str, batch: int, seq: int, mode: str,
            imbalance: float = 1.0, dtype: str = "fp32") -> pd.DataFrame:
    from .graph import trace
    path = cache_dir("traces") / f"{key}.parquet"
    df = read_cache_entry(path, _read_trace, "model trace")
    if df is not None:
        return df
    df = trace(json.loads(config_json), batch, seq, mode, imbalance=imbalance, dtype=dtype)
    buf = io.BytesIO()
    df.assign(**{c: df[c].map(list) for c in _TUPLE_COLUMNS}).to_parquet(buf, index=False)
    write_cache_entry(path, buf.getvalue())
    return df


def _read_trace(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    for c in _TUPLE_COLUMNS:
        df[c] = df[c].map(lambda v: tuple(int(i) for i in v))
    return df


def kernel_frame(trace: pd.DataFrame, gpu: GPU) -> pd.DataFrame:
    """Trace rows as predictor input on ``gpu``: GPU columns added, memory ops as copies.

    Memory ops (copies, gathers, concatenations) are predicted as a one-input elementwise
    kernel (``addu``: read one element, write one) over the elements they write.
    """
    df = trace.copy()
    mem = (df["cls"] == "memory").to_numpy()
    if mem.any():
        n = np.maximum(df.loc[mem, "bytes"].to_numpy(float) / 8.0, 1.0)
        df.loc[mem, ["cls", "op"]] = ["elementwise", "addu"]
        df.loc[mem, "B"], df.loc[mem, "H"] = 1.0, np.ceil(n)
    for k, v in gpu.columns().items():
        df[k] = v
    df["kernel_class"] = np.where(mem, "memory", trace["cls"].to_numpy())
    return df


def _predictor(predictor, data=None, quick: bool = False):
    if not isinstance(predictor, str):
        return predictor
    from .training import trained
    # training on first use is announced and shows its bars (minutes of silence look a hang)
    return trained(predictor, data=data, quick=quick, progress=True)


def summarize(frame: pd.DataFrame) -> dict:
    """``{e2e_ms, fw_ms, bw_ms, per_class_ms: {...}, n_kernels}`` of a predicted frame."""
    fw = float(frame.loc[frame["phase"] == "fw", "pred_ms"].sum())
    bw = float(frame.loc[frame["phase"] == "bw", "pred_ms"].sum())
    per = frame.groupby("kernel_class")["pred_ms"].sum()
    return {"e2e_ms": fw + bw, "fw_ms": fw, "bw_ms": bw,
            "per_class_ms": {k: float(v) for k, v in per.items()}, "n_kernels": int(len(frame))}


def predict_model(gpu, model, batch: int, seq: int, mode: str = "inf",
                  predictor="neusight", data=None, quick: bool = False, *,
                  fused: bool = False, dp: int = 1, tp: int = 1, pp: int = 1,
                  microbatches: int = 1, link=None, launch_us: float | None = LAUNCH_US,
                  imbalance: float = 1.0, dtype: str = "fp32",
                  tensor_predictor="neusight"):
    """Predict one inference (``mode="inf"``) or training step (``"train"``) of ``model``.

    ``gpu``: name/alias, spec file or :class:`GPU`; ``model``: a config name in the data
    (``gpt3_27``), a JSON path or a config dict; ``predictor``: a registered name (trained and
    cached on first use) or a fitted predictor. Returns ``(kernels frame, summary dict)``.

    ``fused``: merge elementwise/memory chains first (:func:`nslib.fusion.fuse`; the summary
    gains ``fused`` and ``n_kernels_unfused``). ``dp``/``tp``/``pp`` (one of them > 1) and
    ``microbatches`` (pipeline only): predict a step on that many GPUs with ``batch`` the
    global batch, and ``link`` (None: the GPU's default; a bandwidth in GB/s; a
    :class:`nslib.parallel.LinkSpec`) for the communication; see :mod:`nslib.parallel`. The
    summary then gains ``comm_ms`` and ``parallel``.

    ``launch_us``: kernels are timed as launched back to back in the model, with this launch
    gap in microseconds (:func:`nslib.launch.stream_ms`: the dispatch floor that every
    microbenchmark carries is taken off); ``None`` sums the predictor's microbenchmark
    latencies as they are (the original tool's aggregation). The summary records it.

    ``imbalance``: routing of top-k mixture-of-experts layers (1 = tokens spread evenly over
    the experts; see :func:`nslib.graph.expert_tokens`); single-GPU steps only.

    ``dtype``: ``fp32`` (default, the paper's setting) or ``bf16``/``fp16``: the model is traced
    in that format with fused attention and its tensor-core GEMMs and attention are priced by
    the 16-bit predictors named ``tensor_predictor`` (a name of
    :func:`nslib.mixed_training.predictors`, or a ``(gemm, attention)`` pair of fitted ones),
    the rest by ``predictor`` at the kernels' real bytes (:mod:`nslib.predict16`). 16-bit needs
    the datasheet's ``Bf16FLOPs`` and a single GPU without fusion.

    The summary's ``warnings`` lists the datasheet figures of the GPU outside the training
    GPUs' range (:mod:`nslib.gpu_range`); each is also issued as a
    :class:`nslib.gpu_range.DatasheetRangeWarning`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    batch, seq = check_int("batch", batch), check_int("seq", seq)
    dp, tp, pp = check_int("dp", dp), check_int("tp", tp), check_int("pp", pp)
    microbatches = check_int("microbatches", microbatches)
    if launch_us is not None:
        launch_us = check_float("launch_us (microseconds)", launch_us, minimum=0)
    if isinstance(link, (int, float)) and not isinstance(link, bool):
        link = check_float("link bandwidth (GB/s)", link, positive=True)
    dtype = check_dtype(dtype)
    from .gpu_range import warn_out_of_range
    spec = resolve_gpu(gpu, data)
    if dtype != "fp32":
        return _predict_half(spec, model, batch, seq, mode, predictor, data, quick,
                             fused or dp != 1 or tp != 1 or pp != 1 or microbatches != 1,
                             launch_us, imbalance, dtype, tensor_predictor)
    notes = warn_out_of_range(spec, data)
    if dp != 1 or tp != 1 or pp != 1 or microbatches != 1:
        if imbalance != 1.0:
            raise ValueError("imbalance applies to single-GPU predictions for now: drop "
                             "dp/tp/pp or the imbalance")
        from .parallel import predict_parallel
        frame, summ = predict_parallel(gpu, model, batch, seq, mode, predictor, data, quick,
                                       fused=fused, dp=dp, tp=tp, pp=pp,
                                       microbatches=microbatches, link=link,
                                       launch_us=launch_us)
        return frame, {**summ, "warnings": notes}
    if fused:
        from .fusion import fuse
        tr = traced(model, batch, seq, mode, data, imbalance)
        frame = kernel_frame(fuse(tr, prologues=True), spec)
        pred = _predictor(predictor, data, quick)
        frame["pred_ms"] = stream_ms(pred, frame, launch_us, data)
        return frame, {**summarize(frame), "fused": True, "n_kernels_unfused": int(len(tr)),
                       "launch_us": launch_us, "warnings": notes}
    frame = kernel_frame(traced(model, batch, seq, mode, data, imbalance), spec)
    pred = _predictor(predictor, data, quick)
    frame["pred_ms"] = stream_ms(pred, frame, launch_us, data)
    return frame, {**summarize(frame), "launch_us": launch_us, "warnings": notes}


def _predict_half(spec: GPU, model, batch, seq, mode, predictor, data, quick, multi: bool,
                  launch_us, imbalance, dtype, tensor_predictor):
    """:func:`predict_model` in a 16-bit ``dtype`` (single GPU, unfused)."""
    from . import predict16
    from .gpu_range import warn_out_of_range
    if multi:
        raise ValueError(f"--dtype {dtype} predicts one GPU without fusion for now: drop "
                         f"--fused / --dp / --tp / --pp / --microbatches, or use --dtype fp32")
    predict16.datasheet_columns(spec)  # a datasheet without Bf16FLOPs fails before the trace
    from .gpu_range import tensor_ranges
    # tensor-core kernels against the 16-bit data's GPUs; vector kernels (FP32-trained
    # predictors) against the NeuSight training GPUs
    notes = (warn_out_of_range(spec, ranges=tensor_ranges()) +
             [f"vector kernels: {n}" for n in warn_out_of_range(spec, data)])
    frame = kernel_frame(traced(model, batch, seq, mode, data, imbalance, dtype), spec)
    tensor = (predict16.tensor_predictors(tensor_predictor, quick)
              if isinstance(tensor_predictor, str) else tuple(tensor_predictor))
    pred = _predictor(predictor, data, quick)
    frame["pred_ms"] = predict16.stream_ms_half(pred, frame, spec, tensor, launch_us, data)
    return frame, {**summarize(frame), "launch_us": launch_us, "dtype": dtype,
                   "tensor_predictor": tensor_predictor if isinstance(tensor_predictor, str)
                   else type(tensor[0]).__name__, "warnings": notes}
