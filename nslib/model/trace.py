"""Trace a HuggingFace model config into the GPU kernels it launches (method.md section 5.1).

The model is built from its config on the ``meta`` device (no weights, no memory), FP32, with
eager attention, and every aten op it runs is recorded with a ``TorchDispatchMode``: the
forward pass (``mode="inf"``: eval mode, under ``no_grad``) or the forward and the backward
pass of a scalar loss (``mode="train"``: train mode, as the measured training runs). Each aten
op that launches a kernel becomes one row of a frame (see :func:`trace`); views and other
metadata-only ops cost nothing and give no row. The whole model is traced (every layer), which
takes well under a second for the paper's models, so nothing is replicated.

Training: the loss is the sum of the model's logits outputs (one reduction kernel, phase
``fw``), so the backward starts from a ones gradient; a real loss would add a few vector
kernels over the logits, small next to the LM head GEMMs. Gradient accumulation: the original
opgraph's ``AccOps`` add each parameter's gradient into an existing ``.grad`` (training steps
without zeroing the gradients); ``grad_accumulation=True`` (default) pre-sets ``.grad`` so
autograd's accumulation ``add_`` kernels are traced (phase ``bw``, op ``add``). Tied weights
(GPT-2's embedding and LM head) are summed by autograd inside the backward, also a ``bw`` add.
The optimizer step is not traced (the measurements exclude it).

Inputs are built from the config (:func:`trace`): token ids, Whisper's log-mel features or
ViT's images. Convolutions (their stems) are mapped to the implicit GEMM cuDNN runs:
``linear (batch * output positions, in channels * kernel size, out channels)``.

The parts: :mod:`~nslib.model.config` builds the model, :mod:`~nslib.model.blocks` finds its
transformer blocks and hooks its modules, :mod:`~nslib.model.moe` fixes the expert routing,
:mod:`~nslib.model.recorder` records the aten ops, which :mod:`~nslib.model.aten` and
:mod:`~nslib.model.kernel_rows` map to kernel rows and :mod:`~nslib.model.storages` follows
through storages; 16-bit attention is :mod:`~nslib.model.sdpa_trace`'s.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from functools import lru_cache

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.model.aten import tensors_in
from nslib.model.blocks import block_index, check_layers, install_hooks
from nslib.model.config import (MEASURED_ARCHITECTURE, SUPPORTED_MODEL_TYPES, build_model,
                                check_seq, hf_config, load_model_config, position_limits)
from nslib.model.moe import expert_tokens, patch_moe
from nslib.model.recorder import TRACE_COLUMNS, Tracer, make_modes
from nslib.model.sdpa_trace import ATTENTION_COLUMNS, sdpa_mode
from nslib.model.step import Step, step_of
from nslib.model.storages import MEMORY_COLUMNS

__all__ = ["trace", "summarize", "logits_loss", "model_notes", "warn_model_notes",
           "ModelNoteWarning", "TRACE_VERSION", "TRACE_COLUMNS", "MEMORY_COLUMNS",
           "ATTENTION_COLUMNS"]

# Bump when the rows trace() produces change, so caches of traces can key on it.
TRACE_VERSION = 14


def mark_storages(tracer: Tracer, model, inputs) -> None:
    """Tell the tracer which storages live for the whole step (parameters, buffers, gradients)
    and which the caller holds (``inputs``, a dict or list of tensors), for the memory
    columns."""
    params = list(model.parameters())
    tracer.mark([p for p in params if p.requires_grad], "trainable")
    tracer.mark([p for p in params if not p.requires_grad], "param")
    tracer.mark(list(model.buffers()), "param")
    tracer.mark([p.grad for p in params if p.grad is not None], "grad")
    tracer.mark(list(inputs.values()) if isinstance(inputs, dict) else list(inputs), "held")

def _vision(hf, name: str):
    """A vision setting of the config, or of its ``vision_config`` (CLIP-style models)."""
    v = getattr(hf, name, None)
    return v if v is not None else getattr(getattr(hf, "vision_config", None), name, None)


def _image_size(hf, arch: str) -> tuple[int, int]:
    size = _vision(hf, "image_size")
    if isinstance(size, int) and size > 0:
        return size, size
    if isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) and v > 0
                                                                   for v in size):
        return int(size[0]), int(size[1])
    raise ValueError(f"{arch} takes images, but its config has no usable image_size (got "
                     f"{size!r}): add image_size (pixels) to the config")


class ModelNoteWarning(UserWarning):
    """What a prediction of this model leaves out or ignores (:func:`model_notes`)."""


def model_notes(config: dict, seq: int) -> list[str]:
    """Notes on tracing ``config`` at ``seq``, from the config alone (so a cached trace still
    gives them): a model type outside :data:`SUPPORTED_MODEL_TYPES` (its kernels unchecked), and
    a vision model whose image, not ``seq``, sets the sequence."""
    if not isinstance(config, dict):
        config = load_model_config(config)
    return list(_notes(json.dumps(config, sort_keys=True), int(seq)))


@lru_cache(maxsize=256)
def _notes(config_json: str, seq: int) -> tuple[str, ...]:
    config = json.loads(config_json)
    kind = config.get("model_type")
    notes = []
    if kind not in SUPPORTED_MODEL_TYPES:
        notes.append(f"model_type {kind!r} is not among the families nslib has checked "
                     f"({', '.join(SUPPORTED_MODEL_TYPES)}): its kernels are traced as they run "
                     f"in eager PyTorch, but kernels of layers nslib does not model (recurrent "
                     f"scans, custom CUDA ops) may be missing or mispriced")
    if not _takes_images(config):
        return tuple(notes)
    hf = hf_config(config)   # only vision configs pay for transformers (the fast path does not)
    if _vision(hf, "image_size") is not None:
        h, w = _image_size(hf, kind)
        patch = _vision(hf, "patch_size")
        if isinstance(patch, int) and patch > 0 and seq != (h // patch) * (w // patch) + 1:
            notes.append(f"{kind}: the sequence is set by the image ({h}x{w} pixels, patches "
                         f"of {patch}: {(h // patch) * (w // patch) + 1} tokens with the class "
                         f"token); seq={seq} is not used")
    return tuple(notes)


def _takes_images(config: dict) -> bool:
    """Whether a config dict is a vision model's (an image size, a vision sub-config, or a
    type whose name says so), without building it."""
    kind = str(config.get("model_type", ""))
    return ("image_size" in config or "vision_config" in config
            or any(w in kind for w in ("vit", "vision", "swin", "deit", "beit", "convnext")))


def warn_model_notes(config: dict, seq: int, stacklevel: int = 3) -> list[str]:
    """:func:`model_notes`, each also issued as a :class:`ModelNoteWarning`."""
    notes = model_notes(config, seq)
    for n in notes:
        warnings.warn(n, ModelNoteWarning, stacklevel=stacklevel)
    return notes


def _float_dtype(model):
    """The floating-point format of the model's parameters (its inputs are built in it)."""
    import torch
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _model_inputs(hf, model, batch: int, seq: int) -> dict:
    """Meta inputs of the shape the model's main input needs (see :func:`trace`)."""
    import torch

    arch = type(model).__name__
    main = getattr(model, "main_input_name", "input_ids")
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    if main == "input_ids":
        inputs = {"input_ids": ids}
    elif main == "input_features":
        mels, frames = getattr(hf, "num_mel_bins", None), getattr(hf, "max_source_positions", None)
        if not (isinstance(mels, int) and isinstance(frames, int) and mels > 0 and frames > 0):
            raise ValueError(f"{arch} takes audio features, but nslib builds them only from "
                             f"Whisper-style num_mel_bins and max_source_positions, which this "
                             f"config lacks: not supported")
        # the two stride-1/stride-2 convolutions halve the frames to max_source_positions
        inputs = {"input_features": torch.zeros(batch, mels, 2 * frames, device="meta",
                                                dtype=_float_dtype(model))}
    elif main == "pixel_values":
        h, w = _image_size(hf, arch)
        channels = int(_vision(hf, "num_channels") or 3)
        inputs = {"pixel_values": torch.zeros(batch, channels, h, w, device="meta",
                                              dtype=_float_dtype(model))}
    else:
        raise ValueError(f"{arch} takes {main!r} as its input, which nslib cannot build (it "
                         f"builds token ids, Whisper-style audio features and images): not "
                         f"supported")
    if getattr(hf, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    return inputs


def logits_loss(output):
    """The scalar a training trace backpropagates: the sum of the model's logits outputs (of
    its first floating output that needs a gradient when it has no logits)."""
    import torch

    items = output.items() if hasattr(output, "items") else [("logits", output)]
    parts = [v for k, v in items if isinstance(v, torch.Tensor) and k.endswith("logits")
             and "router" not in k and v.is_floating_point()]
    if not parts:
        parts = [v for _, v in items if isinstance(v, torch.Tensor) and v.is_floating_point()
                 and v.requires_grad][:1]
    if not parts:
        raise ValueError("the model returned no floating-point output to take a loss of")
    loss = parts[0].sum()
    for p in parts[1:]:
        loss = loss + p.sum()
    return loss


def trace(config: dict, step: Step, *, grad_accumulation: bool = True,
          architecture: str | None = None, notes: bool = True) -> pd.DataFrame:
    """The kernels one step (a :class:`nslib.model.step.Step`: ``batch``, ``seq``, ``mode``,
    ``dtype``, ``imbalance``) launches: a forward (mode ``inf``) or forward + backward
    (``train``). The step's ``fused`` is not the tracer's (:func:`nslib.model.fusion.fuse`).

    ``config``: a HuggingFace config dict (or a name/path for :func:`load_model_config`).
    Inputs are built from the config: token ids of shape ``(batch, seq)`` (and decoder ids of
    the same shape for encoder-decoder models); for speech models (Whisper) log-mel features of
    shape ``(batch, num_mel_bins, 2 * max_source_positions)`` (the encoder's fixed 30 s
    window) and decoder ids ``(batch, seq)``; for vision models (ViT) images of shape
    ``(batch, num_channels, image_size, image_size)``, whose patch count sets the sequence
    (``seq`` is then unused). ``notes``: issue :func:`model_notes` as warnings (an unchecked
    model type, an unused ``seq``). ``step.imbalance``: the routing of
    top-k mixture-of-experts layers (:func:`expert_tokens`; 1 = balanced). ``grad_accumulation``:
    trace the add of each parameter gradient into an existing ``.grad`` (as the measured runs and
    the original opgraph). ``architecture``: a transformers class name to build instead of the
    default: the model the measurements ran (:data:`MEASURED_ARCHITECTURE`, e.g. BERT inference is
    BertForSequenceClassification), else the pre-training model, else the causal LM, seq2seq LM,
    masked LM, base model.

    Returns a frame with one row per kernel, in launch order, columns :data:`TRACE_COLUMNS`:
    ``kid``, ``phase`` ("fw"/"bw"), ``aten``, ``cls`` (a class of :mod:`nslib.kernels.sizes` or
    "memory"), ``op``, dims ``B, M, N, K, H`` (float, NaN where the class has none), ``flops``,
    ``bytes`` (FP32 for the measured classes; memory rows count the bytes they read and write
    at their real dtypes), ``inputs`` (sorted tuple of the kids that produced this kernel's
    tensor inputs, followed through views; () for model inputs and parameters), ``layer``
    (transformer block index, encoder blocks then decoder blocks, or -1 outside the blocks)
    ``module`` (qualified name of the innermost module running it, or "") and ``call`` (index of
    the top-level PyTorch operator call that launched it; in the backward, of the forward call
    whose gradient it computes; -1 for none: :mod:`nslib.model.operators`). Unknown aten ops
    give no row and one warning listing them.

    ``step.dtype``: ``"fp32"`` (the paper's traces, eager attention) or ``"bf16"``/``"fp16"``:
    the model is built in that format with PyTorch's scaled-dot-product attention, each call of
    which is one row of class ``"attention"`` (:mod:`nslib.model.sdpa_trace`; the frame then ends
    with its :data:`ATTENTION_COLUMNS`, NaN on other rows), and ``bytes`` count every kernel's real
    element size (2 bytes, 4 for what the model keeps in FP32). Raises ValueError for bad arguments
    or a config transformers cannot build, with zero layers, or of an architecture the tracer does
    not support (naming it and what is missing).
    """
    from transformers.utils import logging as hf_logging

    step = step_of(step)
    batch, seq, mode, imbalance, dtype = (step.batch, step.seq, step.mode, step.imbalance,
                                          step.dtype)
    if not isinstance(config, dict):
        config = load_model_config(config)
    if architecture is None:
        architecture = MEASURED_ARCHITECTURE.get((config.get("model_type"), mode))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' notes about meta tensors, token ids...
    try:
        frame = _trace(config, batch, seq, mode, grad_accumulation, architecture, imbalance,
                       dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
    if notes:  # once the model built: a config that fails needs its error, not notes
        warn_model_notes(config, seq)
    return frame


def _trace(config, batch, seq, mode, grad_accumulation, architecture, imbalance,
           dtype="fp32") -> pd.DataFrame:
    import torch

    expert_tokens(1, 1, 1, imbalance)  # validates imbalance before the (slower) build
    hf, model = build_model(config, architecture, dtype)
    arch = type(model).__name__
    check_seq(position_limits(hf), seq)
    train = mode == "train"
    model.train(train)
    block_of = block_index(model)
    check_layers(hf, block_of, arch)
    patch_moe(model, imbalance, arch)
    tracer = Tracer(model, block_of, half=dtype != "fp32")
    recorder, calls = make_modes(tracer, redirect_dropout=train)
    attention = sdpa_mode(tracer) if tracer.half else contextlib.nullcontext()
    inputs = _model_inputs(hf, model, batch, seq)
    if train and grad_accumulation:
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
    mark_storages(tracer, model, inputs)

    handles = install_hooks(model, tracer)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' own chatter about meta/eager/etc.
            try:
                if train:
                    with attention, recorder, calls:
                        out = model(**inputs)
                        tracer.mark(tensors_in(out, []), "held")
                        loss = logits_loss(out)
                        tracer.phase = "bw"
                        tracer.fw_stack.clear()
                        loss.backward()
                else:
                    with torch.no_grad(), attention, recorder, calls:
                        tracer.mark(tensors_in(model(**inputs), []), "held")
            except (ValueError, RuntimeError, IndexError, TypeError, NotImplementedError,
                    AttributeError, KeyError) as e:
                raise _trace_error(e, arch, hf.model_type, model, tracer) from None
    finally:
        tracer.closed = True
        for h in handles:
            h.remove()
    if tracer.unknown:
        listing = ", ".join(f"{k} x{v}" for k, v in sorted(tracer.unknown.items()))
        warnings.warn(f"nslib.model.trace.trace: {len(tracer.unknown)} aten op(s) have no kernel "
                      f"mapping and were left out of the trace: {listing}", stacklevel=3)
    return tracer.frame()


def _trace_error(e: Exception, arch: str, model_type: str, model, tracer) -> ValueError:
    """The error of a failed forward/backward: the architecture, the module and the cause."""
    where = tracer.current_module()
    mod = dict(model.named_modules()).get(where) if where else None
    place = f" in {where} ({type(mod).__name__})" if mod is not None else ""
    cause = str(e).splitlines()[0] if str(e) else ""
    if "overflow" in cause:   # sizes a tensor cannot count (batch x tokens x width > 2**63)
        return ValueError(f"tracing {arch}: a tensor of this step would be too large to exist "
                          f"({cause}); use a smaller batch or sequence length")
    return ValueError(f"tracing {arch} (model_type {model_type!r}) failed{place}: "
                      f"{type(e).__name__}: {cause}. nslib traces the families in the README's "
                      f"'Supported models' table; a module that needs data-dependent shapes or "
                      f"inputs other than token ids, audio features or images is not supported. "
                      f"If the config was edited by hand, check that its sizes are consistent")


# --------------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------------

def summarize(trace_frame: pd.DataFrame) -> pd.DataFrame:
    """Kernel count, GEMM FLOPs, all FLOPs and bytes per (phase, cls)."""
    df = trace_frame
    gemm = df["cls"].isin(sizes.GEMM_CLASSES)
    g = df.assign(gemm_flops=np.where(gemm, df["flops"], 0.0)).groupby(
        ["phase", "cls"], sort=True)
    out = pd.DataFrame({
        "kernels": g.size(),
        "gemm_flops": g["gemm_flops"].sum(),
        "flops": g["flops"].sum(),
        "bytes": g["bytes"].sum(),
    })
    order = {"fw": 0, "bw": 1}
    out = out.reset_index()
    out["_o"] = out["phase"].map(order).fillna(2)
    return out.sort_values(["_o", "cls"]).drop(columns="_o").reset_index(drop=True)
