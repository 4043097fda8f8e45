"""Peak memory of a traced step on one GPU: will it fit?

The tracer (:mod:`nslib.model.trace`) records, for every kernel, the storages it is the first to
touch (allocated just before it runs, at their real dtypes) and the last kernel that touches
each of them (freed after it): the ``allocs``/``frees``/``params``/``trainable`` columns. So the
bytes alive while each kernel runs are a cumulative sum over the launch order
(:func:`live_bytes`), and a step's memory is

- **weights**: parameters and buffers (tied weights once), whole step;
- **grads**: one gradient per trainable parameter (training), whole step: the trace pre-sets
  ``.grad`` (gradient accumulation, or ``zero_grad(set_to_none=False)``), so gradients live
  from the start; the weight-gradient GEMM's output is a temporary added into it;
- **optimizer**: states per trainable parameter (:data:`OPTIMIZERS`: Adam's two FP32
  moments, SGD's momentum buffer), whole step, plus the step's own temporaries (PyTorch's
  multi-tensor Adam, the CUDA default, materialises ``sqrt(exp_avg_sq)`` for every parameter
  at once) while the optimizer runs, when the activations are gone;
- **activations**: every other tensor alive at that kernel: saved activations, the outputs
  the step returns (held by the caller to the end), temporaries, activation gradients;
- **kv_cache**: the keys and values a generating inference keeps for every layer (off by
  default: the traced step, like the measured runs, keeps none);
- **framework**: the CUDA context and the allocator workspace (:func:`framework_bytes`): a
  fixed cost from the datasheet's SM count, not fitted per model;
- **comm**: data parallel only: DDP's gradient buckets, a flat copy of the gradients
  (``gradient_as_bucket_view=False``, PyTorch's default).

The peak is the largest total over the kernels (``fw``/``bw``) and the optimizer step
(``step``). GB here are binary (2**30 bytes), as datasheet memory sizes are: an "A100 40GB"
reports 40960 MiB. Caching-allocator fragmentation (reserved minus allocated, typically a few
per cent) is not modelled.

Checked against PyTorch's allocator on the CPU (:mod:`nslib.evaluation.memcheck`, tests):
forwards agree to the byte, forward + backward + Adam steps within a few per cent (CPU kernels'
internal temporaries are not tensors the trace sees).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import pandas as pd

from nslib.data.units import GIB
from nslib.kernels.dtypes import bytes_per_elem
from nslib.model.parallel import raw_spec

__all__ = ["OPTIMIZERS", "CONTEXT_BASE_GB", "CONTEXT_THREADS_PER_SM", "CONTEXT_STACK_BYTES",
           "CUBLAS_WORKSPACE_BYTES", "FP32_BYTES", "GIB", "Memory", "storage_lifetimes",
           "live_bytes", "saved_bytes", "framework_bytes", "kv_cache_bytes", "check_step",
           "step_memory", "Held", "Share"]

# Bytes of an FP32 element: optimizer states, master weights and nslib's default traces.
FP32_BYTES = bytes_per_elem("fp32")

# optimizer -> (states, step temporaries), each in bytes per trainable parameter byte (FP32).
# adam/adamw: exp_avg and exp_avg_sq; the multi-tensor step's sqrt(exp_avg_sq) list
# (torch.optim.adam._multi_tensor_adam). sgd: the momentum buffer (momentum > 0), updated in
# place. sgd_plain: no state. none: forward/backward only, no optimizer.
OPTIMIZERS = {"adam": (2.0, 1.0), "adamw": (2.0, 1.0), "sgd": (1.0, 0.0),
              "sgd_plain": (0.0, 0.0), "none": (0.0, 0.0)}

# The framework's fixed bytes on a GPU, from its datasheet alone (a device JSON key ``Ctx_Mem``,
# GB, overrides). The CUDA context reserves local (stack) memory for every thread the GPU can
# hold resident: SMs x resident threads per SM (2,048 on every NVIDIA data-centre part since
# Pascal) x the default 1 KiB stack (cudaLimitStackSize). On top: the driver's per-context
# state and the device code a PyTorch process loads lazily (CUDA >= 11.7) for its first
# kernels and cuBLAS GEMMs, about 0.3 GB; and the cuBLAS workspace PyTorch allocates per
# handle, 32 MiB (CUBLAS_WORKSPACE_CONFIG ":4096:8" on Hopper; less before, so an upper
# bound). Published behaviour, order of magnitude: 0.41 GB on a 40-SM GPU, 0.59 GB on a
# 132-SM one, as nvidia-smi shows 0.4-0.6 GB for such processes; not fitted per model.
CONTEXT_BASE_GB = 0.30            # driver state + lazily loaded device code, GB
CONTEXT_THREADS_PER_SM = 2048     # resident threads per SM the stack reservation covers
CONTEXT_STACK_BYTES = 1024        # default per-thread stack, bytes
CUBLAS_WORKSPACE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Memory:
    """One GPU's memory at the step's peak, bytes; ``peak_phase`` is "fw", "bw" or "step"
    (the optimizer), ``peak_kid`` the kernel running then (-1 for the optimizer step)."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    kv_cache: float
    framework: float
    comm: float
    peak_phase: str
    peak_kid: int
    peak_module: str
    capacity: float          # the GPU's memory, bytes (0: unknown)
    context_source: str = ""

    @property
    def total(self) -> float:
        """Peak bytes: the sum of the parts."""
        return (self.weights + self.grads + self.optimizer + self.activations + self.kv_cache
                + self.framework + self.comm)

    @property
    def fits(self) -> bool:
        """Whether the peak fits in the GPU's memory (True when the capacity is unknown)."""
        return self.capacity <= 0 or self.total <= self.capacity

    def to_dict(self) -> dict:
        """The breakdown in GB (2**30 bytes), with ``total``, ``capacity`` and ``fits``."""
        parts = ("weights", "grads", "optimizer", "activations", "kv_cache", "framework",
                 "comm")
        d = {k: getattr(self, k) / GIB for k in parts}
        return {**d, "total": self.total / GIB, "capacity": self.capacity / GIB,
                "fits": bool(self.fits), "peak_phase": self.peak_phase,
                "peak_kid": int(self.peak_kid), "peak_module": self.peak_module,
                "context_source": self.context_source}


# --------------------------------------------------------------------------------------------
# The live set
# --------------------------------------------------------------------------------------------

def storage_lifetimes(trace: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first row, last row, bytes) of every storage in the trace; last = len(trace) for the
    ones held to the end of the step."""
    need = {"allocs", "frees", "kid"} - set(trace.columns)
    if need:
        raise ValueError(f"the trace has no storage lifetimes (missing columns {sorted(need)}): "
                         f"trace it with nslib.model.trace.trace / nslib.model.inputs.traced, "
                         f"not an older cached or fused frame")
    n = len(trace)
    lens = trace["allocs"].map(len).to_numpy()
    total = int(lens.sum())
    first = np.repeat(np.arange(n), lens)
    nbytes = np.fromiter(chain.from_iterable(trace["allocs"]), float, total)
    last_kid = np.fromiter(chain.from_iterable(trace["frees"]), np.int64, total)
    kids = trace["kid"].to_numpy(np.int64)
    pos = np.full(int(kids.max()) + 1 if n else 1, n, dtype=np.int64)
    pos[kids] = np.arange(n)
    last = np.where(last_kid < 0, n, pos[np.clip(last_kid, 0, len(pos) - 1)])
    return first, np.maximum(last, first), nbytes


def live_bytes(trace: pd.DataFrame, scale=None, select=None) -> np.ndarray:
    """Bytes of non-parameter storages alive while each kernel (row) runs.

    A storage is allocated just before the first kernel that touches it and freed just after
    the last (held ones: never, within the step). ``scale`` (per row) multiplies the storages
    that row allocates (a tensor-parallel share); ``select`` (bool per row) keeps only the
    storages those rows allocate (a pipeline stage)."""
    return _live(trace, scale, select)[0]


def _live(trace, scale=None, select=None, storages=None) -> tuple[np.ndarray, float]:
    """(:func:`live_bytes`, bytes still alive after the last kernel: the held storages)."""
    first, last, nbytes = storage_lifetimes(trace) if storages is None else storages
    n = len(trace)
    w = nbytes if scale is None else nbytes * np.asarray(scale, float)[first]
    if select is not None:
        w = np.where(np.asarray(select, bool)[first], w, 0.0)
    alloc = np.bincount(first, w, n)
    freed = np.bincount(last, w, n + 1)
    return np.cumsum(alloc) - (np.cumsum(freed[:n]) - freed[:n]), float(freed[n])


def saved_bytes(trace: pd.DataFrame, select=None, scale=None) -> float:
    """Bytes the forward leaves alive for the backward (allocated in ``fw``, still alive at
    the first ``bw`` kernel) among the storages of the selected rows."""
    first, last, nbytes = storage_lifetimes(trace)
    phase = trace["phase"].to_numpy()
    bw = np.flatnonzero(phase == "bw")
    if not len(bw):
        return 0.0
    keep = (phase[first] == "fw") & (last >= bw[0])
    if select is not None:
        keep &= np.asarray(select, bool)[first]
    w = nbytes if scale is None else nbytes * np.asarray(scale, float)[first]
    return float(w[keep].sum())


# --------------------------------------------------------------------------------------------
# Fixed costs
# --------------------------------------------------------------------------------------------

def framework_bytes(gpu, data=None, spec_path=None) -> tuple[float, str]:
    """(CUDA context + allocator workspace bytes, where the figure came from) of a GPU
    (:data:`CONTEXT_BASE_GB` and the per-SM stack reservation; a ``Ctx_Mem`` key in the device
    JSON, GB, overrides; the JSON is ``spec_path`` when given, else the data's file of the
    GPU)."""
    name = getattr(gpu, "name", str(gpu))
    raw = raw_spec(gpu, spec_path, data) if hasattr(gpu, "key") else {}
    v = raw.get("Ctx_Mem")
    if v is not None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{name}: device JSON field 'Ctx_Mem' (CUDA context and allocator "
                             f"workspace, GB) must be a number >= 0, got {v!r}")
        return float(v) * GIB, "device JSON Ctx_Mem"
    sm = float(getattr(gpu, "num_sm", 0) or 0)
    stack = sm * CONTEXT_THREADS_PER_SM * CONTEXT_STACK_BYTES
    return CONTEXT_BASE_GB * GIB + stack + CUBLAS_WORKSPACE_BYTES, \
        f"datasheet: {sm:.0f} SMs' stack reservation + context + cuBLAS workspace"


def kv_cache_bytes(config: dict, batch: int, seq: int, elem_bytes: int = FP32_BYTES) -> float:
    """Keys and values of every decoder layer for ``batch x seq`` tokens, bytes (grouped-query
    attention: ``num_key_value_heads`` heads of ``head_dim``)."""
    def get(*names, default=None):
        for k in names:
            if config.get(k) is not None:
                return config[k]
        return default
    hidden = get("hidden_size", "n_embd", "d_model")
    layers = get("num_hidden_layers", "n_layer", "num_decoder_layers", "num_layers")
    heads = get("num_attention_heads", "n_head", "num_heads")
    if not (hidden and layers and heads):
        raise ValueError("the model config lacks hidden size, layer count or head count, so "
                         "its KV cache cannot be sized: pass kv_cache=False")
    head_dim = get("head_dim", default=hidden // heads) or hidden // heads
    kv_heads = get("num_key_value_heads", default=heads)
    return float(2 * layers * batch * seq * kv_heads * head_dim * elem_bytes)


# --------------------------------------------------------------------------------------------
# One GPU's step
# --------------------------------------------------------------------------------------------

def check_step(mode: str, optimizer: str) -> None:
    if mode not in ("inf", "train"):
        raise ValueError(f"mode must be 'inf' or 'train', got {mode!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {sorted(OPTIMIZERS)}")


@dataclass(frozen=True)
class Held:
    """Bytes one GPU holds for the whole step beside the kernels' live set: ``framework`` (the
    CUDA context and library workspace; ``context_source`` says where the figure came from),
    ``kv_cache``, ``comm`` (gradient buckets); and ``capacity``, the GPU's bytes, for
    ``fits``."""
    framework: float = 0.0
    kv_cache: float = 0.0
    comm: float = 0.0
    capacity: float = 0.0
    context_source: str = ""


@dataclass(frozen=True, eq=False)
class Share:
    """The part of a trace one GPU of several holds: ``scale``/``select`` as in
    :func:`live_bytes` (per-row activation scale; the rows of a pipeline stage); ``wscale``
    (per row) scales the parameters that row reads first (tensor parallel); ``in_flight``:
    activation bytes other micro-batches keep alive (pipeline), added to the live set."""
    scale: object = None
    wscale: object = None
    select: object = None
    in_flight: float = 0.0


def step_memory(trace: pd.DataFrame, mode: str, optimizer: str = "adam", *,
                held: Held = Held(), share: Share = Share(), storages: tuple | None = None,
                fp32_states: float = 1.0) -> Memory:
    """The peak of one GPU running ``trace`` (one step; ``mode`` "inf" or "train"), bytes.

    ``optimizer``: a key of :data:`OPTIMIZERS` (training only). ``held``: the bytes added to
    every point and the GPU's capacity (:class:`Held`); ``share``: the part of the trace this
    GPU holds (:class:`Share`). With ``share.select``, only the selected rows' parameters
    count and the peak is taken over the selected rows. ``storages``: (first row, last row,
    bytes) arrays to use instead of the trace's (:func:`nslib.model.memory.laws.storage_law`).
    ``fp32_states``: FP32 bytes per parameter byte of the trace (2 for a 16-bit trace): the
    optimizer keeps its states in FP32 and, for a 16-bit trace, an FP32 master copy of the
    weights (mixed-precision training), counted in ``optimizer``."""
    check_step(mode, optimizer)
    n, select = len(trace), share.select
    rows = np.ones(n, bool) if select is None else np.asarray(select, bool)
    ws = np.ones(n) if share.wscale is None else np.asarray(share.wscale, float)
    weights = float((trace["params"].to_numpy(float) * ws)[rows].sum())
    trainable = float((trace["trainable"].to_numpy(float) * ws)[rows].sum())
    train = mode == "train"
    states, temps = OPTIMIZERS[optimizer] if train else (0.0, 0.0)
    # FP32 states (and master weights when the trace is 16-bit and an optimizer runs)
    master = fp32_states if train and fp32_states > 1 and optimizer != "none" else 0.0
    states, temps = states * fp32_states + master, temps * fp32_states
    grads = trainable if train else 0.0
    live, kept = _live(trace, share.scale, select, storages)
    live = live + share.in_flight
    cand = np.flatnonzero(rows)
    if not len(cand):
        raise ValueError("no kernel selected: the selection (pipeline stage) is empty")
    k = int(cand[np.argmax(live[cand])])
    act, phase, kid = float(live[k]), str(trace["phase"].iat[k]), int(trace["kid"].iat[k])
    module = str(trace["module"].iat[k]) if "module" in trace else ""
    opt = states * trainable
    # the optimizer step runs after the backward: only the held outputs are left, and the
    # step's temporaries join the states
    if train and temps > 0 and kept + temps * trainable > act:
        act, opt = kept, (states + temps) * trainable
        phase, kid, module = "step", -1, "optimizer"
    return Memory(weights=weights, grads=grads, optimizer=opt, activations=act,
                  kv_cache=float(held.kv_cache), framework=float(held.framework),
                  comm=float(held.comm), peak_phase=phase, peak_kid=kid, peak_module=module,
                  capacity=float(held.capacity), context_source=held.context_source)
