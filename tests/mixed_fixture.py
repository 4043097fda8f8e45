"""A small fake 16-bit data folder in the real layouts (aiconfigurator, vidur, datasheets).

Latencies follow a known law (the roofline over a fixed efficiency, plus 5 us), so tests can
check loaders and predictors against hand arithmetic without the real data.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

SYSTEMS = Path("aiconfigurator/aic-core/src/aiconfigurator_core/systems/data")
SHEETS = {
    "gpu_a": {"Device": "Fake GPU A", "Dev_Mem": 80, "Mem_Bw": 2000, "Num_Sm": 100,
              "Core_Per_SM": 64, "Freq": 1400, "SingleFLOPs": 20000, "L2Cache": 40,
              "Bf16FLOPs": 300000},
    "gpu_b": {"Device": "Fake GPU B", "Dev_Mem": 48, "Mem_Bw": 900, "Num_Sm": 140,
              "Core_Per_SM": 128, "Freq": 2500, "SingleFLOPs": 90000, "L2Cache": 96,
              "Bf16FLOPs": 360000},
    "gpu_c": {"Device": "Fake GPU C", "Dev_Mem": 80, "Mem_Bw": 3400, "Num_Sm": 132,
              "Core_Per_SM": 128, "Freq": 1980, "SingleFLOPs": 67000, "L2Cache": 50,
              "Bf16FLOPs": 990000},
}
EFFICIENCY = 0.7


def gemm_ms(sheet: dict, m, n, k) -> np.ndarray:
    """The law the fake GEMM latencies follow, ms."""
    flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    roof = np.maximum(flops / (sheet["Bf16FLOPs"] * 1e9), nbytes / (sheet["Mem_Bw"] * 1e9))
    return 1e3 * roof / EFFICIENCY + 0.005


def _gemm(sheet: dict, version: str) -> pd.DataFrame:
    sizes = np.array([16, 128, 1024, 4096])
    m, n, k = (a.ravel().astype(np.int64) for a in np.meshgrid(sizes, sizes, sizes))
    rows = pd.DataFrame({"framework": "VLLM", "version": version, "device": sheet["Device"],
                         "op_name": "gemm", "kernel_source": "torch.nn.functional.linear",
                         "gemm_dtype": "bfloat16", "m": m, "n": n, "k": k,
                         "latency": gemm_ms(sheet, m, n, k)})
    fp8 = rows.head(5).assign(gemm_dtype="fp8", latency=1.0)  # other dtypes are dropped
    return pd.concat([rows, fp8], ignore_index=True)


def _attention(sheet: dict, phase: str) -> pd.DataFrame:
    b, h, s = (a.ravel() for a in np.meshgrid([1, 8], [8, 32], [128, 2048]))
    decode = phase == "decode"
    rows = pd.DataFrame({"framework": "VLLM", "version": "0.1", "device": sheet["Device"],
                         "op_name": phase, "kernel_source": "vllm_flash_attn_fa2",
                         "batch_size": b, "isl": 1 if decode else s, "num_heads": h,
                         "num_key_value_heads": 8, "head_dim": 128, "beam_width": 1,
                         "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
                         "step": s - 1 if decode else 0, "window_size": 0,
                         "latency": 0.01 + b * h * s * 1e-6})
    other = rows.head(3).assign(kv_cache_dtype="fp8")
    return pd.concat([rows, other], ignore_index=True)


def write_gpu(root: Path, stem: str, sheet: dict, tables: bool = True) -> None:
    """One GPU's datasheet (and, with ``tables``, its GEMM and attention tables)."""
    (root / "device_configs").mkdir(parents=True, exist_ok=True)
    (root / "device_configs" / f"{stem}.json").write_text(json.dumps(sheet))
    if not tables:
        return
    base = root / SYSTEMS / stem
    for old in ("0.9.0", "0.10.0"):  # the newest version folder is the one read
        path = base / "gemm" / "vllm" / old
        path.mkdir(parents=True)
        frame = _gemm(sheet, old)
        if old == "0.9.0":
            frame["latency"] = 99.0
        frame.to_parquet(path / "gemm_perf.parquet")
    att = base / "attention" / "vllm" / "0.1"
    att.mkdir(parents=True)
    _attention(sheet, "prefill").to_parquet(att / "context_attention_perf.parquet")
    _attention(sheet, "decode").to_parquet(att / "generation_attention_perf.parquet")


def write_mixed(root: Path, gpus=("gpu_a", "gpu_b", "gpu_c")) -> Path:
    """A fake mixed-data folder with the named GPUs of :data:`SHEETS`."""
    for stem in gpus:
        write_gpu(root, stem, SHEETS[stem])
    layer = root / "vidur/data/profiling/compute/fake gpu a/org/model-1"
    layer.mkdir(parents=True)
    pd.DataFrame({"time_stats.input_layernorm.median": [0.01, 0.02],
                  "time_stats.attn_pre_proj.median": [0.1, 0.3],
                  "n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
                  "vocab_size": 128256, "use_gated_mlp": True, "num_tokens": [256, 512],
                  "num_tensor_parallel_workers": 1}).to_csv(layer / "mlp.csv", index=False)
    return root
