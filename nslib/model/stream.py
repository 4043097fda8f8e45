"""From microbenchmark latencies to latencies inside a model's kernel stream.

Every training kernel was timed on its own: the measured latency is the host's dispatch of one
op (Python, ATen, the launch: a floor of about 25-50 us on the measurement hosts, whatever the
kernel) followed by the kernel's GPU time. Kernel predictors learn that sum. Inside a model,
the host dispatches the next kernels while the GPU runs the current one, so a kernel costs its
GPU time, down to a launch gap of a few microseconds. Summing microbenchmark-like predictions
therefore charges every one of a model's ~1,000-3,000 small kernels the floor again, which
overpredicts small-batch training and models with many small ops (Switch-XL) by 20-60%.

:func:`stream_ms` removes the floor: ``max(pred - floor, roofline, launch)``. ``floor`` is the
same predictor's latency, on the same GPU, of the smallest measured elementwise kernel, times
the class's floor ratio: how much longer the smallest measured kernel of that class took than
the smallest elementwise one on the same training GPU (the median over the training GPUs;
e.g. about 1.8 for linear, whose op does more on the host). Softmax and layer norm are one ATen
op and one launch like an elementwise op and share its floor (ratio 1): the extra time of their
smallest kernels is the GPU time of their reductions. Both come from the data, for any
predictor. Only the elementwise prediction is extrapolated to a new GPU, and it is a
launch time under every NeuSight law; the GEMM MLPs' own tiny-kernel extrapolations put the
H100's GEMM floors at 53-67 us and took too much off mid-size GEMMs. ``roofline`` keeps the
result physical and ``launch`` (``launch_us``, default :data:`LAUNCH_US`) is the gap between
back-to-back kernels. ``launch_us=None`` keeps the plain sum of microbenchmark latencies (the
original tool's aggregation). A step is still no faster than its host can issue it
(:func:`step_ms`, :func:`host_bound`): when a phase's floors sum to more than its kernels' GPU
time (small kernels on a fast GPU), the phase takes the floors' sum. Units: ms throughout,
``launch_us`` in microseconds.

**16-bit rows**: :mod:`nslib.model.stream16` prices a 16-bit trace's tensor-core kernels;
:func:`stream_ms` takes them from there.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from nslib.data.cache import cached
from nslib.data.paths import data_root, hash_files
from nslib.kernels import measured, power, row_latency, sizes
# the 16-bit rows' pricing, kept importable from here too
from nslib.model.stream16 import (TENSOR_KINDS, attention_inputs, datasheet_columns,  # noqa: F401
                                  fp32_equivalent, gemm_inputs, tensor_masks, tensor_ms,
                                  tensor_predictors)

# Back-to-back kernel launch gap on the GPU, us (a few us on CUDA GPUs). Not fitted: the
# mean end-to-end errors moved by under half a point between 3 and 6 us when this was tried.
LAUNCH_US = 3.0
# A kernel launched from C++ inside an operator call costs the host this share of one Python
# operator call on the same host (launch overhead; chosen by leave-one-campaign-out over
# KernelBench's level-3 campaigns, docs/decisions.md "Any PyTorch module").
LIBRARY_LAUNCH_SHARE = 0.175
_PROBE_COLS = ["cls", "op", "B", "M", "N", "K", "H"]
# vector classes dispatched like an elementwise op: they share its floor (docs/decisions.md 9)
HOST_LIKE_ELEMENTWISE = ("elementwise", "softmax", "layernorm")


@lru_cache(maxsize=16)
def _probes(root: str, exclude: tuple = ()) -> pd.DataFrame:
    """Built from the training tables once, then kept as a tiny cached table (reading the
    five class tables costs more than a whole cached prediction). ``exclude``: GPUs left out
    (a leave-one-GPU-out fold's predictor never saw them)."""
    extra = ["probes-4", *(measured.table_key(c, "train", root) for c in sizes.CLASSES)]
    key = hash_files([], extra=extra + ([list(exclude)] if exclude else []))
    return cached("tables", f"probes-{key}", lambda: _build_probes(root, exclude),
                  "probe table")


def _build_probes(root: str, exclude: tuple = ()) -> pd.DataFrame:
    rows, lat = [], {}
    for cls, tab in measured.kernel_tables("train", root).items():
        tab = tab[~tab["gpu"].isin(list(exclude))]
        if len(tab):
            size = tab["flops"].fillna(0).to_numpy(float) + tab["bytes"].fillna(0).to_numpy(float)
            row = tab.iloc[[int(np.argmin(size))]][_PROBE_COLS]
            same = tab[_PROBE_COLS].merge(row, how="left", indicator=True)["_merge"] == "both"
            lat[cls] = tab[same.to_numpy()].groupby("gpu")["latency_ms"].median()
            rows.append(row)
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=_PROBE_COLS)
    if "elementwise" not in lat:
        raise ValueError("no measured elementwise kernels in the training data: the dispatch "
                         "floor of every class is measured against the smallest of them")
    out["ratio"] = [float((lat[c] / lat["elementwise"]).median()) for c in out["cls"]]
    out["ratio"] = out["ratio"].fillna(1.0)   # a class never measured beside elementwise ops
    # one ATen op and one launch, like an elementwise op: the rest of their smallest
    # kernels' time is their reductions' GPU time, which stays in a stream
    out.loc[out["cls"].isin(HOST_LIKE_ELEMENTWISE), "ratio"] = 1.0
    # the hosts' one-op dispatch: the median over the training GPUs of the smallest
    # elementwise kernel's measured latency (a host figure, the same for every row)
    out["host_ms"] = float(lat["elementwise"].median())
    return out


def probe_kernels(data=None, exclude_gpus=()) -> pd.DataFrame:
    """The smallest training kernel (by FLOPs + bytes) of each class: dims, ``cls``, ``op``,
    and ``ratio``, its measured latency over the smallest elementwise kernel's (median over
    the training GPUs that ran both, but ``exclude_gpus``); ``host_ms``, the median over those
    GPUs of the smallest elementwise kernel's measured latency (ms: one op's dispatch on the
    measurement hosts, :func:`host_dispatch_ms`)."""
    return _probes(str(data_root(data)), tuple(sorted(exclude_gpus))).copy()


@dataclass(frozen=True)
class HostFloor:
    """A host other than the training data's, measured on its own: ``ms``, its cheapest
    operator call (ms); ``class_max_ms``, ``(kernel class, ms)`` pairs: the most a call of
    that class can cost it (the least any measured call of the class took beyond its
    roofline), bounding ``ms`` times the class ratio."""
    ms: float
    class_max_ms: tuple = ()

    def dispatch_ms(self, frame: pd.DataFrame, ratio: np.ndarray) -> np.ndarray:
        """Per row of ``frame``: the host's cost of the row's call (ms): ``ms`` times the
        class ratio, at most the class's bound, at least ``ms`` (the cheapest call)."""
        out = float(self.ms) * np.asarray(ratio, float)
        if self.class_max_ms and len(frame):
            cap = frame["cls"].map(dict(self.class_max_ms)).to_numpy(float)
            # a class never measured (NaN) keeps the ratio's cost
            out = np.where(np.isnan(cap), out, np.minimum(out, np.maximum(cap, self.ms)))
        return out


def as_host_floor(host_floor_ms) -> HostFloor | None:
    """``host_floor_ms`` (None, ms, or a :class:`HostFloor`) as a :class:`HostFloor`."""
    if host_floor_ms is None or isinstance(host_floor_ms, HostFloor):
        return host_floor_ms
    return HostFloor(float(host_floor_ms))


def floors(pred, frame: pd.DataFrame, data=None,
           host_floor_ms: float | HostFloor | None = None) -> np.ndarray:
    """Per row of a predictor-input ``frame``: the dispatch floor (ms) its prediction carries,
    the predictor's latency of the elementwise probe on the row's GPU times the row's class
    ratio (:func:`probe_kernels`, without the GPUs the predictor's training left out).
    ``host_floor_ms``: another host's measured one-op floor (ms, or a :class:`HostFloor`) in
    place of the elementwise probe's, the class ratios kept (a harness whose host is not the
    training data's)."""
    host = as_host_floor(host_floor_ms)
    base, ratio, _ = _floor_parts(pred, frame, data, host is None)
    return base * ratio if host is None else host.dispatch_ms(frame, ratio)


def _floor_parts(pred, frame: pd.DataFrame, data=None, probe_floor: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, float]:
    """Per row: the predictor's elementwise-probe floor on the row's GPU (ms; NaN unless
    ``probe_floor``) and the class ratio (:func:`class_ratio`); and the hosts' one-op
    dispatch (ms, :func:`host_dispatch_ms`), from one probe lookup."""
    if not len(frame):
        return np.zeros(0), np.zeros(0), 0.0
    probe = probe_kernels(data, getattr(pred, "excluded_gpus", ()))
    ratio, host = class_ratio(pred, frame, probe), float(probe["host_ms"].iloc[0])
    if not probe_floor:
        return np.full(len(frame), np.nan), ratio, host
    gcols = list(sizes.GPU_COLS)
    gpus = frame[gcols].drop_duplicates().reset_index(drop=True)
    grid = gpus.merge(probe[probe["cls"] == "elementwise"], how="cross")
    with warnings.catch_warnings():  # e.g. Habitat's "no exact reference" note on the probe
        warnings.simplefilter("ignore")
        grid["floor"] = pred.predict(grid[_PROBE_COLS + gcols])
    base = frame[gcols].merge(grid[gcols + ["floor"]], on=gcols, how="left")["floor"]
    return base.to_numpy(float), ratio, host


def host_dispatch_ms(pred, data=None) -> float:
    """The host's one-op dispatch (ms): the median, over the GPUs ``pred`` was trained on, of
    their smallest elementwise kernel's measured latency; the host's, not the GPU's, so not
    the predictor's price on a new datasheet (docs/decisions.md section 11)."""
    return float(probe_kernels(data, getattr(pred, "excluded_gpus", ()))["host_ms"].iloc[0])


def class_ratio(pred, frame: pd.DataFrame, probe: pd.DataFrame) -> np.ndarray:
    """Per row: the floor ratio (:func:`probe_kernels`) of the class ``pred`` prices it as
    (nslib's design prices a matrix-vector GEMM as a stream)."""
    priced = pred.priced_frame(frame) if hasattr(pred, "priced_frame") else frame
    return priced["cls"].map(dict(zip(probe["cls"], probe["ratio"]))).fillna(1.0) \
        .to_numpy(float)


def stream_ms(pred, frame: pd.DataFrame, launch_us: float | None = LAUNCH_US,
              data=None, tensor=None) -> np.ndarray:
    """Predicted ms of each kernel of ``frame`` as launched back to back in a model.

    ``frame``: predictor input (dims, ``cls``, ``op``, GPU columns). ``launch_us=None``
    returns the predictor's microbenchmark latencies unchanged. ``tensor``: ``(gpu, GEMM
    predictor, attention predictor)`` for a 16-bit trace, whose tensor-core rows they price
    (each no faster than the launch gap) and whose other rows ``pred`` prices as the FP32
    kernels that move the same bytes (module doc).
    """
    if tensor is None:
        return stream_terms(pred, frame, launch_us, data)[1]
    out = tensor_ms(frame, *tensor)
    rest = np.isnan(out)
    if launch_us is not None:
        out[~rest] = np.maximum(out[~rest], launch_us / 1000.0)
    if rest.any():
        out[rest] = stream_terms(pred, fp32_equivalent(frame[rest]), launch_us, data)[1]
    return out


def stream_terms(pred, frame: pd.DataFrame, launch_us: float | None = LAUNCH_US,
                 data=None, raw=None, plain_sum: bool | None = None,
                 host_floor_ms: float | HostFloor | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel of ``frame``, from one prediction and one floor lookup (ms): the
    microbenchmark latency, the time in the stream (:func:`stream_ms`) and the host's time to
    issue the kernel: the measurement hosts' one-op dispatch (:func:`host_dispatch_ms`) times
    the class ratio, but never more than the kernel's whole microbenchmark latency (which
    holds that dispatch; another host's floor is what that host takes, whatever the kernel).
    The GPU time is never below the kernel's roofline nor, for a predictor that sizes kernels
    as the library runs them (nslib's design and its MLP ablation), a layer norm's round-trip
    bound (:func:`nslib.kernels.row_latency.floor_ms`).
    ``launch_us=None``, or ``plain_sum`` (default: the predictor's own, true for a method
    that sums kernels as they are, NeuSight as published): the stream
    time is the microbenchmark latency and the dispatch 0 (the plain sum); ``plain_sum=False``
    takes the dispatch floor off whatever the predictor (a kernel's GPU time). ``raw``:
    ``pred``'s latencies of ``frame`` when already predicted (ms). ``host_floor_ms``: the
    dispatch is another host's one-op floor times the class ratio (:func:`floors`; a
    :class:`HostFloor` also bounds it per class); the GPU time still takes the predictor's own
    floor off. The plain sum (``launch_us=None`` or
    ``plain_sum``) has no dispatch term and ignores it."""
    return _stream_parts(pred, frame, launch_us, data, raw, plain_sum, host_floor_ms)[:3]


def _stream_parts(pred, frame, launch_us, data, raw=None, plain_sum=None, host_floor_ms=None):
    """:func:`stream_terms`' three arrays and, fourth, the host's one-op floor per row (ms:
    ``host_floor_ms``'s (:attr:`HostFloor.ms`) or the measurement hosts',
    :func:`host_dispatch_ms`; zeros for the plain sum), from one prediction and one probe
    lookup."""
    if not len(frame):
        return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
    raw = published_memory(pred, frame, pred.predict(frame)) if raw is None else raw
    raw = np.asarray(raw, float)
    if plain_sum is None:
        plain_sum = bool(getattr(pred, "plain_sum", False))
    if launch_us is None or plain_sum:
        return raw, raw, np.zeros(len(raw)), np.zeros(len(raw))
    if launch_us < 0:
        raise ValueError(f"launch_us must be >= 0 (microseconds), got {launch_us}")
    base, ratio, host_ms = _floor_parts(pred, frame, data)
    floor = base * ratio
    gpu_ms = np.maximum(np.maximum(raw - floor, sizes.roofline_ms(frame)), launch_us / 1000.0)
    if getattr(pred, "library_sizing", False):  # kernels as the library runs them
        gpu_ms = np.maximum(gpu_ms, row_latency.floor_ms(frame))
    if host_floor_ms is not None:   # another host's measured floor
        other = as_host_floor(host_floor_ms)
        return raw, gpu_ms, other.dispatch_ms(frame, ratio), np.full(len(raw), other.ms)
    host = np.full(len(raw), host_ms)   # the measurement hosts', capped at the whole latency
    return raw, gpu_ms, np.minimum(host * ratio, raw), host


def published_memory(pred, frame: pd.DataFrame, raw) -> np.ndarray:
    """``raw`` (the predictor's latencies of ``frame``, ms) with the memory operators (rows
    whose ``kernel_class`` is ``memory``: copies, gathers, concatenations, masks) at their
    bytes over the memory bandwidth when ``pred`` is a method as published (``plain_sum``:
    NeuSight's original tool), as method.md section 2 prices them. nslib's own design prices
    them as one-input elementwise kernels (:func:`nslib.model.inputs.kernel_frame`), which
    carries their launch floor and achieved bandwidth."""
    out = np.array(raw, float)
    if not getattr(pred, "plain_sum", False) or "kernel_class" not in frame.columns:
        return out
    mem = (frame["kernel_class"] == "memory").to_numpy()
    rows = frame.loc[mem]
    # bytes / (GB/s * 1e9) s = bytes / (GB/s * 1e6) ms
    out[mem] = rows["bytes"].to_numpy(float) / (rows["mem_bw"].to_numpy(float) * 1e6)
    return out


def step_ms(pred, frame: pd.DataFrame, launch_us: float | None = LAUNCH_US,
            data=None, per_call: bool = False, host_floor_ms: float | HostFloor | None = None,
            other_gpu_ms: np.ndarray | None = None, raw=None) -> np.ndarray:
    """Per kernel of a model step's ``frame`` (launch order, ``phase`` column): ms in the
    step, the kernel stream (:func:`stream_ms`) no faster than the host issues it
    (:func:`host_bound`, each kernel costing the host its dispatch, :func:`stream_terms`).
    ``launch_us=None``: the microbenchmark latencies, as :func:`stream_ms`. ``per_call``: the
    host dispatches each operator call (``call`` column) once, its further kernels costing a
    launch from C++ each (:func:`library_launch_ms`: a library call that launches thousands
    of kernels, e.g. cuDNN's recurrent layers, costs the host no Python dispatch per kernel,
    but a share of one). ``host_floor_ms``: the host is not the training data's but one whose
    cheapest operator call was measured at this floor (ms): each call costs it that times its
    class ratio (:func:`floors`; a :class:`HostFloor` also bounds it per class); ignored by the
    plain sum (:func:`stream_terms`).
    ``other_gpu_ms``: another algorithm's GPU time per row (:func:`faster_of`). ``raw``:
    ``pred``'s latencies of ``frame`` when already predicted (ms)."""
    _, gpu_ms, dispatch, host = _stream_parts(pred, frame, launch_us, data, raw=raw,
                                              host_floor_ms=host_floor_ms)
    plain = launch_us is None or bool(getattr(pred, "plain_sum", False))
    if other_gpu_ms is not None:
        gpu_ms = faster_of(gpu_ms, other_gpu_ms, pred, launch_us)[0]
    if per_call and "call" in frame.columns and not plain:
        calls = frame["call"].to_numpy()
        again = (calls >= 0) & pd.Series(calls).duplicated().to_numpy()
        if again.any():
            dispatch = np.where(again, library_launch_ms(host, launch_us), dispatch)
    return host_bound(frame, gpu_ms, dispatch)


def faster_of(gpu_ms, other_gpu_ms, pred, launch_us: float | None = LAUNCH_US
              ) -> tuple[np.ndarray, np.ndarray]:
    """(per row the faster of ``gpu_ms`` and ``other_gpu_ms``, another algorithm's GPU time
    (ms; NaN: none; cuDNN's TF32 convolutions, :func:`nslib.model.tf32.tf32_ms`), as cuDNN
    picks; the rows where the other wins). The other is never under the launch gap."""
    plain = launch_us is None or bool(getattr(pred, "plain_sum", False))  # no launch gap
    gap = 0.0 if plain else launch_us / 1000.0
    other = np.maximum(np.asarray(other_gpu_ms, float), gap)   # NaN stays NaN
    wins = np.isfinite(other) & (other < gpu_ms)
    return np.where(wins, other, gpu_ms), wins


def library_launch_ms(host_floor_ms, launch_us: float = LAUNCH_US) -> np.ndarray:
    """What the host takes (ms) to launch a further kernel of one operator call from C++
    (cuDNN's per-step kernels of a recurrent layer, the copy and GEMM of one ``matmul``):
    :data:`LIBRARY_LAUNCH_SHARE` of its one-operator call ``host_floor_ms`` (ms), never less
    than the launch gap ``launch_us`` (us)."""
    return np.maximum(LIBRARY_LAUNCH_SHARE * np.asarray(host_floor_ms, float),
                      launch_us / 1000.0)


def host_bound(frame: pd.DataFrame, gpu_ms: np.ndarray, dispatch_ms: np.ndarray) -> np.ndarray:
    """Per-kernel ms of a step whose host needs ``dispatch_ms`` to issue each kernel.

    The GPU runs the kernels back to back while the host issues the next ones; it cannot run
    them faster than they are issued. Per phase (``fw``, ``bw``): when the kernels' dispatches
    sum to more than their GPU time, the phase takes the dispatch sum, each kernel stretched
    in proportion to its GPU time (so the classes keep their shares). Units: ms.
    """
    out = np.asarray(gpu_ms, float).copy()
    dispatch = np.asarray(dispatch_ms, float)
    phase = frame["phase"].to_numpy() if "phase" in frame.columns else np.zeros(len(out))
    for p in pd.unique(phase):
        m = phase == p
        gpu, host = out[m].sum(), dispatch[m].sum()
        if host > gpu > 0:
            out[m] *= host / gpu
    return out


def per_class_ms(frame: pd.DataFrame) -> dict[str, float]:
    """Predicted ms per kernel class (``kernel_class``) of a frame with ``pred_ms``."""
    per = frame.groupby("kernel_class")["pred_ms"].sum()
    return {k: float(v) for k, v in per.items()}


def step_summary(frame: pd.DataFrame) -> dict:
    """``{e2e_ms, fw_ms, bw_ms, per_class_ms: {...}, n_kernels}`` of a predicted frame."""
    fw = float(frame.loc[frame["phase"] == "fw", "pred_ms"].sum())
    bw = float(frame.loc[frame["phase"] == "bw", "pred_ms"].sum())
    return {"e2e_ms": fw + bw, "fw_ms": fw, "bw_ms": bw, "per_class_ms": per_class_ms(frame),
            "n_kernels": int(len(frame))}


POWER_TOL = 0.95   # a kernel within 5% of its power floor counts as set by it


def power_bound(pred, frame: pd.DataFrame) -> dict:
    """``{"power_bound": {share, gflops_per_w, tflops, of_peak}}`` where the board's power
    (:mod:`nslib.kernels.power`, a predictor with a ``power_eta``) sets at least 1% of the
    step's time (``frame``: one GPU's priced kernels with ``pred_ms``): the share of the
    summed kernel times at the bound (within :data:`POWER_TOL` of it), the bound's GFLOP/s
    per W, the rate it allows on this board (TFLOP/s) and that rate over the FP32 peak. Empty
    otherwise. The bound is the best node the training GPUs showed, so a board on a newer
    process at a low TDP may sustain more (docs/decisions.md section 18): a forecast says
    how much of it the bound sets."""
    eta = getattr(pred, "power_eta", None)
    if eta is None or "tdp_w" not in frame or not len(frame):
        return {}
    priced = pred.priced_frame(frame) if hasattr(pred, "priced_frame") else frame
    p = np.nan_to_num(frame["pred_ms"].to_numpy(float))
    floor = power.floor_ms(priced, eta)
    # a kernel's time in a step can sit a dispatch below the latency the bound acted on; a
    # convolution priced in TF32 is not an FP32 GEMM, whatever its floor
    at = (floor > 0) & (floor >= POWER_TOL * p)
    if "tf32" in frame:
        at &= ~frame["tf32"].fillna(False).to_numpy(bool)
    share = float(p[at].sum() / p.sum()) if p.sum() > 0 else 0.0
    if share < 0.01:
        return {}
    gflops = eta * float(frame["tdp_w"].iloc[0])
    return {"power_bound": {"share": share, "gflops_per_w": float(eta),
                            "tflops": gflops / 1e3,
                            "of_peak": gflops / float(frame["peak_gflops"].iloc[0])}}


def power_note(bound: dict) -> str:
    """The sentence saying how much of a step :func:`power_bound`'s ``power_bound`` sets."""
    return (f"the board's power sets {bound['share']:.0%} of this step: its long FP32 GEMMs at "
            f"most {bound['tflops']:.1f} TFLOP/s ({bound['of_peak']:.0%} of the FP32 peak, "
            f"{bound['gflops_per_w']:.1f} GFLOP/s per W of TDP, the best a training GPU "
            "reached); a board on a newer process than theirs may sustain more")
