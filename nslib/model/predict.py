"""Model-level prediction: trace a model into kernels, predict every kernel, sum.

``predict_model(gpu, model, Step(batch, seq, mode), predictor)`` returns the kernel frame (one
row per launched kernel with ``pred_ms``) and a summary: ``e2e_ms``, ``fw_ms``, ``bw_ms`` and
ms per kernel class. All kernels of a class are predicted in one batched call. A fused
:class:`~nslib.model.step.Step` predicts the trace after :func:`nslib.model.fusion.fuse`; a
:class:`~nslib.model.step.Parallel` with a degree above 1 a multi-GPU step through
:mod:`nslib.model.parallel`.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from nslib.data.checks import check_float
from nslib.data.gpus import GPU
from nslib.data.settings import Settings, settings_of
from nslib.model.fusion import fuse
from nslib.model.config import check_seq, load_model_config, position_limits
from nslib.model.inputs import get_predictor, kernel_frame, resolve_gpu, traced
from nslib.model.module_predict import is_module_spec, predict_module
from nslib.model.parallel import predict_parallel
from nslib.model.step import Parallel, Step, parallel_of, step_of
from nslib.model.stream import (LAUNCH_US, datasheet_columns, power_bound, step_ms, step_summary,
                                 stream_ms, tensor_masks, tensor_predictors)
from nslib.model.trace import model_notes
from nslib.predictors.gpu_range import warn_out_of_range, warn_out_of_tensor_range
from nslib.predictors.intervals import calibration, tensor_calibration


def predict_model(gpu, model, step: Step | None = None, predictor="nslib", *,
                  parallel: Parallel | None = None, tensor_predictor=None,
                  launch_us: float | None = LAUNCH_US, settings: Settings | None = None,
                  inputs=None, tf32: bool = False):
    """Predict one step of ``model``: ``(kernels frame, summary dict)``.

    ``gpu``: name/alias, spec file or :class:`GPU`; ``model``: a config name in the data
    (``gpt3_27``), a JSON path or a config dict; or any PyTorch module (an ``nn.Module``, a
    factory returning one, a ``FILE.py[:NAME]``), whose step on ``inputs`` (tensors or
    shapes; a KernelBench-style file's own ``get_inputs()`` when ``None``) is traced and
    priced (:func:`nslib.model.module_predict.predict_module`; ``step`` omitted: an inference
    forward, else an FP32 step whose mode is taken, its batch and sequence the inputs');
    ``step``: a :class:`nslib.model.step.Step` (batch, seq, mode ``inf``/``train``, dtype,
    fused, mixture-of-experts imbalance); ``predictor``: a registered name (trained and cached
    on first use) or a fitted predictor. ``step.fused``: merge elementwise/memory chains
    first (:func:`nslib.model.fusion.fuse`; the summary gains ``fused`` and
    ``n_kernels_unfused``). ``parallel``: a :class:`nslib.model.step.Parallel` with a degree
    above 1 predicts a step on that many GPUs, ``step.batch`` the global batch, over its link
    (:mod:`nslib.model.parallel`); the summary then gains ``comm_ms`` and ``parallel``.

    ``launch_us``: the launch gap (us) of kernels run back to back (:func:`step_ms`); ``None``
    sums the latencies as they are (the original tool's; always so for ``plain_sum`` ones).

    ``step.dtype`` ``bf16``/``fp16``: traced in that format with fused attention; tensor-core
    GEMMs and attention priced by ``tensor_predictor`` (a name, ``available("gemm")``, default
    ``nslib``, or a fitted ``(gemm, attention)`` pair), the rest by ``predictor`` at their real
    bytes (:func:`nslib.model.stream.stream_ms`). Needs ``Bf16FLOPs``; one GPU unfused, or
    tensor-parallel inference. ``tf32``: a module's convolutions may run in TF32 where faster
    (opt-in: :func:`nslib.model.module_predict.priced_frame`). ``settings``: the data and
    training profile (:class:`nslib.data.settings.Settings`).

    The summary's ``warnings``: the model's notes, then the datasheet figures outside the
    training GPUs' range; ``interval_ms`` where a calibration is cached (:func:`with_interval`).
    """
    if is_module_spec(model):
        return _predict_module(gpu, model, step, predictor, parallel, launch_us, settings,
                               inputs, tensor_predictor, tf32)
    tensor_predictor = "nslib" if tensor_predictor is None else tensor_predictor
    step, par, s = _config_step(step, inputs, tf32), parallel_of(parallel), settings_of(settings)
    if step.imbalance != 1.0 and par.multi:
        raise ValueError("imbalance applies to single-GPU predictions for now: drop "
                         "dp/tp/pp or the imbalance")
    if launch_us is not None:
        launch_us = check_float("launch_us (microseconds)", launch_us, minimum=0)
    spec = resolve_gpu(gpu, s.data)
    config = _checked_config(model, step.seq, s.data)
    # the model's notes lead the summary's warnings (traced() issues them on every call)
    notes = model_notes(config, step.seq) + _range_notes(spec, step, par, s)
    if par.multi:
        frame, summ = predict_parallel(gpu, model, step, par, predictor,
                                       tensor_predictor=tensor_predictor, launch_us=launch_us,
                                       settings=s)
    else:
        frame, summ = _predict_one(_Ask(spec, model, step, predictor, tensor_predictor,
                                        launch_us, s))
    summ = {**summ, "warnings": notes}
    if step.dtype == "fp32":
        return frame, with_interval(summ, predictor, s.data, s.quick)
    summ = {**summ, "dtype": step.dtype, "tensor_predictor": _tensor_name(tensor_predictor)}
    return frame, with_interval16(summ, frame, predictor, tensor_predictor, s.data, s.quick)


def _checked_config(model, seq: int, data=None) -> dict:
    """The model's config dict, ``seq`` (tokens) checked against the sequence limits it sets
    before any trace (:func:`nslib.model.config.check_seq`; the trace checks the limits
    transformers adds by default)."""
    config = load_model_config(model, data)
    check_seq(position_limits(config), seq)
    return config


def _config_step(step, inputs, tf32: bool = False) -> Step:
    """The step of a model config (a ValueError when missing, or given a module's inputs or
    ``tf32``)."""
    if tf32:
        raise ValueError("tf32 applies to a PyTorch module's convolutions; a model config's "
                         "GEMMs run in FP32 (PyTorch's default for matmuls): drop tf32")
    if step is None:
        raise ValueError("give the step (nslib.model.step.Step: batch, sequence, mode) of a "
                         "model config; only a module's inputs say its shapes")
    if inputs is not None:
        raise ValueError("inputs= applies to a PyTorch module; a model config's inputs come "
                         "from the step's batch and sequence")
    return step_of(step)


def _predict_module(gpu, model, step, predictor, parallel, launch_us, settings, inputs,
                    tensor_predictor=None, tf32: bool = False):
    """:func:`predict_model` of a PyTorch module: an FP32 inference forward or training step
    on one GPU (its TF32 convolutions priced by ``tensor_predictor``'s GEMM predictor)."""
    mode = "inf"
    if step is not None:
        st = step_of(step)
        if st.dtype != "fp32" or st.fused or st.imbalance != 1.0:
            raise ValueError("a PyTorch module is forecast as an FP32 step (an inference "
                             "forward or a training step): drop --dtype, --fused and "
                             "--imbalance")
        mode = st.mode
    if parallel is not None and parallel_of(parallel).multi:
        raise ValueError("a PyTorch module is forecast on one GPU: drop dp/tp/pp")
    s = settings_of(settings)
    spec = resolve_gpu(gpu, s.data)
    gemm = tensor_predictor if tensor_predictor is None or isinstance(tensor_predictor, str) \
        else tuple(tensor_predictor)[0]
    frame, summary = predict_module(spec, model, inputs, predictor, launch_us=launch_us,
                                    mode=mode, settings=s, tensor_predictor=gemm, tf32=tf32)
    # a module has no model notes: its unpriced calls, then the datasheet figures outside the
    # training GPUs' range
    summary = {**summary, "warnings": [*summary.get("warnings", []),
                                       *warn_out_of_range(spec, s.data)]}
    return frame, with_interval(summary, predictor, s.data, s.quick)


def _range_notes(spec: GPU, step: Step, par: Parallel, settings: Settings) -> list[str]:
    """The datasheet figures outside the training GPUs' range: the FP32 predictors' for an
    FP32 step; for a 16-bit one the tensor-core predictors' (against the 16-bit data's GPUs),
    then the vector kernels' (FP32-trained, against the NeuSight training GPUs). A 16-bit step
    is one GPU unfused or tensor-parallel inference (ValueError naming the fix otherwise), and
    needs ``Bf16FLOPs``: both fail here, before the trace."""
    if step.dtype == "fp32":
        return warn_out_of_range(spec, settings.data)
    if step.fused or par.dp > 1 or par.pp > 1 or par.microbatches > 1:
        raise ValueError(f"--dtype {step.dtype} predicts one GPU without fusion, or "
                         f"tensor-parallel inference (--tp), for now: drop --fused / --dp / "
                         f"--pp / --microbatches, or use --dtype fp32")
    datasheet_columns(spec)
    return warn_out_of_tensor_range(spec) + [f"vector kernels: {n}"
                                             for n in warn_out_of_range(spec, settings.data)]


def _tensor_name(tensor_predictor) -> str:
    """The name of the 16-bit predictors: a registered name, or the fitted GEMM one's class."""
    if isinstance(tensor_predictor, str):
        return tensor_predictor
    return type(tuple(tensor_predictor)[0]).__name__


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


@dataclass(frozen=True)
class _Ask:
    """One :func:`predict_model` call, resolved: the GPU's datasheet and the arguments."""
    spec: GPU
    model: object
    step: Step
    predictor: object
    tensor_predictor: object
    launch_us: float | None
    settings: Settings


def _predict_one(ask: _Ask) -> tuple[pd.DataFrame, dict]:
    """:func:`predict_model` on one GPU: the step traced in its dtype, fused when asked, its
    kernels priced as a stream (16 bits: tensor-core GEMMs and attention by the 16-bit
    predictors, :func:`nslib.model.stream.stream_ms`)."""
    st, s = ask.step, ask.settings
    tr = traced(ask.model, st.batch, st.seq, st.mode, s.data, st.imbalance, st.dtype)
    frame = kernel_frame(fuse(tr, prologues=True) if st.fused else tr, ask.spec)
    pred = get_predictor(ask.predictor, s.data, s.quick)
    launch_us = ask.launch_us
    if st.dtype != "fp32":
        tp = ask.tensor_predictor
        tensor = tensor_predictors(tp, s.quick) if isinstance(tp, str) else tuple(tp)
        frame["pred_ms"] = stream_ms(pred, frame, launch_us, s.data, tensor=(ask.spec, *tensor))
        return frame, {**step_summary(frame), "launch_us": launch_us}
    if getattr(pred, "plain_sum", False):  # the method's own aggregation (NeuSight's plain sum)
        launch_us = None
    frame["pred_ms"] = step_ms(pred, frame, launch_us, s.data)
    extra = {"fused": True, "n_kernels_unfused": int(len(tr))} if st.fused else {}
    return frame, {**step_summary(frame), **extra, "launch_us": launch_us,
                   **power_bound(pred, frame)}


def with_interval16(summary: dict, frame: pd.DataFrame, predictor, tensor_predictor,
                    data=None, quick: bool = False) -> dict:
    """:func:`with_interval` for a 16-bit step: the tensor-core GEMMs and attention take the
    16-bit predictors' calibration (:func:`nslib.predictors.intervals.tensor_calibration`),
    the other kernels the vector predictor's, added comonotonically; unchanged unless both
    are cached."""
    if not (isinstance(predictor, str) and isinstance(tensor_predictor, str)):
        return summary
    tensor = tensor_calibration(tensor_predictor, quick, build=False)
    if tensor is None:  # no need to look for the vector one (it reads the FP32 data's key)
        return summary
    vector = calibration(predictor, data, quick, build=False)
    total = float(frame["pred_ms"].sum())
    if vector is None or total <= 0:
        return summary
    gemm, attn = tensor_masks(frame)
    parts = {"gemm": frame.loc[gemm, "pred_ms"].sum(),
             "attention": frame.loc[attn, "pred_ms"].sum()}
    rest = frame[~gemm & ~attn].groupby("kernel_class")["pred_ms"].sum()
    t_lo, t_hi = tensor.step_interval(parts)
    v_lo, v_hi = vector.step_interval({k: float(v) for k, v in rest.items()})
    scale = summary["e2e_ms"] / total
    return {**summary, "interval_ms": [(t_lo + v_lo) * scale, (t_hi + v_hi) * scale],
            "interval_coverage": tensor.coverage}
