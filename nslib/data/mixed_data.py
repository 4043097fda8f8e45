"""The 16-bit measurements (``NSLIB_MIXED``) as tidy frames, one row per measured kernel.

Three tables, read from the public repositories' own layouts (see the data folder's README):

- :func:`gemm_table`: BF16 GEMMs ``[m x k] @ [k x n]`` as ``torch.nn.functional.linear`` runs
  them (aiconfigurator), ``latency_ms`` in ms.
- :func:`attention_table`: FlashAttention prefill (``q_len == kv_len``, causal) and decode
  (one query token against ``kv_len`` cached ones) with BF16 activations and KV cache.
- :func:`layer_table`: fp16 per-op timings of real transformer layers (vidur), long format.

Every row carries its GPU's datasheet columns (``gpu`` is the ``Device`` string, plus
``num_sm``, ``peak_gflops`` FP32, ``bf16_gflops`` tensor-core, ``mem_bw`` GB/s, ``mem_gb``,
``l2_mb``, ``clock_mhz`` the datasheet's SM clock, MHz). Which GPUs are measured comes from the
files found, never from a list in code, so a GPU's tables and datasheet dropped into a copy of the
folder join every table.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from nslib.data.gpus import GPU, find_gpu, load_mixed_gpus
from nslib.data.paths import DataNotFoundError, hash_files, mixed_root

AIC_SYSTEMS = Path("aiconfigurator") / "aic-core" / "src" / "aiconfigurator_core" / "systems"
VIDUR = Path("vidur") / "data" / "profiling" / "compute"
# vidur's op columns, in a layer's order (time_stats.<op>.median, ms)
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
LAYER_PARAMS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                "use_gated_mlp")
GPU_COLUMNS = ("gpu", "num_sm", "peak_gflops", "bf16_gflops", "mem_bw", "mem_gb", "l2_mb",
               "clock_mhz")


def _version_key(path: Path) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.\-]", path.name))


def _newest_tables(root: Path, kind: str, filename: str) -> list[Path]:
    """Per GPU folder, ``<kind>/<framework>/<newest version>/<filename>``."""
    out = []
    for gpu_dir in sorted((root / AIC_SYSTEMS / "data").glob("*")):
        versions = [p for p in gpu_dir.glob(f"{kind}/*/*") if (p / filename).is_file()]
        if versions:
            out.append(max(versions, key=_version_key) / filename)
    return out


def gpu_frame(gpus: dict[str, GPU] | list[GPU]) -> pd.DataFrame:
    """One row per GPU with the datasheet columns every table carries (``bf16_gflops`` NaN
    where a datasheet has none)."""
    vals = gpus.values() if isinstance(gpus, dict) else gpus
    return pd.DataFrame([{**g.columns(), "clock_mhz": g.clock_mhz,
                          "bf16_gflops": g.bf16_gflops if g.bf16_gflops else np.nan}
                         for g in vals], columns=list(GPU_COLUMNS))


def _join_datasheets(frame: pd.DataFrame, gpus: dict[str, GPU], what: str,
                     root: Path) -> pd.DataFrame:
    known = {g.name for g in gpus.values()}
    missing = sorted(set(frame["gpu"]) - known)
    if missing:
        raise DataNotFoundError(
            f"{what} measured on {missing} but {root / 'device_configs'} has no datasheet "
            "whose 'Device' is that name: add one (NeuSight JSON format plus Bf16FLOPs)")
    return frame.merge(gpu_frame(gpus), on="gpu", how="left")


def _read(path: Path, columns: list[str]) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - any reader error means a damaged file
        raise ValueError(f"{path}: cannot read the table ({type(e).__name__}: {e}); "
                         "fetch it again (`nslib fetch --mixed --force`)") from None
    lacking = [c for c in columns if c not in frame.columns]
    if lacking:
        raise ValueError(f"{path}: missing column(s) {lacking}; is this an aiconfigurator "
                         "table at the pinned commit?")
    return frame


@lru_cache(maxsize=4)
def _gemm(root: Path) -> pd.DataFrame:
    parts = []
    for path in _newest_tables(root, "gemm", "gemm_perf.parquet"):
        t = _read(path, ["device", "gemm_dtype", "m", "n", "k", "latency"])
        t = t[t["gemm_dtype"] == "bfloat16"]
        parts.append(pd.DataFrame({"gpu": t["device"].astype(str), "m": t["m"].astype(float),
                                   "n": t["n"].astype(float), "k": t["k"].astype(float),
                                   "latency_ms": t["latency"].astype(float)}))
    if not parts:
        raise DataNotFoundError(f"no GEMM tables (gemm_perf.parquet) under {root / AIC_SYSTEMS}")
    frame = pd.concat(parts, ignore_index=True)
    frame = frame[frame["latency_ms"] > 0].drop_duplicates(["gpu", "m", "n", "k"])
    return _join_datasheets(frame, load_mixed_gpus(root), "BF16 GEMMs", root)


def gemm_table(mixed: str | os.PathLike | None = None) -> pd.DataFrame:
    """BF16 GEMMs of every measured GPU: ``gpu, m, n, k, latency_ms`` plus datasheet columns.

    ``m`` is the token count, ``k`` the reduction length, ``n`` the output width
    (``[m x k] @ [k x n]``); FLOPs ``2 m n k``.
    """
    return _gemm(mixed_root(mixed)).copy()


def _flash_source(sources: pd.Series) -> pd.Series:
    """Per GPU, the FlashAttention build with the most measurements (the GPU's default one);
    a table without any FlashAttention build keeps its most measured kernel instead, so every
    measured GPU joins the attention table."""
    fa = sources[sources.str.startswith("vllm_flash_attn")]
    return (fa if len(fa) else sources).value_counts().index[:1]


@lru_cache(maxsize=4)
def _attention(root: Path) -> pd.DataFrame:
    parts = []
    cols = ["device", "kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
            "head_dim", "attn_dtype", "kv_cache_dtype", "step", "latency"]
    for phase, name in (("prefill", "context_attention_perf.parquet"),
                        ("decode", "generation_attention_perf.parquet")):
        for path in _newest_tables(root, "attention", name):
            t = _read(path, cols)
            keep = (t["attn_dtype"] == "bfloat16") & (t["kv_cache_dtype"] == "bfloat16")
            if "window_size" in t:
                keep &= t["window_size"].fillna(0) == 0  # full attention, no sliding window
            t = t[keep & t["kernel_source"].isin(_flash_source(t["kernel_source"].astype(str)))]
            isl = t["isl"].astype(float)
            kv = isl if phase == "prefill" else isl + t["step"].astype(float)
            parts.append(pd.DataFrame({
                "gpu": t["device"].astype(str), "phase": phase,
                "kernel_source": t["kernel_source"].astype(str),
                "batch": t["batch_size"].astype(float),
                "q_len": isl if phase == "prefill" else 1.0, "kv_len": kv,
                "heads": t["num_heads"].astype(float),
                "kv_heads": t["num_key_value_heads"].astype(float),
                "head_dim": t["head_dim"].astype(float), "causal": phase == "prefill",
                "latency_ms": t["latency"].astype(float)}))
    if not parts:
        raise DataNotFoundError(f"no attention tables under {root / AIC_SYSTEMS}")
    frame = pd.concat(parts, ignore_index=True)
    key = ["gpu", "phase", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim"]
    frame = frame[frame["latency_ms"] > 0].groupby(key, as_index=False, sort=False).agg(
        {"kernel_source": "first", "causal": "first", "latency_ms": "median"})
    return _join_datasheets(frame, load_mixed_gpus(root), "attention kernels", root)


def attention_table(mixed: str | os.PathLike | None = None) -> pd.DataFrame:
    """FlashAttention kernels (BF16, BF16 KV cache, no sliding window) of every measured GPU.

    Columns ``gpu, phase`` (``prefill``/``decode``), ``batch, q_len, kv_len, heads, kv_heads,
    head_dim, causal, kernel_source, latency_ms`` plus the datasheet columns. Decode rows are
    one new token per sequence against ``kv_len = isl + step`` cached tokens.
    """
    return _attention(mixed_root(mixed)).copy()


@lru_cache(maxsize=4)
def _layers(root: Path) -> pd.DataFrame:
    gpus = load_mixed_gpus(root)
    parts = []
    for path in sorted((root / VIDUR).glob("*/*/*/mlp.csv")):
        folder = path.parts[-4]
        try:
            gpu = find_gpu(folder, gpus)
        except KeyError as e:
            raise DataNotFoundError(f"vidur folder {folder!r} ({path.parent}) names no GPU of "
                                    f"{root / 'device_configs'}: {e.args[0]}") from None
        t = pd.read_csv(path)
        need = list(LAYER_PARAMS) + ["num_tokens", "num_tensor_parallel_workers"]
        lacking = [c for c in need if c not in t.columns]
        ops = [f"time_stats.{op}.median" for op in LAYER_OPS]
        if lacking or not any(c in t.columns for c in ops):
            raise ValueError(f"{path}: missing column(s) {lacking[:4] or ops[:2]}; is this "
                             "vidur's mlp.csv at the pinned commit?")
        # a layer without an op (phi-2 has no post-attention norm) has no column for it
        wide = t[need + [c for c in ops if c in t.columns]].rename(columns={"num_tensor_parallel_workers": "tp"})
        wide.insert(0, "model", f"{path.parts[-3]}/{path.parts[-2]}")
        wide.insert(0, "gpu", gpu.name)
        parts.append(wide)
    if not parts:
        raise DataNotFoundError(f"no vidur layer tables (*/*/*/mlp.csv) under {root / VIDUR}")
    wide = pd.concat(parts, ignore_index=True)
    ids = ["gpu", "model", "num_tokens", "tp", *LAYER_PARAMS]
    long = wide.melt(id_vars=ids, var_name="op", value_name="latency_ms")
    long["op"] = long["op"].str.removeprefix("time_stats.").str.removesuffix(".median")
    long = long.dropna(subset=["latency_ms"])
    # some (model, tokens, TP) points were profiled more than once: keep their median
    long = long.groupby(ids + ["op"], as_index=False, sort=False)["latency_ms"].median()
    return long.merge(gpu_frame(gpus), on="gpu", how="left")


def layer_table(mixed: str | os.PathLike | None = None) -> pd.DataFrame:
    """vidur's fp16 per-op layer timings, long format: ``gpu, model, num_tokens, tp``, the
    model's shape (``n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size, use_gated_mlp``),
    ``op`` (one of :data:`LAYER_OPS`), ``latency_ms`` (the median) and the datasheet columns."""
    return _layers(mixed_root(mixed)).copy()


def measured_gpus(table: pd.DataFrame) -> list[str]:
    """The GPUs (Device names) with rows in ``table``, in order of first appearance."""
    return list(dict.fromkeys(table["gpu"]))


TABLE_FILES = {"gemm": ("gemm_perf.parquet",),
               "attention": ("context_attention_perf.parquet",
                             "generation_attention_perf.parquet")}


def table_files(kind: str, mixed: str | os.PathLike | None = None) -> list[Path]:
    """The files a kind's table is read from (``gemm`` or ``attention``: the newest version per
    GPU) and every datasheet, in a fixed order: what a trained 16-bit predictor depends on."""
    root = mixed_root(mixed)
    files = sorted((root / "device_configs").glob("*.json"))
    for name in TABLE_FILES[kind]:
        files += _newest_tables(root, "gemm" if kind == "gemm" else "attention", name)
    return files


def mixed_files(mixed: str | os.PathLike | None = None) -> list[Path]:
    """Every file the tables above read: datasheets, the newest GEMM and attention tables per
    GPU, and the vidur layer tables, in a fixed order."""
    root = mixed_root(mixed)
    files = sorted((root / "device_configs").glob("*.json"))
    for kind, name in (("gemm", "gemm_perf.parquet"),
                       ("attention", "context_attention_perf.parquet"),
                       ("attention", "generation_attention_perf.parquet")):
        files += _newest_tables(root, kind, name)
    return files + sorted((root / VIDUR).glob("*/*/*/mlp.csv"))


def mixed_hash(mixed: str | os.PathLike | None = None) -> str:
    """Content hash of the 16-bit data (names the data a 16-bit result came from)."""
    root = mixed_root(mixed)
    return hash_files(mixed_files(root), extra=[str(p.relative_to(root)) for p in
                                                 mixed_files(root)])
