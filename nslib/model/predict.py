"""Model-level prediction: trace a model into kernels, predict every kernel, sum.

``predict_model(gpu, model, batch, seq, mode, predictor)`` returns the kernel frame (one row
per launched kernel with ``pred_ms``) and a summary: ``e2e_ms``, ``fw_ms``, ``bw_ms`` and ms
per kernel class. All kernels of a class are predicted in one batched call. ``fused=True``
predicts the trace after :func:`nslib.model.fusion.fuse`; ``dp``/``tp``/``pp`` (with
``microbatches`` and ``link``) a multi-GPU step through :mod:`nslib.model.parallel`.
"""
from __future__ import annotations

import pandas as pd

from nslib.data.checks import check_float, check_int
from nslib.data.gpus import GPU
from nslib.kernels.dtypes import check_dtype
from nslib.model import predict16
from nslib.model.fusion import fuse
from nslib.model.config import load_model_config
from nslib.model.inputs import MODES, get_predictor, kernel_frame, resolve_gpu, traced
from nslib.model.parallel import predict_parallel
from nslib.model.stream import LAUNCH_US, per_class_ms, step_ms
from nslib.model.trace import model_notes
from nslib.predictors.gpu_range import warn_out_of_range, warn_out_of_tensor_range
from nslib.predictors.intervals import calibration, tensor_calibration


def summarize(frame: pd.DataFrame) -> dict:
    """``{e2e_ms, fw_ms, bw_ms, per_class_ms: {...}, n_kernels}`` of a predicted frame."""
    fw = float(frame.loc[frame["phase"] == "fw", "pred_ms"].sum())
    bw = float(frame.loc[frame["phase"] == "bw", "pred_ms"].sum())
    return {"e2e_ms": fw + bw, "fw_ms": fw, "bw_ms": bw, "per_class_ms": per_class_ms(frame),
            "n_kernels": int(len(frame))}


def predict_model(gpu, model, batch: int, seq: int, mode: str = "inf",
                  predictor="nslib", data=None, quick: bool = False, *,
                  fused: bool = False, dp: int = 1, tp: int = 1, pp: int = 1,
                  microbatches: int = 1, link=None, launch_us: float | None = LAUNCH_US,
                  imbalance: float = 1.0, dtype: str = "fp32",
                  tensor_predictor="nslib"):
    """Predict one inference (``mode="inf"``) or training step (``"train"``) of ``model``.

    ``gpu``: name/alias, spec file or :class:`GPU`; ``model``: a config name in the data
    (``gpt3_27``), a JSON path or a config dict; ``predictor``: a registered name (trained and
    cached on first use) or a fitted predictor. Returns ``(kernels frame, summary dict)``.

    ``fused``: merge elementwise/memory chains first (:func:`nslib.model.fusion.fuse`; the summary
    gains ``fused`` and ``n_kernels_unfused``). ``dp``/``tp``/``pp`` (one of them > 1) and
    ``microbatches`` (pipeline only): predict a step on that many GPUs with ``batch`` the
    global batch, and ``link`` (None: the GPU's default; a bandwidth in GB/s; a
    :class:`nslib.model.parallel.LinkSpec`) for the communication; see :mod:`nslib.model.parallel`.
    The summary then gains ``comm_ms`` and ``parallel``.

    ``launch_us``: the launch gap (us) of kernels run back to back, each microbenchmark's
    dispatch floor off (:func:`nslib.model.stream.step_ms`); ``None`` sums the latencies as
    they are (the original tool's; always so for ``plain_sum`` predictors). ``imbalance``:
    top-k mixture-of-experts routing (:func:`nslib.model.moe.expert_tokens`; 1 = even).

    ``dtype``: ``fp32`` (default, the paper's setting) or ``bf16``/``fp16``: traced in that
    format with fused attention; tensor-core GEMMs and attention priced by ``tensor_predictor``
    (a name of :func:`nslib.predictors.mixed_training.predictors`, or a ``(gemm, attention)``
    pair of fitted ones), the rest by ``predictor`` at their real bytes
    (:mod:`nslib.model.predict16`). Needs ``Bf16FLOPs``; one GPU unfused, or ``tp`` inference.

    The summary's ``warnings``: the model's notes, then the datasheet figures outside the
    training GPUs' range; ``interval_ms`` where a calibration is cached (:func:`with_interval`).
    """
    batch, seq, dp, tp, pp, microbatches = _checked(mode, batch, seq, dp, tp, pp, microbatches,
                                                    imbalance)
    multi = dp != 1 or tp != 1 or pp != 1 or microbatches != 1
    launch_us, link = _check_link_and_launch(launch_us, link)
    spec = resolve_gpu(gpu, data)
    # the model's notes lead the summary's warnings (traced() issues them on every call)
    notes = model_notes(load_model_config(model, data), seq)
    if check_dtype(dtype) != "fp32" and tp > 1 and not (fused or dp > 1 or pp > 1):
        return _predict_half_tp(gpu, spec, model, batch, seq, mode, predictor, data, quick,
                                tp, link, launch_us, check_dtype(dtype), tensor_predictor,
                                notes)
    if check_dtype(dtype) != "fp32":
        frame, summ = _predict_half(spec, model, batch, seq, mode, predictor, data, quick,
                                    fused or multi, launch_us, imbalance, check_dtype(dtype),
                                    tensor_predictor)
        return frame, {**summ, "warnings": notes + summ["warnings"]}
    notes += warn_out_of_range(spec, data)
    if multi:
        frame, summ = predict_parallel(gpu, model, batch, seq, mode, predictor, data, quick,
                                       fused=fused, dp=dp, tp=tp, pp=pp,
                                       microbatches=microbatches, link=link,
                                       launch_us=launch_us)
        return frame, with_interval({**summ, "warnings": notes}, predictor, data, quick)
    frame, summ = _predict_one(spec, model, batch, seq, mode, predictor, data, quick, fused,
                               launch_us, imbalance, notes)
    return frame, with_interval(summ, predictor, data, quick)


def with_interval(summary: dict, predictor, data=None, quick: bool = False) -> dict:
    """``summary`` with ``interval_ms`` (``[lo, hi]``, ms) and ``interval_coverage`` when the
    predictor (a registered name) has a cached calibration
    (:func:`nslib.predictors.intervals.calibration`; ``nslib calibrate`` builds it): the
    comonotone class bounds' ratio to the classes' plain sum, applied to the step time (so a
    schedule's overlap or a host-bound floor scales with it). Without one, the summary is
    unchanged (building a calibration trains a fold per training GPU: never done here)."""
    if not isinstance(predictor, str):
        return summary
    cal = calibration(predictor, data, quick, build=False)
    bounds = cal.step_bounds(summary["per_class_ms"], summary["e2e_ms"]) if cal else None
    if bounds is None:
        return summary
    return {**summary, "interval_ms": list(bounds), "interval_coverage": cal.coverage}


def _checked(mode, batch, seq, dp, tp, pp, microbatches, imbalance=1.0) -> tuple:
    """The step's sizes as ints (ValueError naming a bad one, the mode, or an imbalance on
    several GPUs)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if imbalance != 1.0 and not dp == tp == pp == microbatches == 1:
        raise ValueError("imbalance applies to single-GPU predictions for now: drop "
                         "dp/tp/pp or the imbalance")
    return tuple(check_int(k, v) for k, v in (
        ("batch", batch), ("seq", seq), ("dp", dp), ("tp", tp), ("pp", pp),
        ("microbatches", microbatches)))


def _check_link_and_launch(launch_us, link):
    """``launch_us`` (us, or None) and ``link`` (a bandwidth in GB/s, or a spec), checked."""
    if launch_us is not None:
        launch_us = check_float("launch_us (microseconds)", launch_us, minimum=0)
    if isinstance(link, (int, float)) and not isinstance(link, bool):
        link = check_float("link bandwidth (GB/s)", link, positive=True)
    return launch_us, link


def _predict_one(spec: GPU, model, batch, seq, mode, predictor, data, quick, fused: bool,
                 launch_us, imbalance, notes: list) -> tuple[pd.DataFrame, dict]:
    """:func:`predict_model` on one GPU in FP32, fused or not."""
    tr = traced(model, batch, seq, mode, data, imbalance)
    frame = kernel_frame(fuse(tr, prologues=True) if fused else tr, spec)
    pred = get_predictor(predictor, data, quick)
    if getattr(pred, "plain_sum", False):  # the method's own aggregation (NeuSight's plain sum)
        launch_us = None
    frame["pred_ms"] = step_ms(pred, frame, launch_us, data)
    extra = {"fused": True, "n_kernels_unfused": int(len(tr))} if fused else {}
    return frame, {**summarize(frame), **extra, "launch_us": launch_us, "warnings": notes}


def _predict_half_tp(gpu, spec: GPU, model, batch, seq, mode, predictor, data, quick, tp,
                     link, launch_us, dtype, tensor_predictor, notes: list):
    """:func:`predict_model` of tensor-parallel 16-bit inference (predict_parallel refuses
    the other 16-bit multi-GPU cases)."""
    predict16.datasheet_columns(spec)
    notes = notes + warn_out_of_tensor_range(spec) + [f"vector kernels: {n}"
                                                      for n in warn_out_of_range(spec, data)]
    frame, summ = predict_parallel(gpu, model, batch, seq, mode, predictor, data, quick, tp=tp,
                                   link=link, launch_us=launch_us, dtype=dtype,
                                   tensor_predictor=tensor_predictor)
    summ = {**summ, "dtype": dtype, "warnings": notes}
    return frame, with_interval16(summ, frame, predictor, tensor_predictor, data, quick)


def _predict_half(spec: GPU, model, batch, seq, mode, predictor, data, quick, multi: bool,
                  launch_us, imbalance, dtype, tensor_predictor):
    """:func:`predict_model` in a 16-bit ``dtype`` (single GPU, unfused)."""
    if multi:
        raise ValueError(f"--dtype {dtype} predicts one GPU without fusion, or tensor-parallel "
                         f"inference (--tp), for now: drop --fused / --dp / --pp / "
                         f"--microbatches, or use --dtype fp32")
    predict16.datasheet_columns(spec)  # a datasheet without Bf16FLOPs fails before the trace
    # tensor-core kernels against the 16-bit data's GPUs; vector kernels (FP32-trained
    # predictors) against the NeuSight training GPUs
    notes = (warn_out_of_tensor_range(spec) +
             [f"vector kernels: {n}" for n in warn_out_of_range(spec, data)])
    frame = kernel_frame(traced(model, batch, seq, mode, data, imbalance, dtype), spec)
    tensor = (predict16.tensor_predictors(tensor_predictor, quick)
              if isinstance(tensor_predictor, str) else tuple(tensor_predictor))
    pred = get_predictor(predictor, data, quick)
    frame["pred_ms"] = predict16.stream_ms_half(pred, frame, spec, tensor, launch_us, data)
    summ = {**summarize(frame), "launch_us": launch_us, "dtype": dtype,
            "tensor_predictor": tensor_predictor if isinstance(tensor_predictor, str)
            else type(tensor[0]).__name__, "warnings": notes}
    return frame, with_interval16(summ, frame, predictor, tensor_predictor, data, quick)


def with_interval16(summary: dict, frame: pd.DataFrame, predictor, tensor_predictor,
                    data=None, quick: bool = False) -> dict:
    """:func:`with_interval` for a 16-bit step: the tensor-core GEMMs and attention take the
    16-bit predictors' calibration (:func:`nslib.predictors.intervals.tensor_calibration`),
    the other kernels the vector predictor's, added comonotonically; unchanged unless both
    are cached."""
    if not (isinstance(predictor, str) and isinstance(tensor_predictor, str)):
        return summary
    tensor = tensor_calibration(tensor_predictor, quick, build=False)
    vector = calibration(predictor, data, quick, build=False)
    total = float(frame["pred_ms"].sum())
    if tensor is None or vector is None or total <= 0:
        return summary
    gemm, attn = predict16.tensor_masks(frame)
    parts = {"gemm": frame.loc[gemm, "pred_ms"].sum(),
             "attention": frame.loc[attn, "pred_ms"].sum()}
    rest = frame[~gemm & ~attn].groupby("kernel_class")["pred_ms"].sum()
    t_lo, t_hi = tensor.step_interval(parts)
    v_lo, v_hi = vector.step_interval({k: float(v) for k, v in rest.items()})
    scale = summary["e2e_ms"] / total
    return {**summary, "interval_ms": [(t_lo + v_lo) * scale, (t_hi + v_hi) * scale],
            "interval_coverage": tensor.coverage}
