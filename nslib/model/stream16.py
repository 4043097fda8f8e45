"""A 16-bit trace's rows in a model stream (:func:`nslib.model.stream.stream_ms` calls
these).

The same :func:`nslib.model.stream.stream_ms` prices a 16-bit (bf16/fp16) trace when given the
GPU and its 16-bit ``tensor`` predictors (:func:`tensor_predictors`). Such a trace holds three
kinds of rows:

- 16-bit GEMMs (``linear``/``bmm`` rows counted at 2 bytes per element, see
  :func:`nslib.kernels.sizes.elem_bytes`): priced by the 16-bit GEMM predictor
  (:func:`nslib.predictors.trained` kind ``"gemm"``: ``[m x k] @ [k x n]``).
  The trace's ``(B, M, N, K)`` means ``B`` products of ``M x N`` by ``N x K``, so ``m = B * M``,
  ``k = N``, ``n = K``: a batched GEMM is priced as one GEMM with all its rows (same FLOPs;
  it reads the ``N x K`` operand once instead of ``B`` times, which only matters for the small
  bandwidth-bound ``bmm`` of models without fused attention).
- ``attention`` rows (one per scaled-dot-product attention call): priced by the attention
  predictor (kind ``"attention"``), prefill when the query is longer than one token, decode
  otherwise. The backward row (``attention_bw``) is priced at 2.5 x the forward's time: the
  FlashAttention backward does 2.5 x the forward's FLOPs
  (:data:`nslib.model.sdpa_trace.BACKWARD_FLOPS`) and no backward kernels were measured.
- Everything else (elementwise, softmax, normalisation, memory, and GEMMs the model keeps in
  FP32) keeps the FP32-trained predictor. A 16-bit vector kernel over ``n`` elements moves the
  bytes of an FP32 kernel over ``n / 2`` and these kernels are bandwidth-bound, so it is priced
  as that FP32 kernel: ``H`` scaled by ``elem_bytes / 4`` (rows keep their count ``B``).
  Memory rows already carry their real bytes.

The 16-bit tables are GPU kernel times without a host dispatch floor, so in a model stream a
tensor kernel costs ``max(pred, launch gap)``; the other rows take the FP32 path above.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.mixed_data import gpu_frame
from nslib.data.settings import Settings
from nslib.kernels import sizes
from nslib.model.sdpa_trace import BACKWARD_FLOPS
from nslib.predictors import trained

TENSOR_KINDS = ("gemm", "attention")


def datasheet_columns(gpu) -> dict:
    """The 16-bit predictors' datasheet columns of ``gpu``, those every 16-bit table carries
    (:func:`nslib.data.mixed_data.gpu_frame`); a clear ValueError naming ``Bf16FLOPs`` when its
    datasheet lacks the tensor-core peak."""
    gpu.bf16_peak()
    return gpu_frame([gpu]).iloc[0].to_dict()


def gemm_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    """GEMM rows as the gemm kind's ``m, n, k`` (see the module doc for the mapping)."""
    B, M, N, K = (frame[c].to_numpy(float) for c in ("B", "M", "N", "K"))
    return pd.DataFrame({"m": B * M, "n": K, "k": N}, index=frame.index)


def attention_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    """Attention rows as the attention kind's columns (``phase, batch, q_len, kv_len, heads,
    kv_heads, head_dim, causal``); the trace stores ``B, M, N, K, H`` = batch, query length,
    head dim, key length, heads (:mod:`nslib.model.sdpa_trace`)."""
    q = frame["M"].to_numpy(float)
    return pd.DataFrame({
        "phase": np.where(q > 1, "prefill", "decode"), "batch": frame["B"].to_numpy(float),
        "q_len": q, "kv_len": frame["K"].to_numpy(float), "heads": frame["H"].to_numpy(float),
        "kv_heads": frame["kv_heads"].to_numpy(float),
        "head_dim": frame["N"].to_numpy(float),
        "causal": frame["causal"].to_numpy(float) > 0}, index=frame.index)


def fp32_equivalent(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (predictor input) with each 16-bit vector row's ``H`` scaled to the FP32
    kernel that moves the same bytes (see the module doc); other rows unchanged."""
    out = frame.copy()
    vec = out["cls"].isin(sizes.VECTOR_CLASSES).to_numpy()
    if vec.any():
        scale = sizes.elem_bytes(out[vec]) / sizes.BYTES_PER_ELEM
        out.loc[vec, "H"] = out.loc[vec, "H"].to_numpy(float) * scale
    return out


def tensor_masks(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(16-bit GEMM rows, attention rows) of a kernel frame."""
    gemm = frame["cls"].isin(sizes.GEMM_CLASSES).to_numpy().copy()
    if gemm.any():
        elem = np.full(len(frame), np.nan)
        elem[gemm] = sizes.elem_bytes(frame[gemm])
        gemm &= elem < sizes.BYTES_PER_ELEM
    return gemm, (frame["cls"] == "attention").to_numpy()


def tensor_ms(frame: pd.DataFrame, gpu, gemm_pred, attn_pred) -> np.ndarray:
    """Kernel time (ms) of the 16-bit GEMM and attention rows of ``frame`` on ``gpu``; NaN on
    the other rows."""
    sheet = datasheet_columns(gpu)
    gemm, attn = tensor_masks(frame)
    out = np.full(len(frame), np.nan)
    if gemm.any():
        out[gemm] = gemm_pred.predict(gemm_inputs(frame[gemm]).assign(**sheet)
                                      .reset_index(drop=True))
    if attn.any():
        rows = attention_inputs(frame[attn]).assign(**sheet).reset_index(drop=True)
        back = (frame.loc[attn, "op"] == "attention_bw").to_numpy()
        out[attn] = attn_pred.predict(rows) * np.where(back, BACKWARD_FLOPS, 1.0)
    return out


def tensor_predictors(name: str, quick: bool = False, mixed=None):
    """(GEMM predictor, attention predictor) ``name`` trained on every measured GPU (cached,
    :func:`nslib.predictors.trained`)."""
    return tuple(trained(name, Settings(quick=quick, mixed=mixed), kind=kind)
                 for kind in TENSOR_KINDS)
