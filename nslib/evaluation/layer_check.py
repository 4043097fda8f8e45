"""Layer-level check of the 16-bit model path against vidur's fp16 per-op layer timings.

Each row of :func:`nslib.data.mixed_data.layer_table` is one op of one transformer layer (vLLM's
kernels, fp16) at ``num_tokens`` tokens with tensor-parallel degree ``tp``. :func:`layer_kernels`
builds the kernel each op is, from the model's shape (``T`` tokens, ``E = n_embd``, ``h`` heads,
``g`` KV heads, head dim ``d = E / h``, ``F = n_expanded_embd``), in the trace's conventions
(:mod:`nslib.model.aten`; GEMM ``B=1, M x N @ N x K`` with ``N`` the reduction, vector ``B`` rows of
``H``; 2 bytes per element):

============================  ===========  ==============================================
op                            class / op   dims
============================  ===========  ==============================================
input/post_attention_layernorm layernorm ln B = T, H = E (fused RMSNorm: read x, write y)
attn_pre_proj (QKV)           linear        M = T, N = E, K = (h + 2 g) d / tp
attn_rope                     elementwise mulu  B = T, H = (h + g) d / tp (rotates Q and K)
attn_post_proj                linear        M = T, N = h d / tp, K = E
mlp_up_proj                   linear        M = T, N = E, K = 2 F / tp (gated) or F / tp
mlp_act                       elementwise mul (SiLU-and-mul: reads 2, writes 1) or gelu,
                                            B = T, H = F / tp
mlp_down_proj                 linear        M = T, N = F / tp, K = E
add (residual)                elementwise add  B = T, H = E
============================  ===========  ==============================================

:func:`layer_predictions` prices them as a 16-bit model is priced
(:func:`nslib.model.stream.stream_ms`): GEMMs by the 16-bit GEMM predictor, vector kernels by
the FP32-trained predictor at their real bytes, in a kernel stream (launch gap, no dispatch
floor). :func:`layer_report` gives the median |error| of each layer's summed time and of each
op class per GPU. Units: ms, %.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data import mixed_data
from nslib.data.gpus import load_mixed_gpus
from nslib.data.settings import Settings
from nslib.kernels import clock, sizes
from nslib.model.stream import LAUNCH_US, stream_ms
from nslib.predictors import trained
from nslib.predictors.mixed_training import kind_table

ELEM = 2  # fp16 bytes per element
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OP_CLASS = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
            "mlp_act": "act", "add": "add", **{op: "gemm" for op in GEMM_OPS}}


def _shape(t: pd.DataFrame) -> dict:
    T = t["num_tokens"].to_numpy(float)
    E, h = t["n_embd"].to_numpy(float), t["n_head"].to_numpy(float)
    g, F = t["n_kv_head"].to_numpy(float), t["n_expanded_embd"].to_numpy(float)
    tp = t["tp"].to_numpy(float)
    gated = t["use_gated_mlp"].to_numpy(bool)
    return dict(T=T, E=E, d=E / h, h=h, g=g, F=F, tp=tp, gated=gated)


def _gemm_dims(op: np.ndarray, s: dict) -> tuple[np.ndarray, np.ndarray]:
    """(N reduction, K output width) of each GEMM op's ``[T x N] @ [N x K]``."""
    N = np.select([op == "attn_pre_proj", op == "attn_post_proj", op == "mlp_up_proj"],
                  [s["E"], s["h"] * s["d"] / s["tp"], s["E"]], s["F"] / s["tp"])
    up = np.where(s["gated"], 2.0, 1.0) * s["F"] / s["tp"]
    K = np.select([op == "attn_pre_proj", op == "attn_post_proj", op == "mlp_up_proj"],
                  [(s["h"] + 2 * s["g"]) * s["d"] / s["tp"], s["E"], up], s["E"])
    return N, K


def _vector_dims(op: np.ndarray, s: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class, op name, H) of each vector op (rows B = T)."""
    norm = np.isin(op, ("input_layernorm", "post_attention_layernorm"))
    cls = np.where(norm, "layernorm", "elementwise")
    act = np.where(s["gated"], "mul", "gelu")
    name = np.select([norm, op == "attn_rope", op == "mlp_act"], ["ln", "mulu", act], "add")
    H = np.select([op == "attn_rope", op == "mlp_act"],
                  [(s["h"] + s["g"]) * s["d"] / s["tp"], s["F"] / s["tp"]], s["E"])
    return cls, name, H


def layer_kernels(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (rows of :func:`nslib.data.mixed_data.layer_table`) with each op's kernel in trace
    columns: ``cls, op`` (the kernel's), ``B, M, N, K, H``, ``flops``, ``bytes`` (2 bytes per
    element) and ``layer_op`` (vidur's op name). Unknown op names raise a ValueError."""
    unknown = sorted(set(table["op"]) - set(OP_CLASS))
    if unknown:
        raise ValueError(f"layer ops {unknown} have no kernel mapping; known: {sorted(OP_CLASS)}")
    out = table.rename(columns={"op": "layer_op"}).reset_index(drop=True)
    op, s = out["layer_op"].to_numpy(), _shape(out)
    gemm = np.isin(op, GEMM_OPS)
    N, K = _gemm_dims(op, s)
    vcls, vop, H = _vector_dims(op, s)
    nan = np.full(len(out), np.nan)
    out["cls"] = np.where(gemm, "linear", vcls)
    out["op"] = np.where(gemm, "linear", vop)
    out["B"] = np.where(gemm, 1.0, s["T"])
    out["M"] = np.where(gemm, s["T"], nan)
    out["N"], out["K"] = np.where(gemm, N, nan), np.where(gemm, K, nan)
    out["H"] = np.where(gemm, nan, H)
    flops, fp32_bytes = sizes.flops_bytes(out)
    out["flops"], out["bytes"] = flops, fp32_bytes * ELEM / sizes.BYTES_PER_ELEM
    out["phase"] = "fw"
    return out


def layer_predictions(table: pd.DataFrame | None = None, predictor="nslib",
                      tensor_predictor="nslib", quick: bool = False,
                      launch_us: float | None = LAUNCH_US, mixed=None, data=None,
                      leave_out: bool = False):
    """Per op row: :func:`layer_kernels` plus ``pred_ms`` (see the module doc).

    ``table``: rows of the layer table (default: all of it); ``predictor``: the FP32 kernel
    predictor (name or fitted); ``tensor_predictor``: the 16-bit GEMM predictor's name in
    :func:`nslib.predictors.trained`, or a fitted one; ``leave_out``: train it
    without the GPU being checked (leave-one-GPU-out, when that GPU has GEMM tables).
    """
    if table is None:
        table = mixed_data.layer_table(mixed)
    frame = layer_kernels(table)
    measured = set(kind_table("gemm", quick, mixed)["gpu"]) if leave_out else set()
    settings = Settings(data=data, quick=quick, mixed=mixed)
    pred = trained(predictor, settings) if isinstance(predictor, str) else predictor
    gpus = {g.name: g for g in load_mixed_gpus(mixed).values()}
    frame["pred_ms"] = np.nan
    for name, rows in frame.groupby("gpu", sort=False).groups.items():
        gpu = gpus[name]
        gemm = tensor_predictor
        if isinstance(gemm, str):
            gemm = trained(gemm, settings, kind="gemm",
                           exclude_gpus=[name] if name in measured else [])
        sub = frame.loc[rows].assign(**clock.frame_columns(gpu))
        frame.loc[rows, "pred_ms"] = stream_ms(pred, sub, launch_us, data,
                                               tensor=(gpu, gemm, None))
    return frame


def layer_sums(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (gpu, model, num_tokens, tp) layer: measured and predicted sums of its ops
    (ms) and the signed error (%)."""
    keys = ["gpu", "model", "num_tokens", "tp"]
    sums = frame.groupby(keys, as_index=False, sort=False)[["latency_ms", "pred_ms"]].sum()
    sums["error_pct"] = 100 * (sums["pred_ms"] - sums["latency_ms"]) / sums["latency_ms"]
    return sums


def layer_report(frame: pd.DataFrame, min_tokens: int = 256) -> pd.DataFrame:
    """Median |error| (%) per GPU over the layers with at least ``min_tokens`` tokens: of the
    summed layer (column ``layer``) and of each op class (:data:`OP_CLASS`), plus the layer
    count (``n``)."""
    big = frame[frame["num_tokens"] >= min_tokens]
    sums = layer_sums(big)
    out = sums.groupby("gpu", sort=False)["error_pct"].agg(
        layer=lambda e: float(np.median(np.abs(e))), n="size")
    err = (100 * (big["pred_ms"] - big["latency_ms"]).abs() / big["latency_ms"])
    per = err.groupby([big["gpu"], big["layer_op"].map(OP_CLASS)]).median().unstack()
    return out.join(per)


def source_agreement(mixed=None, min_tokens: int = 256) -> pd.DataFrame:
    """How far the two 16-bit sources disagree on the same GEMM on the same GPU: every layer
    GEMM of vidur's tables whose ``(tokens, reduction, width)`` is also a row of the BF16 GEMM
    table (:func:`nslib.data.mixed_data.gemm_table`), vidur's fp16 ms over the GEMM table's
    BF16 ms (both formats run at one tensor-core rate on these GPUs).

    One row per GPU with matches: ``shapes`` (matched GEMMs with at least ``min_tokens``
    tokens), the median ratio over them (``median``), its quartiles (``q25``, ``q75``), and the
    median per layer op. A median of 1.1 means the layer check's GEMMs run 10% slower than the
    table the GEMM predictor learns from, whatever the predictor.
    """
    gemm = layer_kernels(mixed_data.layer_table(mixed))
    gemm = gemm[np.isin(gemm["layer_op"], GEMM_OPS) & (gemm["num_tokens"] >= min_tokens)]
    table = mixed_data.gemm_table(mixed)[["gpu", "m", "n", "k", "latency_ms"]]
    both = gemm.merge(table.rename(columns={"latency_ms": "table_ms"}),
                      left_on=["gpu", "M", "N", "K"], right_on=["gpu", "m", "k", "n"])
    both["ratio"] = both["latency_ms"] / both["table_ms"]
    by = both.groupby("gpu", sort=False)["ratio"]
    out = pd.DataFrame({"shapes": by.size(), "median": by.median(),
                        "q25": by.quantile(0.25), "q75": by.quantile(0.75)})
    return out.join(both.pivot_table(index="gpu", columns="layer_op", values="ratio",
                                     aggfunc="median"))
