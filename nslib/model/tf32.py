"""PyTorch's TF32 convolutions on tensor cores (opt-in: ``tf32=True``; docs/decisions.md,
"TF32 convolutions").

PyTorch lets cuDNN run FP32 convolutions in TF32 on the tensor cores by default
(``torch.backends.cudnn.allow_tf32``), not matmuls. Where a datasheet gives the tensor-core
peak (``Bf16FLOPs``), the implicit GEMM of an FP32 convolution (:func:`tf32_rows`) is priced by
the 16-bit GEMM predictor on the datasheet's TF32 twin (:func:`tf32_sheet`, :func:`tf32_ms`);
the step takes the faster of that and its FP32 price
(:func:`nslib.model.module_predict.priced_frame`). Units: GFLOP/s, GB/s, MB, ms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.gpus import GPU
from nslib.data.paths import DataNotFoundError
from nslib.data.settings import Settings
from nslib.data.units import MIB
from nslib.model.stream import datasheet_columns, gemm_inputs
from nslib.predictors import trained

# TF32 tensor-core math runs at half the dense BF16/FP16 rate on every NVIDIA part that has
# both (vendor datasheets, dense TF32 / BF16 TFLOP/s: A100 156 / 312, H100 SXM 495 / 989,
# A40 74.8 / 149.7, L40S 183 / 362, RTX A6000 77.4 / 154.8): a TF32 operand takes twice a
# 16-bit one's datapath width. A GPU without BF16 tensor cores has no TF32 either.
TF32_PER_BF16 = 0.5
TWIN_BYTES = 2.0   # bytes per element of the TF32 twin's GEMM (the 16-bit predictor's)


def tf32_peak(gpu) -> float | None:
    """Dense tensor-core TF32 peak of ``gpu``, GFLOP/s (:data:`TF32_PER_BF16` of its
    ``Bf16FLOPs``), or None when its datasheet gives no tensor-core figure."""
    return None if gpu.bf16_gflops is None else TF32_PER_BF16 * gpu.bf16_gflops


def tf32_sheet(gpu) -> dict:
    """The 16-bit GEMM predictor's datasheet columns of ``gpu``'s TF32 twin: a TF32 GEMM
    moves 4 bytes per element at the TF32 tensor rate, so it is the 16-bit GEMM of the same
    shape on a GPU with the TF32 peak as its BF16 peak, half the bandwidth and half the L2
    (every term of the law, compute, DRAM, L2 and tile loads, takes the same time; the
    fixed cost is in clocks). A ValueError when the datasheet has no tensor-core figure."""
    sheet = datasheet_columns(gpu)
    sheet.update(bf16_gflops=tf32_peak(gpu), mem_bw=sheet["mem_bw"] / 2.0,
                 l2_mb=sheet["l2_mb"] / 2.0)
    return sheet


def tf32_ms(frame: pd.DataFrame, gpu, gemm_pred) -> np.ndarray:
    """Kernel time (ms) of the rows of ``frame`` flagged ``tf32`` (cuDNN's convolutions on
    tensor cores, :func:`tf32_rows`) by the 16-bit GEMM predictor on
    ``gpu``'s TF32 twin (:func:`tf32_sheet`); NaN on the other rows.

    An implicit GEMM never writes its ``m x k`` operand: it reads the input once from DRAM
    and re-reads the overlapping windows from L2. Where a row gives the elements it moves in
    DRAM (``dram_elems``, :data:`nslib.model.kernel_rows.CONV_COLUMNS`), the GEMM's further
    elements are L2-resident: the twin's L2 grows by their bytes, so the law's DRAM term
    counts the input, filters and output, and its L2 term the re-reads."""
    out = np.full(len(frame), np.nan)
    rows = frame["tf32"].to_numpy(bool) if "tf32" in frame.columns else np.zeros(len(frame), bool)
    if not rows.any():
        return out
    gemm = gemm_inputs(frame[rows]).assign(**tf32_sheet(gpu)).reset_index(drop=True)
    if "dram_elems" in frame.columns:
        moved = frame.loc[rows, "dram_elems"].to_numpy(float)
        m, n, k = (gemm[c].to_numpy(float) for c in "mnk")
        again = np.where(np.isfinite(moved), np.maximum(m * k + k * n + m * n - moved, 0.0), 0.0)
        gemm["l2_mb"] = gemm["l2_mb"] + TWIN_BYTES * again / MIB
    out[rows] = gemm_pred.predict(gemm)
    return out


# the aten ops cuDNN runs as convolutions (forward and backward)
CONV_ATEN = ("aten.convolution.", "aten.convolution_backward.")


def tf32_rows(trace: pd.DataFrame, gpu: GPU) -> np.ndarray:
    """Per row of ``trace``, whether PyTorch lets cuDNN run it in TF32 on ``gpu``'s tensor
    cores: the implicit GEMM of a convolution (forward or backward) with FP32 operands (the
    rows a module trace gives ``dram_elems``), on a GPU whose datasheet gives a tensor-core
    peak (:func:`tf32_peak`).
    PyTorch allows TF32 in cuDNN by default (``torch.backends.cudnn.allow_tf32``) and not in
    matmuls (``torch.backends.cuda.matmul.allow_tf32``), so every other GEMM stays FP32, as do
    grouped convolutions (``bmm`` rows: depthwise ones have too few channels per group for
    a tensor-core tile) and Winograd's products (cuDNN's FP32 Winograd runs on the CUDA
    cores)."""
    if tf32_peak(gpu) is None or not len(trace) or "dram_elems" not in trace.columns:
        return np.zeros(len(trace), bool)
    # dram_elems: a module trace's FP32 convolutions (kernel_rows.CONV_COLUMNS)
    return (trace["aten"].astype(str).str.startswith(CONV_ATEN) & (trace["cls"] == "linear")
            & trace["dram_elems"].notna()).to_numpy()


def tensor_for(predictor) -> str:
    """The 16-bit GEMM predictor that stands beside FP32 predictor ``predictor`` (for the
    TF32 convolutions, :func:`tf32_gpu_ms`): the one of the same name when registered (nslib's
    design, the roofline and the baselines), else nslib's."""
    from nslib.predictors import names

    return predictor if isinstance(predictor, str) and predictor in names("gemm") else "nslib"


def tensor_gemm(name: str, settings: Settings | None = None):
    """The 16-bit GEMM predictor ``name`` trained on the 16-bit data of ``settings`` (its
    quick profile and progress bars; cached); :class:`DataNotFoundError` without that data."""
    s = settings or Settings()
    return trained(name, Settings(quick=s.quick, mixed=s.mixed, progress=s.progress),
                   kind="gemm")


def tf32_gpu_ms(frame: pd.DataFrame, gpu: GPU, tensor_predictor="nslib",
                settings: Settings | None = None) -> tuple[np.ndarray | None, list[str]]:
    """(GPU time, ms, of the rows of ``frame`` flagged ``tf32`` by the 16-bit GEMM predictor
    ``tensor_predictor`` (a registered name, trained on the 16-bit data, or a fitted one) on
    ``gpu``'s TF32 twin (:func:`tf32_ms`), NaN on the other rows; or None
    when no row is flagged, warnings). Without the 16-bit data the flagged rows keep their
    FP32 price and a warning says so."""
    if "tf32" not in frame.columns or not frame["tf32"].any():
        return None, []
    gemm = tensor_predictor
    if isinstance(tensor_predictor, str):
        try:
            gemm = tensor_gemm(tensor_predictor, settings)
        except DataNotFoundError as err:
            return None, [f"TF32 convolutions priced as FP32: the 16-bit GEMM predictor "
                          f"needs the 16-bit data ({err})"]
    return tf32_ms(frame, gpu, gemm), []
