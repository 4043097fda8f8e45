"""Peak memory per GPU of a model's step on one or several GPUs (:func:`memory_of`).

One GPU: the peak of the traced step (:mod:`nslib.model.memory.step`).
Several GPUs (per GPU, ``batch`` the global batch): **DP** runs the trace at ``batch / dp``
with whole copies of weights, gradients and optimizer states, plus the buckets. **TP** scales
every storage by how much of its producing kernel one GPU runs
(:func:`nslib.model.parallel.shard_tensor_parallel`: column/row-split GEMM outputs, sharded vector
kernels), and every parameter by how much of the weight its first reader holds (split
linears 1/n, vocabulary-parallel embeddings 1/n, the rest replicated). **PP** gives each stage
the parameters its kernels read first and the activations its kernels allocate, for one
micro-batch of ``batch / microbatches``; the GPipe schedule (all forwards, then all
backwards) keeps every micro-batch's saved activations, and every received input activation,
until its backward: ``stage activations = peak of one micro-batch + (M - 1) x saved``. The
worst stage is the per-GPU figure. A tied embedding counts on the stage that reads it first
(the first); a real pipeline also keeps a copy on the last stage for the LM head.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from nslib.data.settings import Settings, settings_of
from nslib.kernels.dtypes import bytes_per_elem
from nslib.model.config import load_model_config
from nslib.model.inputs import resolve_gpu, spec_path, traced
from nslib.model.memory.step import (FP32_BYTES, GIB, Held, Memory, Share, check_step,
                                     framework_bytes, kv_cache_bytes, saved_bytes, step_memory)
from nslib.model.parallel import check_degrees, model_info, pipeline_stages, shard_tensor_parallel
from nslib.model.step import Parallel, Step, parallel_of, step_of

__all__ = ["tp_scales", "memory_of", "pipeline_memory", "trace_memory"]


def _out_elems(df: pd.DataFrame) -> np.ndarray:
    """What each kernel writes, to compare a kernel with its shard: GEMMs B*M*K elements,
    vector rows B*H elements, memory rows their bytes (a predicted frame has turned their
    dims into a copy's; sharding divides their bytes alike)."""
    cls = (df["kernel_class"] if "kernel_class" in df else df["cls"]).to_numpy()
    B, M, K, H = (df[c].to_numpy(float) for c in ("B", "M", "K", "H"))
    gemm = np.isin(cls, ("linear", "bmm"))
    return np.where(gemm, B * M * K, np.where(cls == "memory", df["bytes"].to_numpy(float),
                                              B * H))


def tp_scales(trace: pd.DataFrame, n: int, info: dict, vocab_parallel: bool = True,
              sharded: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(activation share, parameter share) of one of ``n`` tensor-parallel GPUs per row of
    ``trace``: how much of each kernel's output it writes and of the parameters it reads
    first (see the module docstring). ``sharded``: the unfused frame
    :func:`nslib.model.parallel.shard_tensor_parallel` made of this trace, when the caller has it
    (the frame of a TP ``predict_model``), to save sharding again."""
    if sharded is None or "fused_from" in sharded or \
            not np.isin(trace["kid"].to_numpy(), sharded["kid"].to_numpy()).all():
        sharded = shard_tensor_parallel(trace, n, info, vocab_parallel)
    sh = sharded[sharded["cls"] != "comm"].set_index("kid").reindex(trace["kid"].to_numpy())
    before, after = _out_elems(trace), _out_elems(sh)
    with np.errstate(divide="ignore", invalid="ignore"):
        act = np.where(before > 0, after / before, 1.0)
        nk0 = trace["N"].to_numpy(float) * trace["K"].to_numpy(float)
        nk1 = sh["N"].to_numpy(float) * sh["K"].to_numpy(float)
        lin = (trace["cls"].to_numpy() == "linear") & (nk0 > 0)
        wsc = np.where(lin, nk1 / nk0, 1.0)
    if vocab_parallel:
        vocab = trace["module"].isin(info.get("vocab_modules") or ()).to_numpy() & \
            (trace["cls"].to_numpy() == "memory")   # the trace's own classes
        wsc = np.where(vocab, 1.0 / n, wsc)
    return np.nan_to_num(act, nan=1.0), np.nan_to_num(wsc, nan=1.0)


def memory_of(gpu, model, step: Step, *, parallel: Parallel | None = None,
              optimizer: str = "adam", kv_cache: bool = False,
              sharded: pd.DataFrame | None = None, settings: Settings | None = None) -> Memory:
    """Peak memory per GPU of one step (a :class:`nslib.model.step.Step`) of ``model`` (config
    name, path or dict) on ``gpu`` (name, spec file or :class:`nslib.data.gpus.GPU`): the worst
    GPU of the DP/TP/PP step ``parallel`` (a :class:`nslib.model.step.Parallel`; None: one
    GPU), ``step.batch`` the global batch. ``kv_cache``: an inference that keeps every layer's
    keys and values (generation). ``sharded``: see :func:`tp_scales`. ``step.imbalance``:
    mixture-of-experts routing as :func:`nslib.model.inputs.traced` takes it. ``step.dtype``:
    ``fp32``, or ``bf16``/``fp16`` for a 16-bit step traced in that format (weights, gradients,
    activations and the KV cache at 2 bytes; training in mixed precision: FP32 optimizer states
    and an FP32 master copy of the weights, as DeepSpeed's BF16 training keeps them; one GPU,
    or tensor-parallel inference). ``settings``: where the data is. Raises ValueError for
    degrees that do not divide the model."""
    step, par, data = step_of(step), parallel_of(parallel), settings_of(settings).data
    batch, seq, mode, imbalance, dtype = (step.batch, step.seq, step.mode, step.imbalance,
                                          step.dtype)
    dp, tp, pp, microbatches = par.dp, par.tp, par.pp, par.microbatches
    check_step(mode, optimizer)
    if dtype != "fp32" and not (dp == pp == microbatches == 1 and (tp == 1 or mode == "inf")):
        raise ValueError(f"memory of a multi-GPU {dtype} step is tensor-parallel inference "
                         "only for now: dp = pp = 1, and tp > 1 with mode inf")
    fixed = _fixed(gpu, data)
    if dp == tp == pp == microbatches == 1:
        kv = _kv(model, batch, seq, mode, kv_cache, data, bytes_per_elem(dtype))
        trace = traced(model, batch, seq, mode, data, imbalance, dtype=dtype)
        return step_memory(trace, mode, optimizer, held=replace(fixed, kv_cache=kv),
                           fp32_states=FP32_BYTES / bytes_per_elem(dtype))
    info = model_info(model, mode, data)
    check_degrees(info, batch, dp, tp, pp, microbatches)
    if dp > 1:
        tr = traced(model, batch // dp, seq, mode, data, imbalance)
        buckets = float(tr["trainable"].sum()) if mode == "train" else 0.0
        kv = _kv(model, batch // dp, seq, mode, kv_cache, data)
        return step_memory(tr, mode, optimizer, held=replace(fixed, comm=buckets, kv_cache=kv))
    if tp > 1:
        tr = traced(model, batch, seq, mode, data, imbalance, dtype=dtype)
        act, wsc = tp_scales(tr, tp, info, par.vocab_parallel, sharded)
        kv = _kv(model, batch, seq, mode, kv_cache, data, bytes_per_elem(dtype)) / tp
        return step_memory(tr, mode, optimizer, held=replace(fixed, kv_cache=kv),
                           share=Share(scale=act, wscale=wsc))
    stages = pipeline_memory(gpu, model, step, parallel=par, optimizer=optimizer,
                             kv_cache=kv_cache, settings=settings)
    return max(stages, key=lambda m: m.total)


def _fixed(gpu, data=None) -> Held:
    """What every point of a step on ``gpu`` holds besides the trace: the framework's context
    (:func:`framework_bytes`) and the GPU's capacity."""
    spec = resolve_gpu(gpu, data)
    fw, src = framework_bytes(spec, data, spec_path(gpu))
    return Held(framework=fw, capacity=float(spec.mem_gb) * GIB, context_source=src)


def trace_memory(gpu, trace: pd.DataFrame, mode: str, optimizer: str = "adam",
                 settings: Settings | None = None) -> Memory:
    """Peak memory on ``gpu`` of one step already traced (``trace``: rows with the memory
    columns, e.g. a PyTorch module's from :func:`nslib.model.module_predict.predict_module`),
    FP32: weights, gradients and ``optimizer`` states (``mode`` "train"), the live activations
    and the framework (:func:`step_memory`)."""
    check_step(mode, optimizer)
    return step_memory(trace, mode, optimizer, held=_fixed(gpu, settings_of(settings).data))


def pipeline_memory(gpu, model, step: Step, *, parallel: Parallel, optimizer: str = "adam",
                    kv_cache: bool = False, settings: Settings | None = None) -> list[Memory]:
    """Peak memory of each of the ``parallel.pp`` pipeline stages (GPipe, see the module
    docstring) of ``step`` in ``parallel.microbatches`` micro-batches."""
    step, par, data = step_of(step), parallel_of(parallel), settings_of(settings).data
    batch, seq, mode, imbalance = step.batch, step.seq, step.mode, step.imbalance
    pp, microbatches = par.pp, par.microbatches
    check_step(mode, optimizer)
    info = model_info(model, mode, data)
    check_degrees(info, batch, 1, 1, pp, microbatches)
    fixed = _fixed(gpu, data)
    mb = batch // microbatches
    tr = traced(model, mb, seq, mode, data, imbalance)
    stage = pipeline_stages(tr, pp, info["layers"])
    # the FP32 activation received from the previous stage
    received = float(FP32_BYTES) * mb * seq * info["hidden"]
    kv = _kv(model, batch, seq, mode, kv_cache, data) / pp
    out = []
    for s in range(pp):
        sel = stage == s
        saved = saved_bytes(tr, select=sel)
        flight = (microbatches - 1) * saved
        if s > 0:
            flight += received * (microbatches if mode == "train" else 1)
        out.append(step_memory(tr, mode, optimizer, held=replace(fixed, kv_cache=kv),
                               share=Share(select=sel, in_flight=flight)))
    return out


def _kv(model, batch, seq, mode, kv_cache, data, elem_bytes: int = FP32_BYTES) -> float:
    if not kv_cache:
        return 0.0
    if mode != "inf":
        raise ValueError("kv_cache applies to inference (mode='inf'): a training step keeps "
                         "no KV cache")
    return kv_cache_bytes(load_model_config(model, data), batch, seq, elem_bytes)
