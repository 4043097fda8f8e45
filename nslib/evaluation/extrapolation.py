"""Physical properties a kernel predictor's forecasts must keep on datasheets unlike any it was
trained on, checked on synthetic GPUs (no measurement needed).

- ``scale``: peak, bandwidth and board power all times k make a big kernel about k times
  faster;
- ``monotone``: more of one resource (bandwidth, FP32 peak, L2, memory, board power, more SMs
  of the same kind, or more FP32 lanes per SM at the same clock) never makes a kernel slower;
- ``balance``: on a GPU with 5x the FLOP/byte balance of every training GPU (and the power for
  its peak), no kernel beats
  the roofline, and big memory-bound kernels stay near bytes / bandwidth and big GEMMs within
  a sane factor of their roofline (small ones keep their launch cost, which no datasheet
  figure removes).

Kernels carry a fixed tile: which tile a library picks is a discrete heuristic; these checks
are about the law that turns a tile and a datasheet into time. :func:`property_checks`
returns one row per (check, kernel) with the measured ratio and whether it passes.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.units import GHZ_PER_MHZ
from nslib.kernels import sizes

# One synthetic datasheet (SMs, GFLOP/s, GB/s, GB, MB, W) from which the others are derived.
BASE = {"num_sm": 80.0, "peak_gflops": 14000.0, "mem_bw": 900.0, "mem_gb": 32.0, "l2_mb": 6.0,
        "tdp_w": 150.0}
BASE_LANES = 64           # FP32 lanes per SM of BASE; its clock follows from its peak
_NAN = np.nan
# name, cls, op, B, M, N, K, H, tile_m, tile_k, tile, big (launch costs negligible)
KERNELS = [
    ("big GEMM", "linear", "linear", 1, 8192, 4096, 8192, _NAN, 128, 128, _NAN, True),
    ("mid GEMM", "linear", "linear", 1, 512, 1024, 1024, _NAN, 64, 64, _NAN, False),
    ("tiny GEMM", "linear", "linear", 1, 16, 256, 256, _NAN, 32, 32, _NAN, False),
    ("attention scores", "bmm", "bmm", 64, 1024, 64, 1024, _NAN, 128, 64, _NAN, True),
    ("small bmm", "bmm", "bmm", 256, 64, 64, 64, _NAN, 32, 32, _NAN, False),
    ("big add", "elementwise", "add", 65536, _NAN, _NAN, _NAN, 4096, _NAN, _NAN, 2048, True),
    ("small gelu", "elementwise", "gelu", 256, _NAN, _NAN, _NAN, 1024, _NAN, _NAN, 512, False),
    ("big softmax", "softmax", "softmax", 65536, _NAN, _NAN, _NAN, 2048, _NAN, _NAN, _NAN, True),
    ("small softmax", "softmax", "softmax", 512, _NAN, _NAN, _NAN, 128, _NAN, _NAN, _NAN, False),
    ("big layernorm", "layernorm", "ln", 65536, _NAN, _NAN, _NAN, 2048, _NAN, _NAN, _NAN, True),
    ("small layernorm", "layernorm", "ln", 512, _NAN, _NAN, _NAN, 1024, _NAN, _NAN, _NAN, False),
]
SCALES = (2.0, 4.0)
MORE = {"mem_bw": (1.5, 3.0, 10.0), "peak_gflops": (1.5, 3.0, 10.0), "l2_mb": (2.0, 8.0, 40.0),
        "mem_gb": (2.0, 4.0), "num_sm": (1.5, 2.0, 4.0), "lanes": (2.0, 4.0),
        "tdp_w": (1.5, 3.0, 10.0)}
SCALE_TOL = 0.15          # big kernels: time ratio within 15% of k
MEMORY_FACTOR = 3.0       # memory-bound: at most 3x bytes / bandwidth (training GPUs: 1.1-2.6x)
GEMM_FACTOR = 6.0         # GEMMs: at most 6x their roofline (training GPUs' large ones: 1-3x)


def kernel_frame(classes=None, **gpu) -> pd.DataFrame:
    """The check kernels (of ``classes``, default all) on ``BASE`` updated by ``gpu``. The
    clock (``clock_mhz``, MHz), unless given, is what the peak takes with ``BASE_LANES`` FP32
    lanes per SM: more peak per SM is a faster clock, not more lanes."""
    cols = ["name", "cls", "op", "B", "M", "N", "K", "H", "tile_m", "tile_k", "tile", "big"]
    f = pd.DataFrame(KERNELS, columns=cols)
    if classes is not None:
        f = f[f["cls"].isin(list(classes))].reset_index(drop=True)
    for c in ["B", "M", "N", "K", "H", "tile_m", "tile_k", "tile"]:
        f[c] = f[c].astype(float)
    sheet = {**BASE, **gpu}
    sheet.setdefault("clock_mhz", _clock_mhz(sheet))
    for k, v in sheet.items():
        f[k] = float(v)
    return sizes.add_features(f)


def _clock_mhz(sheet: dict) -> float:
    """The clock (MHz) at which ``sheet``'s SMs of ``BASE_LANES`` FP32 lanes reach its peak
    (two FLOP per lane a clock)."""
    return sheet["peak_gflops"] / (2 * BASE_LANES * sheet["num_sm"]) / GHZ_PER_MHZ


def _more(field: str, factor: float) -> dict:
    """A datasheet with more of one resource; more SMs are SMs of the same kind (peak too)
    with their share of the L2 (more SMs sharing one L2 hold more rows in flight in it, and a
    long softmax row may then be read again from DRAM: :mod:`nslib.kernels.row_cache`); more
    lanes per SM raise the peak at the base clock."""
    if field == "lanes":
        return {"peak_gflops": BASE["peak_gflops"] * factor, "clock_mhz": _clock_mhz(BASE)}
    if field == "num_sm":
        return {"num_sm": BASE["num_sm"] * factor, "peak_gflops": BASE["peak_gflops"] * factor,
                "l2_mb": BASE["l2_mb"] * factor}
    return {field: BASE[field] * factor}


def property_checks(pred, classes=None, train_balance: float | None = None) -> pd.DataFrame:
    """Rows ``check, kernel, cls, value, limit, ok`` for a fitted predictor ``pred``.

    ``train_balance``: the largest FP32 FLOP per byte of the training GPUs (peak / bandwidth,
    ``nslib.predictors.gpu_range.training_ranges()["ranges"]["FLOP/byte"][1]``); the balance check
    uses a GPU with 5x it.
    """
    base = kernel_frame(classes)
    t0 = pred.predict(base)
    rows = []
    for k in SCALES:
        t = pred.predict(kernel_frame(classes, peak_gflops=BASE["peak_gflops"] * k,
                                      mem_bw=BASE["mem_bw"] * k, tdp_w=BASE["tdp_w"] * k))
        for i in np.flatnonzero(base["big"].to_numpy()):
            r = t0[i] / t[i]
            rows.append(("scale x%g" % k, i, r, k, abs(r / k - 1) <= SCALE_TOL))
    for field, factors in MORE.items():
        prev = t0
        for f in factors:
            t = pred.predict(kernel_frame(classes, **_more(field, f)))
            for i in range(len(base)):
                rows.append((f"more {field} x{f:g}", i, t[i] / prev[i], 1.0,
                             t[i] <= prev[i] * (1 + 1e-6)))
            prev = t
    if train_balance is not None:
        rows += _balance_rows(pred, classes, train_balance)
    df = pd.DataFrame(rows, columns=["check", "row", "value", "limit", "ok"])
    df["kernel"], df["cls"] = base["name"].to_numpy()[df["row"]], base["cls"].to_numpy()[df["row"]]
    return df[["check", "kernel", "cls", "value", "limit", "ok"]]


def _balance_rows(pred, classes, train_balance: float) -> list:
    peak = 5 * train_balance * BASE["mem_bw"]
    f = kernel_frame(classes, peak_gflops=peak, tdp_w=BASE["tdp_w"] * peak / BASE["peak_gflops"])
    t, roof = pred.predict(f), sizes.roofline_ms(f)
    mem_ms = f["bytes"].to_numpy(float) / (f["mem_bw"].to_numpy(float) * 1e9) * 1e3
    rows = []
    for i in range(len(f)):
        rows.append(("5x balance: not below the roofline", i, t[i] / roof[i], 1.0,
                     t[i] >= roof[i] * (1 - 1e-9)))
        if f["cls"].iat[i] in sizes.VECTOR_CLASSES and f["big"].iat[i]:
            rows.append(("5x balance: memory-bound near bytes/bandwidth", i, t[i] / mem_ms[i],
                         MEMORY_FACTOR, t[i] <= MEMORY_FACTOR * mem_ms[i]))
        if f["cls"].iat[i] in sizes.GEMM_CLASSES and f["big"].iat[i]:
            rows.append(("5x balance: GEMM within a factor of its roofline", i, t[i] / roof[i],
                         GEMM_FACTOR, t[i] <= GEMM_FACTOR * roof[i]))
    return rows

