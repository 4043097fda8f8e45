"""Scaled-dot-product attention in a 16-bit trace: one ``attention`` kernel row per call.

A 16-bit model is traced with PyTorch's ``scaled_dot_product_attention`` (SDPA), which on a GPU
runs one fused FlashAttention kernel. On the meta device SDPA would decompose into the math
path (``bmm``, ``softmax``, ``bmm``), so :func:`sdpa_mode` catches the call at the
torch-function level, records one row and returns an output of the right shape without
running the decomposition. Under autograd the call is a custom function whose backward records
one more row (``op="attention_bw"``, phase ``bw``): FlashAttention's backward recomputes the
scores and runs five GEMM-sized products against the forward's two, so its FLOPs are counted
as 2.5 x the forward's (its time is priced the same way, :func:`nslib.model.stream.stream_ms`).

Row dims, as the GEMM convention of :mod:`nslib.model.aten` (``Q @ K^T`` is ``M x N @ N x K``):
``B`` = batch, ``M`` = query length, ``N`` = head dim, ``K`` = key/value length, ``H`` = query
heads; the extra columns :data:`ATTENTION_COLUMNS`: ``kv_heads`` (key/value heads: grouped-query
attention reads them once) and ``causal`` (1.0 or 0.0; a boolean or additive mask counts as
not causal, as FlashAttention then runs the masked kernel).
"""
from __future__ import annotations

import math
from typing import NamedTuple

ATTENTION_COLUMNS = ("kv_heads", "causal")
BACKWARD_FLOPS = 2.5  # FlashAttention backward / forward FLOPs (5 products against 2)


def attention_pairs(q_len: float, kv_len: float, causal: bool) -> float:
    """(query, key) pairs one head scores: all ``q_len * kv_len``, or under a causal mask
    aligned to the last key (each query sees the keys up to its own position)."""
    if not causal:
        return q_len * kv_len
    q = min(q_len, kv_len)
    return q * kv_len - q * (q - 1) / 2.0


class AttentionDims(NamedTuple):
    """The sizes of one attention call: ``batch`` (leading dims folded), query and key
    lengths, query and key/value heads, head dim, and whether a causal mask applies."""
    batch: int
    q_len: int
    kv_len: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool


def attention_cost(dims: AttentionDims, elem: int,
                   backward: bool = False) -> tuple[float, float]:
    """(FLOP, minimum DRAM bytes) of one FlashAttention forward (or backward) call of
    ``dims`` (:class:`AttentionDims`).

    Forward: ``4 * batch * heads * pairs * head_dim`` FLOP (scores and the weighted sum); bytes
    read Q, K, V and write O once (``elem`` bytes per element). Backward: 2.5 x the FLOP; reads
    Q, K, V, O, dO and writes dQ, dK, dV.
    """
    batch, q_len, kv_len, heads, kv_heads, head_dim, causal = dims
    flops = 4.0 * batch * heads * attention_pairs(q_len, kv_len, causal) * head_dim
    q_side = batch * heads * q_len * head_dim
    kv_side = batch * kv_heads * kv_len * head_dim
    if backward:
        return BACKWARD_FLOPS * flops, float(elem * (4 * q_side + 4 * kv_side))
    return flops, float(elem * (2 * q_side + 2 * kv_side))


def _dims(q, k, attn_mask, is_causal: bool) -> AttentionDims:
    """The :class:`AttentionDims` of an SDPA call on ``(batch, heads, seq, head_dim)`` tensors
    (leading dims beyond two fold into the batch)."""
    batch = math.prod(int(s) for s in q.shape[:-3]) if q.dim() > 3 else 1
    heads, q_len, head_dim = (int(s) for s in q.shape[-3:])
    kv_heads, kv_len = int(k.shape[-3]), int(k.shape[-2])
    return AttentionDims(batch, q_len, kv_len, heads, kv_heads, head_dim,
                         bool(is_causal and attn_mask is None))


def _bound(args, kwargs) -> dict:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _record(tracer, dims, elem, ins, outs, backward: bool) -> None:
    batch, q_len, kv_len, heads, kv_heads, head_dim, causal = dims
    flops, nbytes = attention_cost(dims, elem, backward)
    kid = tracer.add_row("scaled_dot_product_attention" + (".backward" if backward else ""),
                         "attention", "attention_bw" if backward else "attention",
                         (batch, q_len, head_dim, kv_len, heads), flops, nbytes,
                         tracer.producers(ins),
                         extra={"kv_heads": float(kv_heads), "causal": float(causal)})
    tracer.set_writer(outs, (kid,))
    tracer.touch(list(ins) + list(outs), kid)


def sdpa_mode(tracer):
    """A ``TorchFunctionMode`` recording each ``scaled_dot_product_attention`` call as one
    attention row of ``tracer`` (see the module doc) and returning an empty output."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class Sdpa(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, dims):
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            _record(tracer, dims, q.element_size(), (q, k, v), (out,), backward=False)
            ctx.dims = dims
            ctx.save_for_backward(q, k, v, out)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, out = ctx.saved_tensors
            grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
            _record(tracer, ctx.dims, q.element_size(), (q, k, v, out, grad), grads,
                    backward=True)
            return (*grads, None)

    sdpa_funcs = {F.scaled_dot_product_attention,
                  getattr(torch._C._nn, "scaled_dot_product_attention", None)} - {None}

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func not in sdpa_funcs:
                return func(*args, **kwargs)
            b = _bound(args, kwargs)
            q, k, v = b["query"], b["key"], b["value"]
            dims = _dims(q, k, b.get("attn_mask"), bool(b.get("is_causal", False)))
            if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                return Sdpa.apply(q, k, v, dims)
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            _record(tracer, dims, q.element_size(), (q, k, v), (out,), backward=False)
            return out

    return Recorder()
