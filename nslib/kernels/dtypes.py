"""Number formats a kernel can run in: bytes per element and which peak bounds it.

FP32 is the paper's format and the default everywhere. BF16 and FP16 GEMMs and attention run on
the tensor cores (datasheet ``Bf16FLOPs``; FP16 has the same dense rate on the GPUs in the
data), while 16-bit elementwise and normalisation kernels are bandwidth-bound and only move
half the bytes of their FP32 versions.
"""
from __future__ import annotations

DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}  # name -> bytes per element
HALF = ("bf16", "fp16")
TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
           "half": "fp16"}


def check_dtype(dtype: str) -> str:
    """The canonical name (``fp32``, ``bf16``, ``fp16``) of ``dtype``; ValueError naming the
    accepted ones otherwise (``bfloat16``, ``float16`` and ``float32`` are accepted too)."""
    name = ALIASES.get(str(dtype).strip().lower(), str(dtype).strip().lower())
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return name


def bytes_per_elem(dtype: str) -> int:
    """Bytes one element of ``dtype`` takes in memory (4 for fp32, 2 for bf16 and fp16)."""
    return DTYPES[check_dtype(dtype)]


def matmul_peak_gflops(gpu, dtype: str) -> float:
    """The peak (GFLOP/s) that bounds a GEMM or attention kernel of ``dtype`` on ``gpu``:
    the FP32 non-tensor peak for fp32, the dense tensor-core peak for 16-bit formats (a clear
    error if the datasheet lacks ``Bf16FLOPs``)."""
    return gpu.bf16_peak() if check_dtype(dtype) in HALF else gpu.peak_gflops
