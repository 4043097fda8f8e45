"""16-bit kernels: BF16 GEMMs as ``F.linear`` runs them and scaled-dot-product attention
(prefill and decode), in the columns of aiconfigurator's tables.

Shapes are drawn with the seed from grids like aiconfigurator's: GEMM tokens ``m`` powers of two
up to 16384, widths ``n`` and reductions ``k`` from its list; attention batch, prompt length,
query and KV heads and head size of common models. A GEMM ``[m x k] @ [k x n]`` multiplies an
``m x k`` input by an ``n x k`` weight. Prefill attention is causal over ``isl`` tokens; decode
attention is one query token per sequence against ``kv`` cached tokens, written as
aiconfigurator writes it (``isl = 1``, ``step = kv - 1``). Attention runs through
``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention where PyTorch picks it),
grouped-query heads without copying the KV heads. On a GPU each shape is timed as a CUDA graph
of repeated calls, replayed (the kernels' own time, as aiconfigurator's tables record it).
"""
from __future__ import annotations

import numpy as np

from nslib.evaluation.collect import layout
from nslib.evaluation.collect.sweep import reps_for, rough_s, unmeasured
from nslib.evaluation.collect.timing import launches, main_launch, time_calls, time_graph

M_GRID = [2 ** i for i in range(15)]
NK_GRID = [128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192, 10240, 12288,
           14336, 16384, 28672]
BATCH = [1, 2, 4, 8, 16, 32, 64, 128]
SEQ = [128, 256, 512, 1024, 2048, 4096, 8192]
HEADS = [(8, 8), (16, 16), (32, 8), (32, 32), (40, 8), (64, 8), (64, 64)]  # (query, kv)
HEAD_DIM = [64, 128]
TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf")


def plan(seed: int = 0, n: int = 4000) -> list[dict]:
    """``n`` items in measuring order, the three tables interleaved."""
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[rng.integers(len(xs))]  # noqa: E731
    items = []
    for i in range(n):
        table = TABLES[i % 3]
        if table == "gemm_perf":
            items.append({"table": table, "m": pick(M_GRID), "n": pick(NK_GRID),
                          "k": pick(NK_GRID)})
        else:
            h, kvh = pick(HEADS)
            items.append({"table": table, "batch": pick(BATCH), "seq": pick(SEQ),
                          "heads": h, "kv_heads": kvh, "head_dim": pick(HEAD_DIM)})
    return items


def _cost(item: dict) -> tuple[float, float]:
    """(FLOPs, bytes) of one item at 2 bytes per element."""
    if item["table"] == "gemm_perf":
        m, n, k = (float(item[c]) for c in "mnk")
        return 2 * m * n * k, 2 * (m * k + n * k + m * n)
    b, s, h, kvh, d = (float(item[c]) for c in ("batch", "seq", "heads", "kv_heads", "head_dim"))
    if item["table"] == "context_attention_perf":
        return 2 * b * h * s * s * d, 2 * b * s * d * (2 * h + 2 * kvh)
    return 4 * b * h * s * d, 2 * b * d * (2 * h + 2 * kvh * s)


def _call(item: dict, device: str):
    import torch
    import torch.nn.functional as F

    kw = {"device": device, "dtype": torch.bfloat16}
    if item["table"] == "gemm_perf":
        x, w = torch.randn(item["m"], item["k"], **kw), torch.randn(item["n"], item["k"], **kw)
        return lambda: F.linear(x, w)
    b, s, h, kvh, d = (item[c] for c in ("batch", "seq", "heads", "kv_heads", "head_dim"))
    prefill = item["table"] == "context_attention_perf"
    q = torch.randn(b, h, s if prefill else 1, d, **kw)
    k, v = torch.randn(b, kvh, s, d, **kw), torch.randn(b, kvh, s, d, **kw)
    gqa = {"enable_gqa": True} if h != kvh else {}
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=prefill, **gqa)


def _row(item: dict, ms: float, kernel: str, common: dict) -> dict:
    if item["table"] == "gemm_perf":
        return {**common, "op_name": "gemm", "kernel_source": "torch.nn.functional.linear",
                "gemm_dtype": "bfloat16", "m": item["m"], "n": item["n"], "k": item["k"],
                "latency": ms, "kernel_name": kernel}
    prefill = item["table"] == "context_attention_perf"
    return {**common, "op_name": "context_attention" if prefill else "generation_attention",
            "kernel_source": "torch_sdpa", "batch_size": item["batch"],
            "isl": item["seq"] if prefill else 1, "num_heads": item["heads"],
            "num_key_value_heads": item["kv_heads"], "head_dim": item["head_dim"],
            "beam_width": 1, "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
            "step": 0 if prefill else item["seq"] - 1, "window_size": 0, "latency": ms,
            "kernel_name": kernel}


def measurer(clock, rates: dict, common: dict, mem_cap: float):
    """``measure(item)`` for :func:`nslib.evaluation.collect.sweep.run_plan`."""
    def measure(item):
        flops, nbytes = _cost(item)
        # at the probed 16-bit product rate (tensor cores: several times FP32; a CPU without
        # 16-bit units: slower than FP32, where FP32-based guesses let one product eat the
        # whole budget); a probe without it: 8x the FP32 rate
        bf16 = rates.get("bf16_flops_per_s") or 8 * rates["flops_per_s"]
        rough = rough_s(flops * rates["flops_per_s"] / bf16, nbytes, rates)
        if nbytes > mem_cap:
            return float("inf"), None

        def thunk():
            fn = _call(item, clock.device)
            ms, how = _time(fn, clock, rough)
            main = main_launch(launches(fn, clock))
            return {"table": item["table"], **_row(item, ms, main.name, common),
                    "timing": how}
        return rough, thunk
    return measure


def _time(fn, clock, rough: float) -> tuple[float, str]:
    """(median ms per call, how it was timed): replayed CUDA graphs on a GPU, as
    aiconfigurator's tables were timed (no host launch gap between kernels); plain events
    where a call cannot be captured, and the wall clock on the CPU."""
    if clock.cuda:
        import torch
        try:
            inner = int(min(20, max(1, round(200e-6 / max(rough, 1e-7)))))
            return float(np.median(time_graph(fn, clock, reps_for(rough), inner))), "cuda_graph"
        except RuntimeError:
            torch.cuda.synchronize(clock.device)
    return float(np.median(time_calls(fn, clock, reps_for(rough)))), (
        "cuda_events" if clock.cuda else "wall_clock")


_ATTENTION_KEY = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"]
KEY_COLUMNS = {"gemm_perf": ["m", "n", "k"], "context_attention_perf": _ATTENTION_KEY,
               "generation_attention_perf": _ATTENTION_KEY}


def key_of(item: dict) -> tuple:
    """The identity of an item in its written table: the table and its key columns' values
    (as strings), read off the row the item is written as."""
    row = _row(item, 0.0, "", {})
    return (item["table"], *(str(row[c]) for c in KEY_COLUMNS[item["table"]]))


def pending(items: list[dict], out, device: str, torch_version: str) -> list[dict]:
    """Items not yet written (a rerun resumes); duplicates of the plan dropped."""
    done = set()
    for t in TABLES:
        path = layout.tensor_table(out, device, t, torch_version)
        done |= {(t, *k) for k in layout.done_keys(path, KEY_COLUMNS[t])}
    return unmeasured(items, key_of, done)


def writer(out, device: str, torch_version: str):
    """``write(rows)``: each row to its table's parquet file."""
    targets = {t: (layout.tensor_table(out, device, t, torch_version), None) for t in TABLES}
    return lambda rows: layout.append_split(rows, "table", targets)
