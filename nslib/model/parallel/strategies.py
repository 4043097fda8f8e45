"""A training or inference step on several GPUs of one server, predicted (method.md 6).

Every strategy starts from the single-GPU kernel trace (:func:`nslib.model.inputs.traced`),
turns it into what one GPU runs (data parallel: a smaller batch; tensor parallel:
:mod:`nslib.model.parallel.tensor`; pipeline parallel: :mod:`nslib.model.parallel.pipeline`),
predicts the kernels with the kernel predictor and the communication with a link model
(:mod:`nslib.model.parallel.links`), and combines them with the strategy's schedule
(:mod:`nslib.model.parallel.schedules`).

Only one strategy at a time; degrees must divide the model (DP: the batch; TP: the heads;
PP: the blocks, and ``M`` the batch), else ValueError naming the constraint
(:func:`check_degrees`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from nslib.data.settings import Settings, settings_of
from nslib.kernels import sizes
from nslib.model.blocks import block_index
from nslib.model.config import (MEASURED_ARCHITECTURE, build_model, load_model_config,
                                position_limits)
from nslib.model.fusion import fuse
from nslib.model.inputs import get_predictor, kernel_frame, resolve_gpu
from nslib.model.inputs import spec_path as spec_path_of
from nslib.model.inputs import traced
from nslib.model.parallel.links import LinkSpec, resolve_link
from nslib.model.parallel.pipeline import pipeline_stages
from nslib.model.parallel.schedules import (dp_schedule, gradient_rows, insert_transfers,
                                            pp_schedule, tp_schedule)
from nslib.model.parallel.tensor import shard_tensor_parallel
from nslib.model.step import Parallel, Step, parallel_of, step_of
from nslib.model.stream import (LAUNCH_US, datasheet_columns, per_class_ms, step_ms, stream_ms,
                                 tensor_predictors)

__all__ = ["model_info", "config_heads", "check_degrees", "predict_parallel"]


# --------------------------------------------------------------------------------------------
# The model: sizes and parameters per block
# --------------------------------------------------------------------------------------------

def model_info(model, mode: str = "train", data=None) -> dict:
    """Sizes of a model config: ``hidden``, ``heads``, ``kv_heads`` (key/value heads, the
    query heads without grouped-query attention), ``layers`` (transformer blocks),
    ``vocab``, ``param_bytes`` (FP32 bytes of the parameters per block index, -1 for those
    outside the blocks; tied weights once) and ``vocab_modules`` (embedding modules with a
    vocabulary-sized table). Built on the meta device (no memory), cached."""
    config = load_model_config(model, data)
    return _model_info(json.dumps(config, sort_keys=True), mode)


@lru_cache(maxsize=32)
def _model_info(config_json: str, mode: str) -> dict:
    import torch.nn as nn
    config = json.loads(config_json)
    hf, model = build_model(config, MEASURED_ARCHITECTURE.get((config.get("model_type"), mode)))
    blocks = block_index(model)
    per: dict[int, float] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        layer = -1
        for i in range(len(parts) - 1, 0, -1):
            hit = blocks.get(".".join(parts[:i]))
            if hit is not None:
                layer = hit
                break
        per[layer] = per.get(layer, 0.0) + float(p.numel()) * sizes.BYTES_PER_ELEM
    vocab = int(getattr(hf, "vocab_size", 0) or 0)
    vocab_modules = tuple(n for n, m in model.named_modules()
                          if isinstance(m, nn.Embedding) and vocab and m.num_embeddings == vocab)
    return {"hidden": int(getattr(hf, "hidden_size")),
            "heads": int(getattr(hf, "num_attention_heads")),
            "kv_heads": int(getattr(hf, "num_key_value_heads", None)
                            or getattr(hf, "num_attention_heads")),
            "layers": len(blocks), "vocab": vocab, "param_bytes": per,
            "vocab_modules": vocab_modules, "architecture": type(model).__name__,
            "positions": position_limits(hf)}


# config fields of the attention heads that mean the same in every model type (GPT-2's n_head)
HEAD_KEYS = ("num_attention_heads", "n_head")


def config_heads(config: dict) -> dict:
    """``{heads, kv_heads}`` read from a config dict, without building the model: the first
    of :data:`HEAD_KEYS` it sets, the key/value heads ``num_key_value_heads`` (else the
    heads); {} when it sets none. Enough for :func:`check_degrees` to refuse a tensor-parallel
    degree before the (slower) build and trace."""
    heads = next((config[k] for k in HEAD_KEYS if isinstance(config.get(k), int)), None)
    if heads is None:
        return {}
    kv = config.get("num_key_value_heads")
    return {"heads": heads, "kv_heads": kv if isinstance(kv, int) and kv > 0 else heads}


def check_degrees(info: dict, batch: int, dp: int = 1, tp: int = 1, pp: int = 1,
                  microbatches: int = 1) -> None:
    """ValueError unless the degrees are positive integers that divide the model (``info``:
    :func:`model_info`; a size it lacks is not checked, as before the model is built)."""
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if sum(d > 1 for d in (dp, tp, pp)) > 1:
        raise ValueError(f"combining parallelism kinds (dp={dp}, tp={tp}, pp={pp}) is not "
                         f"modelled: set only one of dp, tp, pp above 1")
    if microbatches > 1 and pp == 1:
        raise ValueError("microbatches applies to pipeline parallelism: set pp > 1 "
                         "(or microbatches=1)")
    if batch % dp:
        raise ValueError(f"data parallelism needs the global batch divisible by dp: batch "
                         f"{batch} is not divisible by dp={dp}")
    if info.get("heads", tp) % tp:
        raise ValueError(f"tensor parallelism needs the attention heads divisible by tp: "
                         f"{info['heads']} heads are not divisible by tp={tp}")
    kv = info.get("kv_heads", info.get("heads", tp))
    if kv % tp:
        # Megatron splits the key/value heads (query groups) across the GPUs as it does the
        # query heads; a degree above their count would need replicated KV heads (not modelled)
        raise ValueError(f"tensor parallelism needs the key/value heads divisible by tp: "
                         f"{kv} key/value heads are not divisible by tp={tp}; use a tp that "
                         f"divides {kv}")
    layers = info.get("layers", pp)
    if layers % pp or (pp > 1 and layers == 0):
        raise ValueError(f"pipeline parallelism needs the transformer layers divisible by pp: "
                         f"{info['layers']} layers are not divisible by pp={pp}")
    if pp > 1 and batch % microbatches:
        raise ValueError(f"pipeline micro-batches must divide the batch: batch {batch} is not "
                         f"divisible by microbatches={microbatches}")


# --------------------------------------------------------------------------------------------
# Prediction
# --------------------------------------------------------------------------------------------

def _predict_rows(frame: pd.DataFrame, spec, pred, link: LinkSpec,
                  launch_us: float | None = LAUNCH_US, data=None,
                  tensor=None) -> pd.DataFrame:
    """Kernel rows by the predictor (as a step, :func:`nslib.model.stream.step_ms`; a 16-bit
    trace's with its ``tensor`` (GEMM, attention) predictors, :func:`nslib.model.stream.stream_ms`),
    comm rows by the link model; adds ``pred_ms``."""
    is_comm = (frame["cls"] == "comm").to_numpy()
    kf = kernel_frame(frame[~is_comm], spec)
    kf["pred_ms"] = (step_ms(pred, kf, launch_us, data) if tensor is None else
                     stream_ms(pred, kf, launch_us, data, tensor=(spec, *tensor)))
    if not is_comm.any():
        return kf
    cf = frame[is_comm].copy()
    for k, v in spec.columns().items():
        cf[k] = v
    cf["kernel_class"] = "comm"
    peers = cf["peers"].to_numpy(float)
    nbytes = cf["bytes"].to_numpy(float)
    ms = np.where(cf["op"].to_numpy() == "allreduce",
                  [float(link.allreduce_ms(b, int(p))) for b, p in zip(nbytes, peers)],
                  link.p2p_ms(nbytes))
    cf["pred_ms"] = ms
    out = pd.concat([kf.assign(_o=np.flatnonzero(~is_comm)),
                     cf.assign(_o=np.flatnonzero(is_comm))])
    return out.sort_values("_o").drop(columns="_o").reset_index(drop=True)


@dataclass(frozen=True)
class _Run:
    """What every strategy's step needs: the model and shape, the GPU, predictor and link."""

    model: object
    seq: int
    mode: str
    data: object
    fused: bool
    info: dict
    spec: object
    pred: object
    link: LinkSpec
    launch_us: float | None
    dtype: str = "fp32"
    tensor: tuple | None = None   # the 16-bit (GEMM, attention) predictors

    def trace(self, batch: int) -> pd.DataFrame:
        return traced(self.model, batch, self.seq, self.mode, self.data, dtype=self.dtype)

    def prep(self, trace: pd.DataFrame) -> pd.DataFrame:
        """The trace as the step runs it: fused when asked."""
        return fuse(trace, prologues=True) if self.fused else trace

    def predict(self, trace: pd.DataFrame) -> pd.DataFrame:
        return _predict_rows(trace, self.spec, self.pred, self.link, self.launch_us, self.data,
                             self.tensor)


def _dp_step(run: _Run, batch: int, n: int) -> tuple[pd.DataFrame, dict, dict]:
    """(frame, schedule, description) of one of ``n`` data-parallel GPUs (also one GPU)."""
    tr = run.prep(run.trace(batch // n))
    frame = run.predict(tr.assign(peers=np.nan))
    params = run.info["param_bytes"] if run.mode == "train" else {}
    sched = dp_schedule(frame, n, run.link, params)
    frame = gradient_rows(frame, sched["buckets"], n)
    return frame, sched, dict(kind="dp", degree=n, per_gpu_batch=batch // n,
                              **{k: sched[k] for k in ("finish_ms", "exposed_comm_ms",
                                                       "buckets")})


def _tp_step(run: _Run, batch: int, n: int,
             vocab_parallel: bool) -> tuple[pd.DataFrame, dict, dict]:
    """(frame, schedule, description) of one of ``n`` tensor-parallel GPUs."""
    tr = run.trace(batch)
    tr = run.prep(shard_tensor_parallel(tr, n, run.info, vocab_parallel))
    frame = run.predict(tr)
    return frame, tp_schedule(frame), dict(kind="tp", degree=n,
                                           vocab_parallel=bool(vocab_parallel),
                                           allreduces=int((frame["cls"] == "comm").sum()))


def _pp_step(run: _Run, batch: int, n: int,
             microbatches: int) -> tuple[pd.DataFrame, dict, dict]:
    """(frame of one micro-batch on every stage, schedule, description) of an ``n``-stage
    pipeline."""
    mb = batch // microbatches
    tr = run.trace(mb)
    tr = run.prep(tr.assign(stage=pipeline_stages(tr, n, run.info["layers"])))
    act = float(sizes.BYTES_PER_ELEM * mb * run.seq * run.info["hidden"])
    frame = run.predict(insert_transfers(tr, n, act))
    sched = pp_schedule(frame, n, microbatches, float(run.link.p2p_ms(act)))
    return frame, sched, dict(kind="pp", degree=n, microbatches=int(microbatches),
                              microbatch_size=mb, activation_bytes=act,
                              **{k: sched[k] for k in ("stage_fw_ms", "stage_bw_ms",
                                                       "transfer_ms")})


def predict_parallel(gpu, model, step: Step, parallel: Parallel, predictor="nslib", *,
                     tensor_predictor="nslib", launch_us: float | None = LAUNCH_US,
                     settings: Settings | None = None):
    """One step on the GPUs of ``parallel`` (a :class:`nslib.model.step.Parallel`: ``dp``,
    ``tp`` or ``pp`` GPUs, micro-batches, link): ``(frame, summary)`` as
    :func:`nslib.model.predict.predict_model` (which calls this when a degree is set).

    ``step.batch`` is the global batch. The frame is what one GPU runs (for PP: one micro-batch
    on every stage, with a ``stage`` column), comm rows included, and the summary's
    ``per_class_ms`` is the frame's (PP: one micro-batch); the summary's ``e2e_ms`` is the
    step time of the strategy's schedule, ``fw_ms``/``bw_ms`` its forward and backward
    parts, ``comm_ms`` the communication time, ``parallel`` the strategy, link and schedule.
    ``launch_us`` as in :func:`nslib.model.predict.predict_model`. ``step.dtype``
    ``bf16``/``fp16`` (tensor parallel inference only, for now): the 16-bit trace sharded, its
    tensor-core kernels priced by ``tensor_predictor`` and its all-reduces at 2 bytes per
    element. ``settings``: the data and training profile.
    """
    step, par, s = step_of(step), parallel_of(parallel), settings_of(settings)
    data, batch, dtype = s.data, step.batch, step.dtype
    dp, tp, pp = par.dp, par.tp, par.pp
    spec = resolve_gpu(gpu, data)
    spec_path = spec_path_of(gpu)
    # the degrees the config alone can refuse, before the model is built
    check_degrees(config_heads(load_model_config(model, data)), batch, dp, tp, pp,
                  par.microbatches)
    info = model_info(model, step.mode, data)
    check_degrees(info, batch, dp, tp, pp, par.microbatches)
    lk = resolve_link(par.link, spec, data, spec_path)
    pred = get_predictor(predictor, data, s.quick)
    tensor = None
    if dtype != "fp32":
        if step.mode != "inf" or dp > 1 or pp > 1 or step.fused:
            raise ValueError(f"--dtype {dtype} on several GPUs is tensor-parallel inference "
                             "for now: use --tp with --mode inf (no --dp, --pp, --fused), or "
                             "--dtype fp32")
        datasheet_columns(spec)
        tensor = (tensor_predictors(tensor_predictor, s.quick)
                  if isinstance(tensor_predictor, str) else tuple(tensor_predictor))
    run = _Run(model, step.seq, step.mode, data, step.fused, info, spec, pred, lk, launch_us,
               dtype, tensor)
    if dp > 1 or (tp == 1 and pp == 1):
        frame, sched, kind = _dp_step(run, batch, dp)
    elif tp > 1:
        frame, sched, kind = _tp_step(run, batch, tp, par.vocab_parallel)
    else:
        frame, sched, kind = _pp_step(run, batch, pp, par.microbatches)
    fused = step.fused
    desc = {"link": lk.to_dict(), "fused": bool(fused), "global_batch": int(batch), **kind}
    summary = {"e2e_ms": float(sched["e2e_ms"]), "fw_ms": float(sched["fw_ms"]),
               "bw_ms": float(sched["bw_ms"]), "per_class_ms": per_class_ms(frame),
               "n_kernels": int((frame["cls"] != "comm").sum()),
               "comm_ms": float(sched["comm_ms"]), "parallel": desc, "launch_us": launch_us}
    return frame, summary
