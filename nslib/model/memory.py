"""Peak memory of a traced step: will it fit on the GPU?

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

Several GPUs (per GPU, ``batch`` the global batch): **DP** runs the trace at ``batch / dp``
with whole copies of weights, gradients and optimizer states, plus the buckets. **TP** scales
every storage by how much of its producing kernel one GPU runs
(:func:`nslib.model.parallel.shard_tensor_parallel`: column/row-split GEMM outputs, sharded vector
kernels), and every parameter by how much of the weight its first reader holds (split
linears 1/n, vocabulary-parallel embeddings 1/n, the rest replicated). **PP** gives each stage
the parameters its kernels read first and the activations its kernels allocate, for one
micro-batch of ``batch / microbatches``; the GPipe schedule (all forwards, then all
backwards) keeps every micro-batch's saved activations, and every received input activation,
until its backward: ``stage activations = peak of one micro-batch + (M - 1) x saved``. The
worst stage is the per-GPU figure. A tied embedding counts on the stage that reads it first
(the first); a real pipeline also keeps a copy on the last stage for the LM head.

Checked against PyTorch's allocator on the CPU (:mod:`nslib.evaluation.memcheck`, tests): forwards agree
to the byte, forward + backward + Adam steps within a few per cent (CPU kernels' internal
temporaries are not tensors the trace sees).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import chain

import numpy as np
import pandas as pd
from nslib.model.parallel import check_degrees, model_info, pipeline_stages, raw_spec, shard_tensor_parallel
from nslib.kernels.dtypes import bytes_per_elem, check_dtype
from nslib.model.inputs import LAW_POINTS, LAW_POINTS_ONE, resolve_gpu, spec_path, traced
from nslib.model.config import load_model_config

__all__ = ["OPTIMIZERS", "CONTEXT_BASE_GB", "GIB", "Memory", "live_bytes", "framework_bytes",
           "step_memory", "memory_of", "kv_cache_bytes"]

GIB = float(2 ** 30)

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

def _storages(trace: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first row, last row, bytes) of every storage in the trace; last = len(trace) for the
    ones held to the end of the step."""
    need = {"allocs", "frees", "kid"} - set(trace.columns)
    if need:
        raise ValueError(f"the trace has no storage lifetimes (missing columns {sorted(need)}): "
                         f"trace it with nslib.model.trace.trace / nslib.model.predict.traced, not an older "
                         f"cached or fused frame")
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
    first, last, nbytes = _storages(trace) if storages is None else storages
    n = len(trace)
    w = nbytes if scale is None else nbytes * np.asarray(scale, float)[first]
    if select is not None:
        w = np.where(np.asarray(select, bool)[first], w, 0.0)
    alloc = np.bincount(first, w, n)
    freed = np.bincount(last, w, n + 1)
    return np.cumsum(alloc) - (np.cumsum(freed[:n]) - freed[:n]), float(freed[n])


def _saved_bytes(trace: pd.DataFrame, select=None, scale=None) -> float:
    """Bytes the forward leaves alive for the backward (allocated in ``fw``, still alive at
    the first ``bw`` kernel) among the storages of the selected rows."""
    first, last, nbytes = _storages(trace)
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


def kv_cache_bytes(config: dict, batch: int, seq: int, elem_bytes: int = 4) -> float:
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

def _check(mode: str, optimizer: str) -> None:
    if mode not in ("inf", "train"):
        raise ValueError(f"mode must be 'inf' or 'train', got {mode!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {sorted(OPTIMIZERS)}")


def step_memory(trace: pd.DataFrame, mode: str, optimizer: str = "adam", *,
                framework: float = 0.0, capacity: float = 0.0, kv_cache: float = 0.0,
                comm: float = 0.0, scale=None, wscale=None, select=None,
                in_flight: float = 0.0, context_source: str = "",
                storages: tuple | None = None, fp32_states: float = 1.0) -> Memory:
    """The peak of one GPU running ``trace`` (one step; ``mode`` "inf" or "train"), bytes.

    ``optimizer``: a key of :data:`OPTIMIZERS` (training only). ``framework``, ``kv_cache``,
    ``comm``: fixed bytes added to every point; ``capacity``: the GPU's bytes, for ``fits``.
    ``scale``/``select``: as in :func:`live_bytes`; ``wscale`` (per row) scales the parameters
    that row reads first; ``in_flight``: activation bytes other micro-batches keep alive
    (pipeline), added to the kernels' live set. With ``select``, only the selected rows'
    parameters count and the peak is taken over the selected rows. ``storages``: (first row,
    last row, bytes) arrays to use instead of the trace's (:func:`storage_law`).
    ``fp32_states``: FP32 bytes per parameter byte of the trace (2 for a 16-bit trace): the
    optimizer keeps its states in FP32 and, for a 16-bit trace, an FP32 master copy of the
    weights (mixed-precision training), counted in ``optimizer``."""
    _check(mode, optimizer)
    n = len(trace)
    rows = np.ones(n, bool) if select is None else np.asarray(select, bool)
    ws = np.ones(n) if wscale is None else np.asarray(wscale, float)
    weights = float((trace["params"].to_numpy(float) * ws)[rows].sum())
    trainable = float((trace["trainable"].to_numpy(float) * ws)[rows].sum())
    train = mode == "train"
    states, temps = OPTIMIZERS[optimizer] if train else (0.0, 0.0)
    # FP32 states (and master weights when the trace is 16-bit and an optimizer runs)
    master = fp32_states if train and fp32_states > 1 and optimizer != "none" else 0.0
    states, temps = states * fp32_states + master, temps * fp32_states
    grads = trainable if train else 0.0
    live, held = _live(trace, scale, select, storages)
    live = live + in_flight
    cand = np.flatnonzero(rows)
    if not len(cand):
        raise ValueError("no kernel selected: the selection (pipeline stage) is empty")
    k = int(cand[np.argmax(live[cand])])
    act, phase, kid = float(live[k]), str(trace["phase"].iat[k]), int(trace["kid"].iat[k])
    module = str(trace["module"].iat[k]) if "module" in trace else ""
    opt = states * trainable
    # the optimizer step runs after the backward: only the held outputs are left, and the
    # step's temporaries join the states
    if train and temps > 0 and held + temps * trainable > act:
        act, opt = held, (states + temps) * trainable
        phase, kid, module = "step", -1, "optimizer"
    return Memory(weights=weights, grads=grads, optimizer=opt, activations=act,
                  kv_cache=float(kv_cache), framework=float(framework), comm=float(comm),
                  peak_phase=phase, peak_kid=kid, peak_module=module, capacity=float(capacity),
                  context_source=context_source)


# --------------------------------------------------------------------------------------------
# A model on a GPU, on one or several GPUs
# --------------------------------------------------------------------------------------------

def _out_elems(df: pd.DataFrame) -> np.ndarray:
    """What each kernel writes, to compare a kernel with its shard: GEMMs B*M*K elements,
    vector rows B*H elements, memory rows their bytes (a predicted frame has turned their
    dims into a copy's; sharding divides their bytes alike)."""
    cls = (df["kernel_class"] if "kernel_class" in df else df["cls"]).to_numpy()
    B, M, K, H = (df[c].to_numpy(float) for c in ("B", "M", "K", "H"))
    gemm = np.isin(cls, ("linear", "bmm"))
    return np.where(gemm, B * M * K, np.where(cls == "memory", df["bytes"].to_numpy(float),
                                              B * H))


def tp_scales(trace: pd.DataFrame, n: int, info: dict, vocab_parallel: bool = True,
              sharded: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(activation share, parameter share) of one of ``n`` tensor-parallel GPUs per row of
    ``trace``: how much of each kernel's output it writes and of the parameters it reads
    first (see the module docstring). ``sharded``: the unfused frame
    :func:`nslib.model.parallel.shard_tensor_parallel` made of this trace, when the caller has it
    (the frame of a TP ``predict_model``), to save sharding again."""
    if sharded is None or "fused_from" in sharded or \
            not np.isin(trace["kid"].to_numpy(), sharded["kid"].to_numpy()).all():
        sharded = shard_tensor_parallel(trace, n, info, vocab_parallel)
    sh = sharded[sharded["cls"] != "comm"].set_index("kid").reindex(trace["kid"].to_numpy())
    before, after = _out_elems(trace), _out_elems(sh)
    with np.errstate(divide="ignore", invalid="ignore"):
        act = np.where(before > 0, after / before, 1.0)
        nk0 = trace["N"].to_numpy(float) * trace["K"].to_numpy(float)
        nk1 = sh["N"].to_numpy(float) * sh["K"].to_numpy(float)
        lin = (trace["cls"].to_numpy() == "linear") & (nk0 > 0)
        wsc = np.where(lin, nk1 / nk0, 1.0)
    if vocab_parallel:
        vocab = trace["module"].isin(info.get("vocab_modules") or ()).to_numpy() & \
            (trace["cls"].to_numpy() == "memory")   # the trace's own classes
        wsc = np.where(vocab, 1.0 / n, wsc)
    return np.nan_to_num(act, nan=1.0), np.nan_to_num(wsc, nan=1.0)


def memory_of(gpu, model, batch: int, seq: int, mode: str = "inf", optimizer: str = "adam",
              *, dp: int = 1, tp: int = 1, pp: int = 1, microbatches: int = 1,
              vocab_parallel: bool = True, kv_cache: bool = False, data=None,
              sharded: pd.DataFrame | None = None, imbalance: float = 1.0,
              dtype: str = "fp32") -> Memory:
    """Peak memory per GPU of one step of ``model`` (config name, path or dict) on ``gpu``
    (name, spec file or :class:`nslib.data.gpus.GPU`): the worst GPU of a DP/TP/PP step, ``batch``
    the global batch. ``kv_cache``: an inference that keeps every layer's keys and values
    (generation). ``sharded``: see :func:`tp_scales`. ``imbalance``: mixture-of-experts routing
    as :func:`nslib.model.predict.traced` takes it. ``dtype``: ``fp32``, or ``bf16``/``fp16`` for a
    16-bit step traced in that format (weights, gradients, activations and the KV cache at 2
    bytes; training in mixed precision: FP32 optimizer states and an FP32 master copy of the
    weights, as DeepSpeed's BF16 training keeps them; one GPU only). Raises ValueError for degrees that do not divide the model."""
    _check(mode, optimizer)
    dtype = check_dtype(dtype)
    if dtype != "fp32" and not dp == tp == pp == microbatches == 1:
        raise ValueError(f"memory of a multi-GPU step is FP32 only; {dtype} needs "
                         "dp = tp = pp = 1")
    spec = resolve_gpu(gpu, data)
    fw, src = framework_bytes(spec, data, spec_path(gpu))
    fixed = {"framework": fw, "capacity": float(spec.mem_gb) * GIB, "context_source": src}
    if dp == tp == pp == microbatches == 1:
        kv = _kv(model, batch, seq, mode, kv_cache, data, bytes_per_elem(dtype))
        trace = traced(model, batch, seq, mode, data, imbalance, dtype=dtype)
        return step_memory(trace, mode, optimizer, kv_cache=kv,
                           fp32_states=4 / bytes_per_elem(dtype), **fixed)
    info = model_info(model, mode, data)
    check_degrees(info, batch, dp, tp, pp, microbatches)
    if dp > 1:
        tr = traced(model, batch // dp, seq, mode, data, imbalance)
        buckets = float(tr["trainable"].sum()) if mode == "train" else 0.0
        kv = _kv(model, batch // dp, seq, mode, kv_cache, data)
        return step_memory(tr, mode, optimizer, comm=buckets, kv_cache=kv, **fixed)
    if tp > 1:
        tr = traced(model, batch, seq, mode, data, imbalance)
        act, wsc = tp_scales(tr, tp, info, vocab_parallel, sharded)
        kv = _kv(model, batch, seq, mode, kv_cache, data) / tp
        return step_memory(tr, mode, optimizer, scale=act, wscale=wsc, kv_cache=kv, **fixed)
    stages = pipeline_memory(gpu, model, batch, seq, mode, optimizer, pp=pp,
                             microbatches=microbatches, kv_cache=kv_cache, data=data,
                             imbalance=imbalance)
    return max(stages, key=lambda m: m.total)


def pipeline_memory(gpu, model, batch: int, seq: int, mode: str = "train",
                    optimizer: str = "adam", *, pp: int = 2, microbatches: int = 1,
                    kv_cache: bool = False, data=None, imbalance: float = 1.0) -> list[Memory]:
    """Peak memory of each of the ``pp`` pipeline stages (GPipe, see the module docstring)."""
    _check(mode, optimizer)
    spec = resolve_gpu(gpu, data)
    info = model_info(model, mode, data)
    check_degrees(info, batch, 1, 1, pp, microbatches)
    fw, src = framework_bytes(spec, data, spec_path(gpu))
    mb = batch // microbatches
    tr = traced(model, mb, seq, mode, data, imbalance)
    stage = pipeline_stages(tr, pp, info["layers"])
    received = 4.0 * mb * seq * info["hidden"]   # FP32 activation from the previous stage
    kv = _kv(model, batch, seq, mode, kv_cache, data) / pp
    out = []
    for s in range(pp):
        sel = stage == s
        saved = _saved_bytes(tr, select=sel)
        flight = (microbatches - 1) * saved
        if s > 0:
            flight += received * (microbatches if mode == "train" else 1)
        out.append(step_memory(tr, mode, optimizer, select=sel, in_flight=flight, kv_cache=kv,
                               framework=fw, capacity=float(spec.mem_gb) * GIB,
                               context_source=src))
    return out


def _kv(model, batch, seq, mode, kv_cache, data, elem_bytes: int = 4) -> float:
    if not kv_cache:
        return 0.0
    if mode != "inf":
        raise ValueError("kv_cache applies to inference (mode='inf'): a training step keeps "
                         "no KV cache")
    return kv_cache_bytes(load_model_config(model, data), batch, seq, elem_bytes)


# --------------------------------------------------------------------------------------------
# Sweeps: storage sizes as laws of batch and sequence length
# --------------------------------------------------------------------------------------------

def storage_law(model, mode: str, data=None, batch_one: bool = False) -> dict:
    """Every storage's bytes as ``c * batch**i * seq**j`` from the sweep's three probe traces
    (:func:`nslib.model.sweep.scaling_law`; batch 1 has its own), so a sweep sizes the memory of
    any (batch, seq) without tracing it. Raises ValueError when the storages differ between
    the probes (then use :func:`memory_of` per scenario)."""
    probes = LAW_POINTS_ONE if batch_one else LAW_POINTS
    frames = [traced(model, b, s, mode, data) for b, s in probes]
    st = [_storages(f) for f in frames]
    if not all(len(x[2]) == len(st[0][2]) and (x[0] == st[0][0]).all()
               and (x[1] == st[0][1]).all() for x in st[1:]):
        raise ValueError("this model's storages change with batch or sequence length: compute "
                         "its memory per scenario with nslib.model.memory.memory_of")
    x, y, z = st[0][2], st[1][2], st[2][2]
    with np.errstate(divide="ignore", invalid="ignore"):
        i = np.zeros_like(x) if batch_one else np.round(np.log(y / x) / np.log(1.5))
        j = np.round(np.log(z / x) / np.log(1.5))
    i, j = np.nan_to_num(i), np.nan_to_num(j)
    c = x / (probes[0][0] ** i * probes[0][1] ** j)
    return {"base": frames[0], "first": st[0][0], "last": st[0][1], "c": c, "i": i, "j": j}


def law_memory(law: dict, batch: int, seq: int, mode: str, optimizer: str = "adam",
               **kw) -> Memory:
    """:func:`step_memory` of the trace of (``batch``, ``seq``) sized by a :func:`storage_law`
    (``kw``: framework, capacity... as step_memory takes)."""
    nbytes = np.round(law["c"] * float(batch) ** law["i"] * float(seq) ** law["j"])
    return step_memory(law["base"], mode, optimizer,
                       storages=(law["first"], law["last"], nbytes), **kw)


def sweep_memory(model, mode: str, scenarios: pd.DataFrame, optimizer: str = "adam",
                 data=None) -> pd.DataFrame:
    """``scenarios`` (columns ``gpu``, ``batch``, ``seq``) with ``memory_gb`` (the peak, GB),
    ``capacity_gb`` and ``fits`` added (one GPU each, no KV cache)."""
    laws = {one: storage_law(model, mode, data, batch_one=one)
            for one in pd.unique(scenarios["batch"] == 1)}
    gpus = {g: resolve_gpu(g, data) for g in pd.unique(scenarios["gpu"])}
    ctx = {g: framework_bytes(spec, data)[0] for g, spec in gpus.items()}
    own = {(b, s): law_memory(laws[b == 1], int(b), int(s), mode, optimizer).total
           for b, s in set(zip(scenarios["batch"], scenarios["seq"]))}
    out = scenarios.copy()
    total = np.array([own[(b, s)] + ctx[g] for g, b, s in
                      zip(out["gpu"], out["batch"], out["seq"])])
    cap = np.array([float(gpus[g].mem_gb) * GIB for g in out["gpu"]])
    out["memory_gb"], out["capacity_gb"], out["fits"] = total / GIB, cap / GIB, total <= cap
    return out


def largest_batch(model, mode: str, seq: int, gpus, optimizer: str = "adam", data=None,
                  limit: int = 1 << 16) -> pd.DataFrame:
    """The largest batch of ``seq`` tokens whose step fits on each GPU (0: not even batch 1),
    by bisection over :func:`law_memory` (the peak grows with the batch). Columns ``gpu``,
    ``seq``, ``largest_batch``, ``memory_gb`` (at that batch), ``capacity_gb``."""
    laws = {one: storage_law(model, mode, data, batch_one=one) for one in (True, False)}

    def need(b: int) -> float:
        return law_memory(laws[b == 1], b, seq, mode, optimizer).total

    rows = []
    for g in gpus:
        spec = resolve_gpu(g, data)
        room = float(spec.mem_gb) * GIB - framework_bytes(spec, data)[0]
        lo, hi = 0, limit + 1        # need(lo) fits (lo=0: nothing), need(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid) <= room else (lo, mid)
        used = need(lo) + float(spec.mem_gb) * GIB - room if lo else 0.0
        rows.append({"gpu": g, "seq": int(seq), "largest_batch": lo, "memory_gb": used / GIB,
                     "capacity_gb": float(spec.mem_gb)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# The published formula, for comparison
# --------------------------------------------------------------------------------------------

def korthikanti_bytes(seq: int, batch: int, hidden: int, heads: int, elem_bytes: int = 2,
                      mask_bytes: int = 1) -> float:
    """Activation bytes one transformer layer saves for its backward, by Korthikanti et al.
    (2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1):
    ``s*b*h*(34 + 5*a*s/h)`` for 16-bit activations and 1-byte dropout masks. Written per
    element size: ``s*b*h*(16*e + 2*m) + a*s*s*b*(2*e + m)`` (``e`` bytes per activation,
    ``m`` per mask element; ``e = 4`` for the FP32 steps nslib traces)."""
    s, b, h, a = (float(v) for v in (seq, batch, hidden, heads))
    return s * b * h * (16 * elem_bytes + 2 * mask_bytes) + a * s * s * b * (2 * elem_bytes +
                                                                           mask_bytes)


def layer_saved_bytes(trace: pd.DataFrame, layer: int) -> float:
    """Bytes the forward kernels of transformer block ``layer`` leave alive for the backward
    (a training trace): the trace's counterpart of :func:`korthikanti_bytes`."""
    sel = (trace["layer"].to_numpy() == layer) & (trace["phase"].to_numpy() == "fw")
    if not sel.any():
        raise ValueError(f"the trace has no forward kernels in block {layer}")
    return _saved_bytes(trace, select=sel)
