"""aten op -> kernel class: the tables the tracer (:mod:`nslib.model.kernel_rows`) maps each
recorded aten op with, and small helpers on the tensors of a call.

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
- Softmax and its backward: ``softmax`` ``(B = rows, H = softmax dim)``. The softmax
  backward is two kernels on CUDA, as the original opgraph also records it (``VECmul``,
  ``VECsoftmax``): ``grad * output`` (``mul``), then the row kernel (``softmax_bw``); the
  log-softmax backward is the row kernel alone (``logsoftmax_bw``, which also takes the
  output's ``exp``).
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
  ``native_dropout``, losses (``mse_loss``, ``smooth_l1_loss``, ``nll_loss_forward``, ...) and
  their gradients -> ``memory``, ``op="mem"``, ``B = 1``, ``H`` = elements written,
  ``bytes`` = bytes read + written at their real dtypes (gathers read only the rows they
  gather; ``embedding_dense_backward`` reads the gradient and writes the table gradient).
- No row: views, reshapes, permutes, transposes, ``expand``, ``t``, ``detach``, ``alias``,
  size queries, ``empty*`` allocations and ops on zero-element tensors.
- Anything else: collected and reported in one ``warnings.warn`` with counts (no row).
"""
from __future__ import annotations

import math

__all__ = ["NO_KERNEL", "GEMM", "EW_PAIR", "EW_FIXED", "CONV", "SOFTMAX", "LAYERNORM", "MEMORY",
           "split_name", "tensors_in", "rows_of", "tensor_bytes", "taps_met"]

# views, metadata and allocations without data: no kernel
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "permute", "transpose",
    "t", "expand", "expand_as", "squeeze", "unsqueeze", "slice", "select", "split",
    "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",
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

GEMM = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_addmm_activation"}

# ops with a (binary, tensor-scalar) pair of measured names
EW_PAIR = {
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
EW_FIXED = {
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
CONV = {"convolution", "convolution_backward"}
SOFTMAX = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
            "softmax", "log_softmax", "_safe_softmax"}
# batch and group norm (CNNs): a batch norm streams its input (twice when it computes the
# batch's statistics, in training mode) as an elementwise kernel; a group norm normalizes
# rows of (channels / groups) x positions, a layer norm's kernel
NORM = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
        "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "native_group_norm",
        "native_batch_norm_backward", "cudnn_batch_norm_backward",
        "native_group_norm_backward"}
LAYERNORM = {"native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
              "_fused_rms_norm_backward"}
# memory ops: (read spec) -- "all" reads every tensor input fully, "gather" reads the index
# and as many source elements as it writes, "write" reads nothing (fills)
MEMORY = {
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
        "alias_copy", "detach_copy", "_reshape_copy", "repeat_interleave",
        # pooling: each window's elements read once, the pooled output (and indices) written
        "max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool1d", "max_pool2d",
        "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d",
        "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d",
        "upsample_nearest2d", "upsample_bilinear2d", "pixel_shuffle", "channel_shuffle",
        "diag_embed",
        # losses and their gradients: an elementwise pass over the inputs and a reduction
        "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss_backward",
        "smooth_l1_loss_backward", "huber_loss_backward", "soft_margin_loss_backward",
        "binary_cross_entropy_backward", "nll_loss_backward", "nll_loss2d_backward")},
    **{k: "gather" for k in (
        "embedding", "index_select", "index", "gather", "take", "take_along_dim",
        # the negative log-likelihood reads one log-probability per target
        "nll_loss_forward", "nll_loss2d_forward")},
    **{k: "scatter" for k in (
        "index_add", "index_put", "_index_put_impl", "index_copy", "scatter", "scatter_add",
        "scatter_reduce")},
    **{k: "write" for k in (
        "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
        "new_ones", "new_full", "fill", "zero", "arange", "linspace", "range", "bernoulli",
        "uniform", "normal", "random", "rand", "randn", "rand_like", "randn_like", "randint",
        "exponential", "eye")},
    "embedding_dense_backward": "embedding_backward",
    # pooling and resampling backward: the output gradient (and a max pool's indices) read,
    # the input gradient written; the forward input is passed for its shape only
    **{k: "grad" for k in (
        "max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
        "avg_pool2d_backward", "avg_pool3d_backward", "_adaptive_avg_pool2d_backward",
        "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward",
        "adaptive_max_pool3d_backward", "upsample_nearest2d_backward",
        "upsample_bilinear2d_backward")},
}


def split_name(func) -> tuple[str, bool]:
    """(base name, in-place?) of an aten op: ``add_`` -> ("add", True)."""
    name = func.overloadpacket.__name__
    if name.endswith("_") and not name.endswith("__"):
        return name[:-1], True
    return name, False


def tensors_in(obj, out: list):
    """``out`` with every tensor in ``obj`` (nested lists, tuples and dicts) appended."""
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            tensors_in(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            tensors_in(o, out)
    return out


def rows_of(shape) -> tuple[float, float]:
    """(B, H) = (numel / last dim, last dim) of a shape; (1, 1) for a scalar."""
    if len(shape) == 0:
        return 1.0, 1.0
    h = int(shape[-1])
    n = math.prod(int(s) for s in shape)
    return (float(n // h) if h else 0.0), float(h)


def tensor_bytes(t) -> int:
    """Bytes of a tensor's elements at its real dtype."""
    return int(t.numel()) * t.element_size()


def taps_met(in_sizes, kernel, out_sizes, stride, padding, dilation) -> int:
    """Of a transposed convolution (input spatial sizes ``in_sizes``, filter ``kernel``
    sizes): the (input position, filter tap) pairs whose product lands inside the output
    (``out_sizes``, after ``padding`` cropped it), the multiplies per input and output
    channel pair; dimension by dimension, input ``i`` and tap ``t`` land at
    ``i * stride + t * dilation - padding``."""
    total = 1
    for n, k, y, s, p, d in zip(in_sizes, kernel, out_sizes, stride, padding, dilation):
        total *= sum(0 <= i * int(s) + t * int(d) - int(p) < int(y)
                     for i in range(int(n)) for t in range(int(k)))
    return total
