"""Trace a HuggingFace model config into the GPU kernels it launches (method.md section 5.1).

The model is built from its config on the ``meta`` device (no weights, no memory), FP32, with
eager attention, and every aten op it runs is recorded with a ``TorchDispatchMode``: the
forward pass (``mode="inf"``: eval mode, under ``no_grad``) or the forward and the backward
pass of a scalar loss (``mode="train"``: train mode, as the measured training runs). Each aten
op that launches a kernel becomes one row of a frame (see :func:`trace`); views and other
metadata-only ops cost nothing and give no row. The whole model is traced (every layer), which
takes well under a second for the paper's models, so nothing is replicated.

Mapping choices (what a CUDA build of PyTorch 2.1 launches for these ops):

- GEMMs: ``mm``/``addmm`` -> ``linear`` ``(B=1, M, N, K)`` from ``(M x N) @ (N x K)``;
  ``bmm``/``baddbmm`` -> ``bmm`` ``(B, M, N, K)``. The bias of ``addmm`` is folded into the
  GEMM (as the original NeuSight opgraph does); backward GEMMs (input and weight gradients)
  are plain ``mm``/``bmm`` rows.
- Elementwise: each op maps to the nearest measured op of :data:`nslib.kernels.sizes.OPS`: the
  binary form (``add``, ``mul``, ``div``, ``pow``) when two device tensors are read, the
  tensor-scalar form (``addu``, ...) when the other operand is a Python number or a 0-dim CPU
  tensor (which CUDA passes as a kernel argument). ``sub`` -> add, ``rsub`` -> add/addu,
  ``neg``/``reciprocal``/``abs``/``clamp`` -> mulu/divu/addu, transcendental unary ops
  (``exp``, ``sigmoid``, ``rsqrt``, ``erf``, ...) -> ``tanh``. Backward elementwise ops
  (``gelu_backward``, ``tanh_backward``, ``threshold_backward``, ``native_dropout_backward``,
  ...) read the incoming gradient and one saved tensor and write one output: ``mul``.
  ``(B, H) = (numel / last_dim, last_dim)`` of the output, the flattening the original opgraph
  records (``VECadd (4096, 1280)`` for a ``(4, 1024, 1280)`` tensor); the measured kernels are
  flat, so only ``B * H`` matters to them.
- Softmax and its backward: ``softmax`` ``(B = rows, H = softmax dim)``.
- LayerNorm: forward -> ``ln`` ``(rows, normalized size)``. Backward: the original opgraph
  records it as a ``VECmul`` of the same shape; CUDA launches a row-wise kernel for the input
  gradient (structurally the ``ln`` kernel: one row per block, a reduction over H) plus a
  column reduction for the weight and bias gradients. We emit an ``ln`` row for the input
  gradient and a ``memory`` row (reads the gradient and the input, writes 2*H) for
  d(gamma), d(beta).
- Dropout (train mode): on CUDA ``F.dropout`` with ``0 < p < 1`` runs the fused
  ``native_dropout`` kernel (one kernel writing the output and a bool mask) and its backward
  one masked-scale kernel, while the CPU/meta path decomposes into ``bernoulli_``, ``div_``,
  ``mul``. The tracer redirects ``F.dropout`` to ``native_dropout`` (a ``TorchFunctionMode``)
  so the trace holds what the GPU runs: ``native_dropout`` -> ``memory`` (the original
  opgraph also records dropout as MEM), ``native_dropout_backward`` -> elementwise ``mul``.
  ``p == 0`` (OPT's attention and activation dropout) launches nothing, as on CUDA; in
  inference dropout is the identity.
- Memory: copies, ``clone``/``contiguous``/``_to_copy``, ``cat``, gathers and scatters
  (``embedding``, ``index_select``, ``index``, ``gather``, ``index_add_``, ``index_put_``...),
  ``where``, ``masked_fill``, comparisons and logical ops (mask building), reductions
  (``sum``, ``mean``, ``max``, ``argmax``, ``cumsum``; e.g. bias gradients), fills
  (``zeros``, ``ones_like``, ``fill_``; they launch a fill kernel), RNG fills and
  ``native_dropout`` -> ``memory``, ``op="mem"``, ``B = 1``, ``H`` = elements written,
  ``bytes`` = bytes read + written at their real dtypes (gathers read only the rows they
  gather; ``embedding_dense_backward`` reads the gradient and writes the table gradient).
- No row: views, reshapes, permutes, transposes, ``expand``, ``t``, ``detach``, ``alias``,
  size queries, ``empty*`` allocations and ops on zero-element tensors.
- Anything else: collected and reported in one ``warnings.warn`` with counts (no row).

Training: the loss is the sum of the model's logits outputs (one reduction kernel, phase
``fw``), so the backward starts from a ones gradient; a real loss would add a few vector
kernels over the logits, small next to the LM head GEMMs. Gradient accumulation: the original
opgraph's ``AccOps`` add each parameter's gradient into an existing ``.grad`` (training steps
without zeroing the gradients); ``grad_accumulation=True`` (default) pre-sets ``.grad`` so
autograd's accumulation ``add_`` kernels are traced (phase ``bw``, op ``add``). Tied weights
(GPT-2's embedding and LM head) are summed by autograd inside the backward, also a ``bw`` add.
The optimizer step is not traced (the measurements exclude it).

Mixture of experts (Switch Transformer): routing is data-dependent, which meta tensors cannot
run, so each sparse MLP is replaced (on the traced instance only) by a fixed-capacity version as
in the measured runs: router linear + softmax + argmax, then each of the ``num_experts`` experts
processes ``expert_capacity`` tokens per batch row (the original opgraph shows
``Linear (64*batch, 1024, 16384)`` per expert): a gather of that token block, the expert's
MLP, a scale by the router probability and a scatter-add back. Top-k mixture of experts
(Mixtral, Qwen2-MoE, DeepSeek-V2/V3: experts stored as 3-D ``gate_up_proj``/``down_proj``):
the router runs as written (GEMM, softmax, top-k); the experts module is replaced by the eager
per-expert loop of transformers with a fixed routing, :func:`expert_tokens` tokens per expert
(balanced by default, ``imbalance`` skews it); shared experts run as written.

Inputs are built from the config (:func:`trace`): token ids, Whisper's log-mel features or
ViT's images. Convolutions (their stems) are mapped to the implicit GEMM cuDNN runs:
``linear (batch * output positions, in channels * kernel size, out channels)``.
"""
from __future__ import annotations

import copy
import json
import math
import os
import types
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.kernels.dtypes import TORCH_NAMES, check_dtype
from nslib.data.paths import data_root
from nslib.model.sdpa_trace import ATTENTION_COLUMNS, sdpa_mode

__all__ = ["load_model_config", "trace", "summarize", "expert_tokens", "TRACE_COLUMNS",
           "TRACE_VERSION", "MEASURED_ARCHITECTURE", "MEMORY_COLUMNS", "ATTENTION_COLUMNS"]

# Bump when the rows trace() produces change, so caches of traces can key on it.
TRACE_VERSION = 5

TRACE_COLUMNS = ("kid", "phase", "aten", "cls", "op", "B", "M", "N", "K", "H", "flops", "bytes",
                 "inputs", "layer", "module")

# Storage lifetimes, appended to every trace for nslib.model.memory: ``allocs`` (tuple of the bytes of
# each storage this kernel is the first to touch: allocated just before it runs), ``frees`` (for
# each of them the kid of the last kernel launched before PyTorch freed it, as reference
# counting on the meta device tells; -1 for those alive at the end of the step: inputs,
# outputs the caller holds), ``params`` (bytes of the
# parameters and buffers this kernel is the first to read; those no kernel reads go on the
# first row) and ``trainable`` (the part of ``params`` that gets a gradient). Parameters and
# pre-set gradients are not in ``allocs``: they live for the whole step.
MEMORY_COLUMNS = ("allocs", "frees", "params", "trainable")

CONFIG_DIR = Path("data") / "DLmodel_configs"


# --------------------------------------------------------------------------------------------
# Config loading
# --------------------------------------------------------------------------------------------

def load_model_config(name_or_path: str | os.PathLike | dict, data=None) -> dict:
    """A model config as a dict.

    ``name_or_path`` is a dict (returned as a copy), a path to a JSON file, or a name like
    ``gpt3_27`` resolved to ``<data_root>/data/DLmodel_configs/gpt3_27.json`` (see
    :func:`nslib.data.paths.data_root`). Raises FileNotFoundError for a missing file and ValueError
    for malformed JSON, both naming the file and the fix.
    """
    if isinstance(name_or_path, dict):
        return copy.deepcopy(name_or_path)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model config must be a name, a path to a JSON file or a dict, "
                        f"not {type(name_or_path).__name__}")
    raw = os.fspath(name_or_path)
    as_path = Path(raw).expanduser()
    if as_path.suffix == ".json" or os.sep in raw or "/" in raw or as_path.is_file():
        path = as_path
        if not path.is_file():
            raise FileNotFoundError(f"model config file {path} does not exist: pass an existing "
                                    f"HuggingFace config JSON, or a config name")
    else:
        folder = data_root(data) / CONFIG_DIR
        path = folder / f"{raw}.json"
        if not path.is_file():
            known = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
            raise FileNotFoundError(f"no model config named {raw!r}: {path} does not exist. "
                                    f"Known names: {known}; or pass a path to a config JSON")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {path} is not valid JSON ({e.msg} at line {e.lineno}, "
                         f"column {e.colno}): fix the file") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model config {path} must hold a JSON object (a HuggingFace config), "
                         f"not a {type(cfg).__name__}: fix the file")
    return cfg


# --------------------------------------------------------------------------------------------
# Building the model on meta
# --------------------------------------------------------------------------------------------

def _hf_config(config: dict):
    from transformers import AutoConfig

    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise ValueError("model config has no 'model_type': add the HuggingFace model type "
                         "(e.g. \"gpt2\", \"bert\", \"opt\", \"switch_transformers\")")
    for k in ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        cfg.pop(k, None)
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"unknown model_type {model_type!r}: transformers has no such model "
                         f"(known types are the keys of transformers.CONFIG_MAPPING, e.g. "
                         f"'gpt2', 'bert', 'opt', 'switch_transformers'); fix the config")
    try:
        hf = AutoConfig.for_model(model_type, **cfg)
    except Exception as e:  # noqa: BLE001 - field validation errors of many kinds
        msg = str(e).strip().replace("\n", " ")
        raise ValueError(f"transformers rejects the {model_type!r} config ({msg}): fix the "
                         f"config") from None
    hf.use_cache = False
    return hf


# The models the NeuSight measurements ran, read from the node names of the original opgraphs
# (results/opgraph): BERT inference is a sequence classifier (pooler + 2-way classifier),
# BERT training the pre-training model (pooler + MLM + NSP heads).
MEASURED_ARCHITECTURE = {
    ("bert", "inf"): "BertForSequenceClassification",
    ("bert", "train"): "BertForPreTraining",
}


def _model_classes(hf_config, architecture: str | None):
    import transformers
    from transformers import (AutoModel, AutoModelForCausalLM, AutoModelForImageClassification,
                              AutoModelForMaskedLM, AutoModelForPreTraining,
                              AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq)

    if architecture:
        cls = getattr(transformers, architecture, None)
        if cls is None:
            raise ValueError(f"transformers has no model class {architecture!r}: pass a class "
                             f"name like 'GPT2LMHeadModel', or architecture=None")
        return [cls]
    # The original NeuSight graphs are those of the pre-training models (BERT: pooler + MLM +
    # NSP heads, i.e. BertForPreTraining; GPT-2: GPT2LMHeadModel; Switch: ForConditionalGeneration)
    # and of the causal LM where there is no pre-training class (OPT: OPTForCausalLM).
    # Speech models come before the causal LM (Whisper's causal LM is its decoder alone) and
    # vision models get their classifier rather than the bare encoder.
    return [AutoModelForPreTraining, AutoModelForSpeechSeq2Seq, AutoModelForCausalLM,
            AutoModelForSeq2SeqLM, AutoModelForMaskedLM, AutoModelForImageClassification,
            AutoModel]


def _build(config: dict, architecture: str | None, dtype: str = "fp32"):
    """(HF config, model on meta): FP32 with eager attention, or a 16-bit ``dtype`` with
    PyTorch's scaled-dot-product attention (FlashAttention on a GPU)."""
    import torch

    torch_dtype = getattr(torch, TORCH_NAMES[dtype])
    attn = "eager" if dtype == "fp32" else "sdpa"
    hf = _hf_config(config)
    model_type = hf.model_type
    errors = []
    for auto in _model_classes(hf, architecture):
        try:
            with torch.device("meta"):
                if hasattr(auto, "from_config"):
                    model = auto.from_config(hf, attn_implementation=attn, dtype=torch_dtype)
                else:  # a concrete class
                    model = auto._from_config(hf, attn_implementation=attn, dtype=torch_dtype)
            break
        except ValueError as e:
            msg = str(e)
            if "Unrecognized configuration class" in msg:
                errors.append(msg.splitlines()[0])
                continue
            raise ValueError(f"transformers cannot build a {model_type!r} model from this config: "
                             f"{msg.splitlines()[0] if msg else e!r}. Fix the config (sizes must "
                             f"be consistent, e.g. hidden size divisible by the head count)") from None
        except Exception as e:  # noqa: BLE001 - any build failure is a config problem to the user
            raise ValueError(f"transformers cannot build a {model_type!r} model from this config: "
                             f"{type(e).__name__}: {e}. Fix the config (sizes must be consistent, "
                             f"e.g. hidden size divisible by the head count)") from None
    else:
        raise ValueError(f"no model class for model_type {model_type!r} ({'; '.join(errors)}): "
                         f"pass architecture= with a transformers class name")
    if any(p.dtype != torch_dtype for p in model.parameters()):
        model = model.to(torch_dtype)
    return hf, model


# --------------------------------------------------------------------------------------------
# aten op -> kernel class
# --------------------------------------------------------------------------------------------

# views, metadata and allocations without data: no kernel
_NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "permute", "transpose",
    "t", "expand", "expand_as", "squeeze", "unsqueeze", "slice", "select", "split",
    "split_with_sizes", "unbind", "chunk", "narrow", "diagonal", "as_strided", "unfold",
    "detach", "alias", "lift_fresh", "lift", "_conj", "conj", "resolve_conj", "resolve_neg",
    "view_as_real", "view_as_complex", "_neg_view", "movedim", "numpy_T", "flatten",
    "unflatten", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size",
    "stride", "numel", "dim", "is_same_size", "is_nonzero", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "scalar_tensor", "_local_scalar_dense",
    "set_", "record_stream", "_has_compatible_shallow_copy_type", "result_type",
    "broadcast_tensors", "align_tensors", "contiguous",  # contiguous decomposes to clone
    "_assert_async", "_assert_tensor_metadata", "_functional_assert_async",
    "_make_dep_token", "lift_fresh_copy",
}

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_addmm_activation"}

# ops with a (binary, tensor-scalar) pair of measured names
_EW_PAIR = {
    "add": ("add", "addu"), "sub": ("add", "addu"), "rsub": ("add", "addu"),
    "mul": ("mul", "mulu"), "div": ("div", "divu"), "true_divide": ("div", "divu"),
    "floor_divide": ("div", "divu"), "remainder": ("div", "divu"), "fmod": ("div", "divu"),
    "pow": ("pow", "powu"), "float_power": ("pow", "powu"), "maximum": ("add", "addu"),
    "minimum": ("add", "addu"), "clamp": ("add", "addu"),
    "clamp_min": ("add", "addu"), "clamp_max": ("add", "addu"), "lerp": ("add", "addu"),
    "addcmul": ("mul", "mulu"), "addcdiv": ("div", "divu"), "xlogy": ("mul", "mulu"),
    "atan2": ("div", "divu"), "hypot": ("add", "addu"), "copysign": ("mul", "mulu"),
}
# ops with a fixed measured name
_EW_FIXED = {
    "tanh": "tanh", "relu": "relu", "gelu": "gelu", "hardtanh": "relu", "leaky_relu": "relu",
    "elu": "relu", "relu6": "relu", "hardsigmoid": "relu", "hardswish": "relu",
    "silu": "tanh", "mish": "tanh", "sigmoid": "tanh", "exp": "tanh", "exp2": "tanh",
    "expm1": "tanh", "log": "tanh", "log2": "tanh", "log10": "tanh", "log1p": "tanh",
    "sqrt": "tanh", "rsqrt": "tanh", "erf": "tanh", "erfc": "tanh", "erfinv": "tanh",
    "sin": "tanh", "cos": "tanh", "tan": "tanh", "atan": "tanh", "asin": "tanh",
    "acos": "tanh", "sinh": "tanh", "cosh": "tanh", "softplus": "tanh",
    "neg": "mulu", "abs": "mulu", "sign": "mulu", "sgn": "mulu", "reciprocal": "divu",
    "square": "powu", "floor": "addu", "ceil": "addu", "round": "addu", "trunc": "addu",
    "frac": "addu", "nan_to_num": "addu",
    # backward elementwise ops: gradient times a function of one saved tensor
    "gelu_backward": "mul", "tanh_backward": "mul", "threshold_backward": "mul",
    "sigmoid_backward": "mul", "silu_backward": "mul", "native_dropout_backward": "mul",
    "hardtanh_backward": "mul", "leaky_relu_backward": "mul", "elu_backward": "mul",
    "softplus_backward": "mul", "mish_backward": "mul", "hardswish_backward": "mul",
    "hardsigmoid_backward": "mul", "logit_backward": "mul", "threshold": "relu",
    "polar": "tanh",  # cos and sin of the rotary angles (DeepSeek-V2's complex rotary)
}
# convolutions (Whisper's audio stem, ViT's patch embedding): implicit GEMMs
_CONV = {"convolution", "convolution_backward"}
_SOFTMAX = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
            "softmax", "log_softmax"}
_LAYERNORM = {"native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
              "_fused_rms_norm_backward"}
# memory ops: (read spec) -- "all" reads every tensor input fully, "gather" reads the index
# and as many source elements as it writes, "write" reads nothing (fills)
_MEMORY = {
    **{k: "all" for k in (
        "clone", "_to_copy", "copy", "cat", "stack", "where", "masked_fill", "masked_scatter",
        "native_dropout", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
        "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not",
        "bitwise_xor", "__and__", "__or__", "__xor__", "__invert__", "isnan", "isinf",
        "isfinite", "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod",
        "var", "var_mean", "std", "std_mean", "norm", "linalg_vector_norm", "any", "all",
        "cumsum", "cumprod", "logsumexp", "count_nonzero", "sort", "topk", "flip", "roll",
        "tril", "triu", "constant_pad_nd", "repeat", "slice_backward", "select_backward",
        "slice_scatter", "select_scatter", "diagonal_backward", "as_strided_scatter",
        "tril_indices", "triu_indices", "_masked_softmax", "one_hot",
        "index_fill", "bucketize", "searchsorted", "unfold_backward", "expand_copy",
        "permute_copy", "transpose_copy", "view_copy", "t_copy", "_unsafe_index",
        "alias_copy", "detach_copy", "_reshape_copy", "repeat_interleave")},
    **{k: "gather" for k in (
        "embedding", "index_select", "index", "gather", "take", "take_along_dim")},
    **{k: "scatter" for k in (
        "index_add", "index_put", "_index_put_impl", "index_copy", "scatter", "scatter_add",
        "scatter_reduce")},
    **{k: "write" for k in (
        "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
        "new_ones", "new_full", "fill", "zero", "arange", "linspace", "range", "bernoulli",
        "uniform", "normal", "random", "rand", "randn", "rand_like", "randn_like", "randint",
        "exponential", "eye")},
    "embedding_dense_backward": "embedding_backward",
}


def _split_name(func) -> tuple[str, bool]:
    name = func.overloadpacket.__name__
    if name.endswith("_") and not name.endswith("__"):
        return name[:-1], True
    return name, False


def _tensors(obj, out: list):
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


def _rows_of(shape) -> tuple[float, float]:
    """(B, H) = (numel / last dim, last dim) of a shape; (1, 1) for a scalar."""
    if len(shape) == 0:
        return 1.0, 1.0
    h = int(shape[-1])
    n = math.prod(int(s) for s in shape)
    return (float(n // h) if h else 0.0), float(h)


def _nbytes(t) -> int:
    return int(t.numel()) * t.element_size()


# --------------------------------------------------------------------------------------------
# The recorder
# --------------------------------------------------------------------------------------------

class _Tracer:
    def __init__(self, model, block_of: dict, half: bool = False):
        # 16-bit traces: real element sizes, and the attention rows' extra columns
        self.half = half
        self.extra_cols = ATTENTION_COLUMNS if half else ()
        self.rows: dict[str, list] = {c: [] for c in TRACE_COLUMNS + self.extra_cols}
        self.writer: dict[int, tuple] = {}   # storage id -> kids that last wrote it
        self._keep: list = []                # storages of parameters, gradients, inputs
        self._refs: dict = {}                # storage id -> weakref reporting its death
        self.dead: list = []                 # [first kid, last kid, bytes] of freed storages
        self.closed = False                  # set after the step: later deaths are teardown
        self.unknown: Counter = Counter()
        self.phase = "fw"
        self.fw_stack: list[str] = []
        self.bw_stack: list[str] = []
        self.block_of = block_of
        self._layer_cache: dict[str, int] = {}
        self._func_info: dict = {}
        self.n = 0
        self.life: dict[int, list] = {}      # storage id -> [first kid, last kid, bytes]
        self.persist: dict[int, str] = {}    # storage id -> "param", "trainable" or "grad"
        self._storage_bytes: dict[int, int] = {}

    # --- module context --------------------------------------------------------------------
    def current_module(self) -> str:
        stack = self.bw_stack if self.phase == "bw" else self.fw_stack
        return stack[-1] if stack else ""

    def layer_of(self, name: str) -> int:
        hit = self._layer_cache.get(name)
        if hit is None:
            hit = -1
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                idx = self.block_of.get(".".join(parts[:i]))
                if idx is not None:
                    hit = idx
                    break
            self._layer_cache[name] = hit
        return hit

    # --- producers ---------------------------------------------------------------------------
    # A kernel's producers are the last writers of the storages its tensors live in: views,
    # reshapes and autograd's saved copies of a tensor share its storage, so this follows them
    # to the real producer; an in-place op becomes the new writer of the whole storage.
    @staticmethod
    def _storage(t):
        try:
            return t.untyped_storage()
        except Exception:  # noqa: BLE001 - tensors without storage (none expected)
            return None

    def producers(self, tensors) -> tuple:
        kids: set = set()
        writer = self.writer
        for t in tensors:
            st = self._storage(t)
            if st is not None:
                kids.update(writer.get(st._cdata, ()))
        return tuple(sorted(kids))

    def set_writer(self, tensors, kids: tuple):
        for t in tensors:
            st = self._storage(t)
            if st is not None:
                sid = st._cdata
                if sid not in self._refs:
                    self._watch(st)  # forget the id when the storage dies: it may be reused
                self.writer[sid] = kids

    # --- rows --------------------------------------------------------------------------------
    def elem(self, t) -> int:
        """Bytes per element a kernel on ``t`` is counted with: the FP32 constant of the
        measurements in an FP32 trace (today's rows, unchanged), ``t``'s own size in a 16-bit
        trace (FP32 islands such as the upcast inside RMSNorm stay 4 bytes)."""
        if not self.half or t is None or not t.is_floating_point():
            return sizes.BYTES_PER_ELEM
        return int(t.element_size())

    def add_row(self, aten, cls, op, dims, flops, nbytes, inputs, extra=None) -> int:
        kid = self.n
        self.n += 1
        mod = self.current_module()
        r = self.rows
        r["kid"].append(kid)
        r["phase"].append(self.phase)
        r["aten"].append(aten)
        r["cls"].append(cls)
        r["op"].append(op)
        for c, v in zip(("B", "M", "N", "K", "H"), dims):
            r[c].append(np.nan if v is None else float(v))
        r["flops"].append(flops)
        r["bytes"].append(nbytes)
        r["inputs"].append(tuple(k for k in inputs if k != kid))
        r["layer"].append(self.layer_of(mod) if mod else -1)
        r["module"].append(mod)
        for c in self.extra_cols:
            r[c].append(float((extra or {}).get(c, np.nan)))
        return kid

    def _info(self, func) -> tuple:
        """(base name, in-place?, aten name, handler kind) of an op, memoised per trace."""
        info = self._func_info.get(func)
        if info is None:
            base, inplace = _split_name(func)
            if base in _NO_KERNEL:
                kind = "none"
            elif base in _GEMM:
                kind = "gemm"
            elif base in _CONV:
                kind = "conv"
            elif base in _EW_FIXED or base in _EW_PAIR:
                kind = "ew"
            elif base in _SOFTMAX:
                kind = "softmax"
            elif base in _LAYERNORM:
                kind = "ln"
            elif base in _MEMORY:
                kind = "mem"
            else:
                kind = "unknown"
            info = (base, inplace, str(func), kind)
            self._func_info[func] = info
        return info

    # --- storage lifetimes (MEMORY_COLUMNS) ----------------------------------------------------
    def mark(self, tensors, kind: str):
        """Label the storages of ``tensors`` "param", "trainable" or "grad", or "held" (the
        caller holds them to the end of the step: inputs, outputs); all stay alive."""
        for t in tensors:
            st = self._storage(t)
            if st is None:
                continue
            if kind != "held":
                self.persist.setdefault(st._cdata, kind)
                self._storage_bytes[st._cdata] = int(st.nbytes())
            self._keep.append(st)

    def touch(self, tensors, kid: int):
        for t in tensors:
            st = self._storage(t)
            if st is None:
                continue
            if st._cdata not in self.life:
                self.life[st._cdata] = [kid, -1, int(st.nbytes())]
                if st._cdata not in self._refs:
                    self._watch(st)

    # Storages die when PyTorch frees them (the last tensor, view or autograd saved variable
    # using them is gone): the meta device follows the same reference counting as a GPU, so
    # the lifetimes are those of the real step, Python locals and saved tensors included.
    def _watch(self, st):
        import weakref

        sid = st._cdata
        self._refs[sid] = weakref.ref(st, lambda _r, sid=sid: self._died(sid))

    def _died(self, sid: int):
        self._refs.pop(sid, None)
        self.writer.pop(sid, None)
        life = self.life.pop(sid, None)
        if life is not None and not self.closed:
            life[1] = self.n - 1   # freed after the last kernel launched so far
            self.dead.append(life)

    def memory_frame(self) -> pd.DataFrame:
        n = self.n
        allocs: list[list] = [[] for _ in range(n)]
        frees: list[list] = [[] for _ in range(n)]
        params, trainable = np.zeros(n), np.zeros(n)
        for first, last, nb in self.dead:
            allocs[first].append(nb)
            frees[first].append(last)
        for sid, (first, last, nb) in self.life.items():   # alive at the end of the step
            kind = self.persist.get(sid)
            if kind is None:
                allocs[first].append(nb)
                frees[first].append(-1)
            elif kind != "grad":
                params[first] += nb
                trainable[first] += nb if kind == "trainable" else 0
        for sid, kind in self.persist.items():  # parameters no kernel reads
            if sid not in self.life and kind != "grad" and n:
                nb = int(self._storage_bytes.get(sid, 0))
                params[0] += nb
                trainable[0] += nb if kind == "trainable" else 0
        return pd.DataFrame({"allocs": [tuple(a) for a in allocs],
                             "frees": [tuple(f) for f in frees],
                             "params": params, "trainable": trainable})

    def record(self, func, args, kwargs, out):
        n0 = self.n
        self._record(func, args, kwargs, out)
        if self.n > n0:
            self.touch(_tensors((args, kwargs, out), []), self.n - 1)

    def _record(self, func, args, kwargs, out):
        base, inplace, aten, kind = self._info(func)
        if kind == "none":
            return
        ins = _tensors(args, [])
        if kwargs:
            _tensors(kwargs, ins)
        outs = _tensors(out, [])
        if inplace and not outs and ins:
            outs = [ins[0]]
        if not any(t.is_meta for t in outs) and not any(t.is_meta for t in ins):
            return  # host-side work (e.g. on Python scalars wrapped as CPU tensors): no kernel

        if kind == "gemm":
            self._gemm(base, aten, args, ins, outs)
            return
        if kind == "conv":
            self._conv(base, aten, args, ins, outs)
            return
        if outs and all(t.numel() == 0 for t in outs):
            return  # a kernel over no elements is not launched
        if kind == "ew":
            if base in _EW_FIXED:
                op = _EW_FIXED[base]
            else:
                dev = outs[0].device
                real = [t for t in ins if not (t.dim() == 0 and t.device != dev)]
                op = _EW_PAIR[base][0 if len(real) >= 2 else 1]
            B, H = _rows_of(outs[0].shape)
            self._vector(aten, "elementwise", op, B, H, ins, outs)
            return
        if kind == "softmax":
            # _softmax(x, dim, half_to_float), _softmax_backward_data(grad, out, dim, dtype)
            dim = next((a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)),
                       -1)
            shape = outs[0].shape
            H = int(shape[dim]) if len(shape) else 1
            B = outs[0].numel() // max(H, 1)
            # the backward reads the output and its gradient: 1.5x the forward's bytes
            op = "softmax_bw" if base.endswith("_backward_data") else "softmax"
            self._vector(aten, "softmax", op, B, H, ins, outs)
            return
        if kind == "ln":
            self._layernorm(base, aten, args, ins, outs)
            return
        if kind == "mem":
            self._memory(_MEMORY[base], base, inplace, aten, args, ins, outs)
            return
        # unknown: no row; its outputs inherit its inputs' producers
        self.unknown[aten] += 1
        self.set_writer(outs, self.producers(ins))

    def _vector(self, aten, cls, op, B, H, ins, outs):
        n_in, ops_per_o = sizes.OPS[op][1], sizes.OPS[op][2]
        flops = B * H * ops_per_o
        nbytes = B * H * self.elem(outs[0] if outs else None) * (n_in + 1)
        kid = self.add_row(aten, cls, op, (B, None, None, None, H), float(flops), float(nbytes),
                           self.producers(ins))
        self.set_writer(outs, (kid,))

    def _gemm(self, base, aten, args, ins, outs):
        if base in ("mm", "bmm", "dot", "mv"):
            a, b = args[0], args[1]
        else:  # addmm, baddbmm, addmv, _addmm_activation: (bias, a, b)
            a, b = args[1], args[2]
        if base in ("bmm", "baddbmm"):
            B, M, N = (int(s) for s in a.shape)
            K = int(b.shape[2])
            cls = "bmm"
        elif base in ("mv", "addmv"):
            B, (M, N), K, cls = 1, (int(s) for s in a.shape), 1, "linear"
        elif base == "dot":
            B, M, N, K, cls = 1, 1, int(a.shape[0]), 1, "linear"
        else:
            B, (M, N), K, cls = 1, (int(s) for s in a.shape), int(b.shape[1]), "linear"
        if min(B, M, N, K) <= 0:
            return
        flops = 2.0 * B * M * N * K
        nbytes = float(self.elem(a) * B * (M * N + N * K + M * K))
        kid = self.add_row(aten, cls, cls, (B, M, N, K, None), flops, nbytes, self.producers(ins))
        self.set_writer(outs, (kid,))

    def _conv(self, base, aten, args, ins, outs):
        """A convolution as the implicit GEMM cuDNN runs: ``(batch * output positions) x
        (in channels * kernel size) @ (... x out channels)``; the backward as the two GEMMs of
        the input and weight gradients plus a reduction for the bias gradient."""
        fw = base == "convolution"
        x, w = (args[0], args[1]) if fw else (args[1], args[2])
        y = outs[0] if fw else args[0]                       # output / its gradient
        groups = int(args[8] if fw else args[9])
        M = int(y.shape[0]) * math.prod(int(v) for v in y.shape[2:])
        N = int(w.shape[1]) * math.prod(int(v) for v in w.shape[2:])
        K = int(w.shape[0]) // max(groups, 1)
        mask = (True, False, False) if fw else tuple(bool(m) for m in args[10])
        gemms = [(M, N, K)] if fw else [g for g, m in zip(((M, K, N), (K, M, N)), mask) if m]
        cls = "bmm" if groups > 1 else "linear"
        inputs = self.producers(ins)
        kids = []
        for m, n, k in gemms:
            if min(m, n, k) > 0:
                kids.append(self.add_row(aten, cls, cls, (groups, m, n, k, None),
                                         2.0 * groups * m * n * k, float(
                                             self.elem(x) * groups * (m * n + n * k + m * k)),
                                         inputs))
        if not fw and len(mask) > 2 and mask[2]:
            written = int(w.shape[0])
            kids.append(self.add_row(aten, "memory", "mem", (1, None, None, None, written), 0.0,
                                     float(_nbytes(y) + written * y.element_size()), inputs))
        if kids:
            self.set_writer(outs, tuple(kids))

    def _layernorm(self, base, aten, args, ins, outs):
        fw = not base.endswith("_backward")
        if fw:
            x, normalized = args[0], args[1]
        else:
            x, normalized = args[1], args[2]
        H = math.prod(int(s) for s in normalized) if len(normalized) else 1
        B = x.numel() // max(H, 1)
        if fw:
            self._vector(aten, "layernorm", "ln", B, H, ins, outs)
            return
        mask = args[-1] if isinstance(args[-1], (list, tuple)) else [True, True, True]
        inputs = self.producers(ins)
        res = outs  # (grad_input, grad_weight, grad_bias); undefined ones are absent
        if mask[0]:
            # grad_input reads the output gradient and the input, writes one: 1.5x the forward
            _, n_in, ops_per_o = sizes.OPS["ln_bw"]
            kid = self.add_row(aten, "layernorm", "ln_bw", (B, None, None, None, H),
                               float(B * H * ops_per_o),
                               float(B * H * self.elem(x) * (n_in + 1)), inputs)
            if res:
                self.set_writer(res[:1], (kid,))
        n_param = int(bool(mask[1])) + int(len(mask) > 2 and bool(mask[2]))
        if n_param:
            # weight/bias grads: a column reduction that reads the output gradient and the
            # input (B x H each) and writes H per parameter; part of the layer norm's backward
            nbytes = float(self.elem(x) * (2 * B * H + n_param * H))
            kid = self.add_row(aten, "layernorm", "ln_wgrad", (B, None, None, None, H),
                               float(B * H * sizes.OPS["ln_wgrad"][2]), nbytes, inputs)
            self.set_writer(res[1:] if mask[0] else res, (kid,))

    def _memory(self, kind, base, inplace, aten, args, ins, outs):
        written = sum(int(t.numel()) for t in outs)
        wbytes = sum(_nbytes(t) for t in outs)
        if kind == "write":  # fills and RNG: nothing read
            rbytes = 0
            inputs = ()
        elif kind == "gather":
            idx = [t for t in ins if not t.is_floating_point()]
            rbytes = sum(_nbytes(t) for t in idx) + wbytes
            inputs = self.producers(ins)
        elif kind == "scatter":
            # (self, ..., index, src): reads index and src, read-modify-writes src-many rows
            src = [t for t in ins[1:] if t.is_floating_point()] or ins[1:]
            idx = [t for t in ins[1:] if not t.is_floating_point()]
            sbytes = sum(_nbytes(t) for t in src)
            rbytes = sum(_nbytes(t) for t in idx) + sbytes
            if inplace:  # only the touched rows are read and written
                written = sum(int(t.numel()) for t in src)
                wbytes = sbytes
            else:  # the out-of-place form first copies `self` into the output
                rbytes += _nbytes(ins[0])
            inputs = self.producers(ins)
        elif kind == "embedding_backward":
            grad, idx = args[0], args[1]
            rbytes = _nbytes(grad) + _nbytes(idx)
            inputs = self.producers(ins)
        else:  # "all"
            srcs = ins[1:] if base == "copy" else ins
            rbytes = sum(_nbytes(t) for t in srcs)
            inputs = self.producers(ins)
        if written <= 0:
            return
        kid = self.add_row(aten, "memory", "mem", (1, None, None, None, written), 0.0,
                           float(rbytes + wbytes), inputs)
        self.set_writer(outs, (kid,))

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=list(TRACE_COLUMNS + self.extra_cols))
        df["kid"] = df["kid"].astype(np.int64)
        df["layer"] = df["layer"].astype(np.int64)
        for c in ("B", "M", "N", "K", "H", "flops", "bytes") + self.extra_cols:
            df[c] = df[c].astype(np.float64)
        extra = df[list(self.extra_cols)]
        return pd.concat([df.drop(columns=list(self.extra_cols)), self.memory_frame(), extra],
                         axis=1)


def _same_dense(args, kwargs):
    """The first tensor argument when every tensor argument is a contiguous floating meta
    tensor of one shape and dtype (the output of an elementwise op is then ``empty_like`` of
    it), else None."""
    import torch

    first = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if first is None:
                if not (a.is_meta and a.is_floating_point() and a.is_contiguous()):
                    return None
                first = a
            elif a.shape != first.shape or a.dtype != first.dtype or not a.is_contiguous():
                return None
        elif isinstance(a, (list, tuple, dict)):
            return None
    if kwargs:
        for v in kwargs.values():
            if isinstance(v, (torch.Tensor, list, tuple, dict)):
                return None
    return first


def _fast_meta_ops():
    """Ops whose meta output is computed here instead of by torch's Python meta kernels (the
    main cost of a trace): shape-preserving elementwise ops on same-shape contiguous inputs."""
    import torch

    aten = torch.ops.aten
    same = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
            aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar,
            aten.rsub.Scalar, aten.pow.Tensor_Scalar, aten.relu.default, aten.tanh.default,
            aten.gelu.default, aten.sigmoid.default, aten.silu.default, aten.neg.default,
            aten.rsqrt.default, aten.exp.default, aten.threshold_backward.default,
            aten.tanh_backward.default, aten.gelu_backward.default,
            aten.sigmoid_backward.default, aten.silu_backward.default,
            aten._softmax.default, aten._softmax_backward_data.default]
    inplace = [aten.add_.Tensor, aten.mul_.Tensor, aten.div_.Tensor, aten.add_.Scalar,
               aten.mul_.Scalar, aten.div_.Scalar]
    fast = {}

    def out_like(args, kwargs):
        t = _same_dense(args, kwargs)
        return None if t is None else torch.empty_like(t)

    def out_self(args, kwargs):
        t = _same_dense(args, kwargs)
        return None if t is None else args[0]

    def dropout(args, kwargs):
        x = args[0] if args else None
        if kwargs or not (isinstance(x, torch.Tensor) and x.is_meta and x.is_contiguous()):
            return None
        return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)

    def dropout_backward(args, kwargs):
        g, m = args[0], args[1]
        if kwargs or not (g.is_meta and g.is_contiguous() and m.is_contiguous()
                          and g.shape == m.shape and g.is_floating_point()):
            return None
        return torch.empty_like(g)

    for op in same:
        fast[op] = out_like
    for op in inplace:
        fast[op] = out_self
    fast[aten.native_dropout.default] = dropout
    fast[aten.native_dropout_backward.default] = dropout_backward
    return fast


def _meta_scalar(t):
    """``.item()`` of a meta tensor: the only data-dependent checks the models make on their
    inputs ask whether the mask is all ones / the positions are not packed (``.all()``); our
    inputs have no padding, so a boolean answers True. Anything else cannot be traced."""
    import torch

    if t.dtype == torch.bool:
        return True
    raise ValueError("the model reads a data-dependent value (.item() on a non-boolean tensor), "
                     "which a meta-device trace cannot provide: patch that module for tracing")


def _make_modes(tracer: _Tracer, redirect_dropout: bool):
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is local_scalar and args and args[0].is_meta:
                return _meta_scalar(args[0])
            shortcut = fast.get(func)
            out = shortcut(args, kwargs) if shortcut is not None else None
            if out is None:
                out = func(*args, **kwargs)
            tracer.record(func, args, kwargs, out)
            return out

    dropouts = {F.dropout, torch.dropout}
    local_scalar = torch.ops.aten._local_scalar_dense.default
    fast = _fast_meta_ops()

    class CudaDropout(TorchFunctionMode):
        """F.dropout as CUDA runs it: the fused native_dropout kernel when 0 < p < 1."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in dropouts:
                names = ("input", "p", "training", "inplace") if func is F.dropout else \
                        ("input", "p", "train")
                bound = dict(zip(names, args))
                bound.update(kwargs)
                x = bound["input"]
                p = float(bound.get("p", 0.5))
                train = bool(bound.get("training", bound.get("train", True)))
                if not train or p == 0.0 or x.numel() == 0:
                    return x
                if 0.0 < p < 1.0:
                    return torch.native_dropout(x, p, True)[0]
            return func(*args, **kwargs)

    return Recorder(), (CudaDropout() if redirect_dropout else None)


# --------------------------------------------------------------------------------------------
# Model structure: transformer blocks, module hooks, mixture of experts
# --------------------------------------------------------------------------------------------

def _block_index(model) -> dict:
    """Qualified name of each transformer block -> its index (encoder blocks first)."""
    import torch.nn as nn

    out: dict[str, int] = {}
    taken: list[str] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if any(name.startswith(t + ".") for t in taken):
            continue
        kinds = {type(m) for m in mod}
        if len(kinds) != 1:
            continue
        cname = next(iter(kinds)).__name__
        if not (cname.endswith("Block") or cname.endswith("Layer")):
            continue
        taken.append(name)
        for i in range(len(mod)):
            out[f"{name}.{i}"] = len(out)
    return out


def _install_hooks(model, tracer: _Tracer) -> list:
    import torch
    from torch.autograd.graph import register_multi_grad_hook

    handles = []
    for name, mod in model.named_modules():
        def pre(m, args, kwargs, _name=name):
            tracer.fw_stack.append(_name)
            if torch.is_grad_enabled():
                ts = [t for t in _tensors((args, kwargs), []) if t.requires_grad]
                if ts:
                    handles.append(register_multi_grad_hook(ts, lambda *_: _pop(_name)))

        def post(m, args, kwargs, output, _name=name):
            if tracer.fw_stack and tracer.fw_stack[-1] == _name:
                tracer.fw_stack.pop()
            if torch.is_grad_enabled():
                ts = [t for t in _tensors(output, []) if isinstance(t, torch.Tensor)
                      and t.requires_grad]
                if ts:
                    handles.append(register_multi_grad_hook(
                        ts, lambda *_: _push(_name), mode="any"))

        def _push(n):
            # hooks on the same tensor fire inner module first (registration order): keep an
            # enclosing module below the descendants already on the stack
            st = tracer.bw_stack
            i = len(st)
            prefix = n + "." if n else ""
            while i > 0 and st[i - 1] != n and st[i - 1].startswith(prefix):
                i -= 1
            st.insert(i, n)

        def _pop(n):
            st = tracer.bw_stack
            for i in range(len(st) - 1, -1, -1):
                if st[i] == n:
                    del st[i]
                    break

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
    return handles


def _fixed_capacity_moe(self, hidden_states, *args, **kwargs):
    """A Switch sparse MLP with fixed-size expert blocks (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    router, experts = self.router, self.experts
    batch, seq, dim = hidden_states.shape
    h = hidden_states
    jitter = getattr(router, "jitter_noise", 0.0) or 0.0
    if self.training and jitter > 0:
        h = h * torch.empty_like(h).uniform_(1.0 - jitter, 1.0 + jitter)
    logits = router.classifier(h)
    probs = F.softmax(logits, dim=-1)
    route_prob, _ = probs.max(dim=-1)           # router probability of the chosen expert
    _chosen = probs.argmax(dim=-1)               # the routing decision (data-dependent)
    n_exp = int(getattr(router, "num_experts", len(experts)))
    cap = min(int(getattr(router, "expert_capacity", seq)), seq) * batch
    flat = hidden_states.reshape(batch * seq, dim)
    weight = route_prob.reshape(batch * seq, 1)
    out = torch.zeros_like(flat)
    names = [f"expert_{i}" for i in range(n_exp)]
    for name in names:
        # token positions routed to this expert: a fixed-size block of `cap` tokens
        idx = torch.empty(cap, dtype=torch.long, device=flat.device)
        tokens = flat.index_select(0, idx)
        y = experts[name](tokens) * weight.index_select(0, idx)
        out.index_add_(0, idx, y)
    return out.reshape(batch, seq, dim)


def expert_tokens(tokens: int, top_k: int, n_experts: int, imbalance: float = 1.0) -> list[int]:
    """Tokens each routed expert processes in one MoE layer (the tracer's routing assumption).

    ``tokens * top_k`` token-expert pairs are shared out: with ``imbalance = 1`` evenly (the
    first ``remainder`` experts take one more); with ``imbalance = f > 1`` the busiest expert
    takes ``f`` times the even share (at most every token once) and the others share the rest
    evenly. The total is always ``tokens * top_k``, so the GEMM FLOPs do not change; only the
    kernel shapes do (one large expert GEMM and many small ones).
    """
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) \
            or not math.isfinite(imbalance) or imbalance < 1:
        raise ValueError(f"imbalance must be a finite number >= 1 (1 = tokens spread evenly over "
                         f"the experts; 2 = the busiest expert gets twice its share), got "
                         f"{imbalance!r}")
    total = tokens * top_k
    top = min(tokens, math.ceil(imbalance * total / n_experts)) if imbalance > 1 else None
    if top is None or n_experts == 1:
        q, r = divmod(total, n_experts)
        return [q + 1] * r + [q] * (n_experts - r)
    q, r = divmod(total - top, n_experts - 1)
    return [top] + [q + 1] * r + [q] * (n_experts - 1 - r)


def _balanced_experts(self, hidden_states, top_k_index, top_k_weights):
    """A transformers experts module (3-D ``gate_up_proj``/``down_proj``) with a fixed routing.

    Each expert runs, as the eager loop of transformers does, a gather of its tokens, the
    gate-up GEMM, the activation times up, the down GEMM, a scale by the router weight and a
    scatter-add back; how many tokens each gets is :func:`expert_tokens`.
    """
    import torch
    import torch.nn.functional as F

    tokens = int(hidden_states.shape[0])
    counts = expert_tokens(tokens, int(top_k_index.shape[-1]), int(self.gate_up_proj.shape[0]),
                           self._nslib_imbalance)
    out = torch.zeros_like(hidden_states)
    weights = top_k_weights.reshape(-1, 1)
    for e, n in enumerate(counts):
        if n == 0:
            continue  # an expert no token reaches launches nothing
        idx = torch.empty(n, dtype=torch.long, device=hidden_states.device)
        gate, up = F.linear(hidden_states.index_select(0, idx), self.gate_up_proj[e]).chunk(2, -1)
        y = F.linear(self.act_fn(gate) * up, self.down_proj[e])
        out.index_add_(0, idx, y * weights.index_select(0, idx))
    return out


def _is_fused_experts(mod) -> bool:
    w1, w2 = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return (getattr(w1, "dim", None) is not None and w1.dim() == 3
            and getattr(w2, "dim", None) is not None and w2.dim() == 3 and hasattr(mod, "act_fn"))


def _patch_moe(model, imbalance: float = 1.0, arch: str = "model") -> int:
    """Give every mixture-of-experts module a fixed routing; returns how many were patched.

    Switch sparse MLPs get :func:`_fixed_capacity_moe`; top-k experts modules of the Mixtral
    layout (Mixtral, Qwen2-MoE, DeepSeek-V2/V3, ...) :func:`_balanced_experts`. Any other
    module named ``...Experts`` raises ValueError: its routing would need meta-unfriendly data.
    """
    n, done = 0, []
    for name, mod in model.named_modules():
        cname = type(mod).__name__
        if any(name.startswith(d + ".") for d in done):
            continue  # inside a patched module: its own forward no longer runs them
        if cname.endswith("SparseMLP") and hasattr(mod, "router") and hasattr(mod, "experts"):
            mod.forward = types.MethodType(_fixed_capacity_moe, mod)
            n += 1
            done.append(name)
        elif _is_fused_experts(mod):
            mod._nslib_imbalance = imbalance
            mod.forward = types.MethodType(_balanced_experts, mod)
            n += 1
        elif cname.endswith("Experts"):
            raise ValueError(f"{arch}: the mixture-of-experts module {name} ({cname}) is not in a "
                             f"layout nslib can trace (it needs 3-D gate_up_proj/down_proj "
                             f"expert weights as in Mixtral, Qwen2-MoE and DeepSeek, or a Switch "
                             f"SparseMLP); this architecture is not supported yet")
    return n


# --------------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------------

_MAX_POS = ("n_positions", "max_position_embeddings", "max_target_positions")


def max_seq(model, data=None) -> int | None:
    """The longest sequence a model's config allows (tokens), or None when it sets no limit."""
    config = load_model_config(model, data)
    limits = [config[k] for k in _MAX_POS if isinstance(config.get(k), int) and config[k] > 0]
    return min(limits) if limits else None
# config fields that count transformer blocks (a zero in any of them is an error)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers",
               "encoder_layers", "decoder_layers")


def _check_args(batch, seq, mode):
    for name, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if mode not in ("inf", "train"):
        raise ValueError(f"mode must be 'inf' (forward) or 'train' (forward + backward), "
                         f"got {mode!r}")


def _mark_storages(tracer: _Tracer, model, inputs: dict) -> None:
    """Tell the tracer which storages live for the whole step (parameters, buffers, gradients)
    and which the caller holds (the inputs), for the memory columns."""
    params = list(model.parameters())
    tracer.mark([p for p in params if p.requires_grad], "trainable")
    tracer.mark([p for p in params if not p.requires_grad], "param")
    tracer.mark(list(model.buffers()), "param")
    tracer.mark([p.grad for p in params if p.grad is not None], "grad")
    tracer.mark(list(inputs.values()), "held")


def _check_layers(hf, block_of: dict, arch: str) -> None:
    """A model without transformer blocks would trace only embeddings and heads: an error."""
    zero = [k for k in _LAYER_KEYS if getattr(hf, k, None) == 0]
    if zero or not block_of:
        what = ", ".join(f"{k} = 0" for k in zero) or "no repeated transformer block found"
        raise ValueError(f"{arch} has no transformer layers ({what}): its trace would hold only "
                         f"the embeddings and the head. Set the layer count to at least 1")


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
        inputs = {"input_features": torch.zeros(batch, mels, 2 * frames, device="meta")}
    elif main == "pixel_values":
        h, w = _image_size(hf, arch)
        channels = int(_vision(hf, "num_channels") or 3)
        inputs = {"pixel_values": torch.zeros(batch, channels, h, w, device="meta")}
        patch = _vision(hf, "patch_size")
        if isinstance(patch, int) and patch > 0 and seq != (h // patch) * (w // patch) + 1:
            warnings.warn(f"{arch}: the sequence is set by the image ({h}x{w} pixels, patches "
                          f"of {patch}: {(h // patch) * (w // patch) + 1} tokens with the class "
                          f"token); seq={seq} is not used", stacklevel=4)
    else:
        raise ValueError(f"{arch} takes {main!r} as its input, which nslib cannot build (it "
                         f"builds token ids, Whisper-style audio features and images): not "
                         f"supported")
    if getattr(hf, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    return inputs


def _loss(output):
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


def trace(config: dict, batch: int, seq: int, mode: str, *, grad_accumulation: bool = True,
          architecture: str | None = None, imbalance: float = 1.0,
          dtype: str = "fp32") -> pd.DataFrame:
    """The kernels one forward (``mode="inf"``) or forward + backward (``"train"``) launches.

    ``config``: a HuggingFace config dict (or a name/path for :func:`load_model_config`).
    Inputs are built from the config: token ids of shape ``(batch, seq)`` (and decoder ids of
    the same shape for encoder-decoder models); for speech models (Whisper) log-mel features of
    shape ``(batch, num_mel_bins, 2 * max_source_positions)`` (the encoder's fixed 30 s
    window) and decoder ids ``(batch, seq)``; for vision models (ViT) images of shape
    ``(batch, num_channels, image_size, image_size)``, whose patch count sets the sequence
    (``seq`` is then unused, with a warning when it differs). ``imbalance``: the routing of
    top-k mixture-of-experts layers (:func:`expert_tokens`; 1 = balanced). ``grad_accumulation``: trace the add of each parameter gradient
    into an existing ``.grad`` (as the measured runs and the original opgraph). ``architecture``:
    a transformers class name to build instead of the default: the model the measurements
    ran (:data:`MEASURED_ARCHITECTURE`, e.g. BERT inference is BertForSequenceClassification),
    else the pre-training model, else the causal LM, seq2seq LM, masked LM, base model.

    Returns a frame with one row per kernel, in launch order, columns :data:`TRACE_COLUMNS`:
    ``kid``, ``phase`` ("fw"/"bw"), ``aten``, ``cls`` (a class of :mod:`nslib.kernels.sizes` or
    "memory"), ``op``, dims ``B, M, N, K, H`` (float, NaN where the class has none), ``flops``,
    ``bytes`` (FP32 for the measured classes; memory rows count the bytes they read and write
    at their real dtypes), ``inputs`` (sorted tuple of the kids that produced this kernel's
    tensor inputs, followed through views; () for model inputs and parameters), ``layer``
    (transformer block index, encoder blocks then decoder blocks, or -1 outside the blocks)
    and ``module`` (qualified name of the innermost module running it, or ""). Unknown aten ops give no row and one
    warning listing them.

    ``dtype``: ``"fp32"`` (default: the paper's traces, eager attention) or ``"bf16"``/``"fp16"``:
    the model is built in that format with PyTorch's scaled-dot-product attention, each call of
    which is one row of class ``"attention"`` (:mod:`nslib.model.sdpa_trace`; the frame then ends with
    its :data:`ATTENTION_COLUMNS`, NaN on other rows), and ``bytes`` count every kernel's real
    element size (2 bytes, 4 for what the model keeps in FP32). Raises ValueError for bad arguments or a config transformers cannot
    build, with zero layers, or of an architecture the tracer does not support (naming it and
    what is missing).
    """
    from transformers.utils import logging as hf_logging

    _check_args(batch, seq, mode)
    dtype = check_dtype(dtype)
    if not isinstance(config, dict):
        config = load_model_config(config)
    if architecture is None:
        architecture = MEASURED_ARCHITECTURE.get((config.get("model_type"), mode))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' notes about meta tensors, token ids...
    try:
        return _trace(config, batch, seq, mode, grad_accumulation, architecture, imbalance,
                      dtype)
    finally:
        hf_logging.set_verbosity(verbosity)


def _trace(config, batch, seq, mode, grad_accumulation, architecture, imbalance,
           dtype="fp32") -> pd.DataFrame:
    import contextlib

    import torch

    expert_tokens(1, 1, 1, imbalance)  # validates imbalance before the (slower) build
    hf, model = _build(config, architecture, dtype)
    arch = type(model).__name__
    for attr in _MAX_POS:
        limit = getattr(hf, attr, None)
        if isinstance(limit, int) and 0 < limit < seq:
            raise ValueError(f"seq {seq} exceeds the model's {attr} = {limit}: use a shorter "
                             f"sequence or raise {attr} in the config")
    train = mode == "train"
    model.train(train)
    block_of = _block_index(model)
    _check_layers(hf, block_of, arch)
    _patch_moe(model, imbalance, arch)
    tracer = _Tracer(model, block_of, half=dtype != "fp32")
    recorder, dropout_mode = _make_modes(tracer, redirect_dropout=train)
    attention = sdpa_mode(tracer) if tracer.half else contextlib.nullcontext()
    inputs = _model_inputs(hf, model, batch, seq)
    if train and grad_accumulation:
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
    _mark_storages(tracer, model, inputs)

    handles = _install_hooks(model, tracer)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' own chatter about meta/eager/etc.
            try:
                if train:
                    with dropout_mode, attention, recorder:
                        out = model(**inputs)
                        tracer.mark(_tensors(out, []), "held")
                        loss = _loss(out)
                        tracer.phase = "bw"
                        tracer.fw_stack.clear()
                        loss.backward()
                else:
                    with torch.no_grad(), attention, recorder:
                        tracer.mark(_tensors(model(**inputs), []), "held")
            except (ValueError, RuntimeError, IndexError, TypeError, NotImplementedError,
                    AttributeError, KeyError) as e:
                raise _trace_error(e, arch, hf.model_type, model, tracer) from None
    finally:
        tracer.closed = True
        for h in handles:
            h.remove()
    if tracer.unknown:
        listing = ", ".join(f"{k} x{v}" for k, v in sorted(tracer.unknown.items()))
        warnings.warn(f"nslib.model.graph.trace: {len(tracer.unknown)} aten op(s) have no kernel "
                      f"mapping and were left out of the trace: {listing}", stacklevel=3)
    return tracer.frame()


def _trace_error(e: Exception, arch: str, model_type: str, model, tracer) -> ValueError:
    """The error of a failed forward/backward: the architecture, the module and the cause."""
    where = tracer.current_module()
    mod = dict(model.named_modules()).get(where) if where else None
    place = f" in {where} ({type(mod).__name__})" if mod is not None else ""
    cause = str(e).splitlines()[0] if str(e) else ""
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
