"""Training on several GPUs of one server: data, tensor and pipeline parallelism (method.md 6).

Every strategy starts from the single-GPU kernel trace (:func:`nslib.model.predict.traced`), turns it
into what one GPU runs, predicts the kernels with the kernel predictor and the communication
with a link model, and combines them with the strategy's schedule.

**Link model** (:class:`LinkSpec`). A GPU's datasheet link bandwidth (NVLink: the total of both
directions, e.g. 900 GB/s for H100 SXM, 600 GB/s for A100 SXM) times the paper's utilisation
0.72, halved (one direction of a full-duplex link), is the bandwidth a transfer sees:
``effective = bandwidth * 0.72 / 2``. A ring all-reduce of ``b`` bytes over ``n`` GPUs sends
``2*(n-1)/n * b`` bytes per GPU in ``2*(n-1)`` steps: ``2*(n-1)/n * b / effective +
2*(n-1) * latency``; a point-to-point send ``b / effective + latency``. The per-hop latency is a
nominal 1 us (an order of magnitude for NVLink), not fitted; it matters only for tiny messages.
Where the bandwidth comes from (:func:`default_link`): an optional ``Link_Bw`` key (GB/s, both
directions) in the GPU's device JSON (also ``Link_Util`` and ``Link_Latency_us``), else a
documented rule on the device name (:data:`LINK_RULES`: the NVLink generation of SXM parts,
the PCIe generation of PCIe cards), else PCIe 3.0 x16; ``link=`` / ``--link-bw`` override it.

**Data parallel** (``dp=n``): each GPU runs the trace at ``batch / n``. Every parameter's
gradient is all-reduced, one message per transformer block (its parameters, counted on the
model built on the meta device) and one for the parameters outside the blocks. Walking the
backward kernels in launch order with their predicted times, a block's all-reduce is issued
when its last weight-gradient GEMM finishes (a backward ``linear`` kernel that reads a
forward activation); the parameters outside the blocks (embeddings, whose gradient is
complete only at the end, final norm, head) are issued when the backward ends. The link
carries one all-reduce at a time, in issue order. ``step = forward + max(backward compute,
time the last all-reduce finishes)``.

**Tensor parallel** (``tp=n``, Megatron-LM): inside each transformer block, a forward pass
over the ``inputs`` edges marks what is sharded: a ``linear`` whose input is replicated is
column-split (its output features ``K`` divided by ``n``: QKV, fc1), one whose input is
sharded is row-split (its reduction ``N`` divided: attention output projection, fc2) and
its output, after an all-reduce, is replicated; any other kernel reading a sharded tensor is
sharded (attention BMMs and softmax over ``heads / n``, the activation function over
``fc1 / n`` features), the rest (LayerNorms, residual adds, dropouts after the row-split
GEMMs) is replicated. Backward kernels follow their module: the input- and weight-gradient
GEMMs of a split linear are divided on the matching dimension, the other backward kernels of
a sharded module are divided, those of a replicated one are not. With ``vocab_parallel``
(default, as the original tool's graph and Megatron's GPT: ``Linear (4096, 1280, 12564)`` for
GPT2-Large) the token embedding and the LM head are split over the vocabulary
(``ceil(V / n)`` rows each) and so are the vocabulary-sized kernels outside the blocks
(logits, embedding gradients). Communication rows (``cls`` ``"comm"``): an all-reduce of the
activation after each row-split GEMM and after the token embedding (forward), and of the
input gradient of each column-split group (the linears reading one tensor: QKV or q, k, v;
fc1; the LM head) in the backward: two per block each way. Nothing overlaps:
``step = sum of kernels + sum of all-reduces``. ``n`` must divide the attention heads.

**Pipeline parallel** (``pp=n``, ``microbatches=M``): the blocks are split into ``n``
contiguous stages of ``n_layer / n`` blocks; kernels outside the blocks go with the nearest
block kernel before them in launch order (after it for the leading ones: the embeddings with
the first stage, the head with the last). Each GPU runs its stage on micro-batches of
``batch / M``; between stages the activation (``batch / M * seq * hidden`` FP32 values) is
sent forward and its gradient backward. GPipe schedule: micro-batch ``m`` starts on stage
``s`` when the stage has finished micro-batch ``m - 1`` and the activation of ``m`` has
arrived from stage ``s - 1``; all forwards, then all backwards through the stages in
reverse. With balanced stages of time ``t`` this is ``(M + n - 1) * t`` plus ``n - 1``
transfers per direction; with one micro-batch it is the sum of the stages plus the transfers.

Only one strategy at a time; degrees must divide the model (DP: the batch; TP: the heads;
PP: the blocks, and ``M`` the batch), else ValueError naming the constraint.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.model.stream import LAUNCH_US, stream_ms
from nslib.model.blocks import block_index
from nslib.model.config import MEASURED_ARCHITECTURE, build_model, load_model_config
from nslib.model.inputs import get_predictor, kernel_frame, resolve_gpu, spec_path as spec_path_of, traced
from nslib.model.fusion import fuse
from nslib.data.paths import data_root

__all__ = ["LinkSpec", "LINK_RULES", "default_link", "resolve_link", "model_info",
           "check_degrees", "shard_tensor_parallel", "pipeline_stages", "predict_parallel",
           "dp_schedule", "tp_schedule", "pp_schedule", "gpipe_time"]


# --------------------------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LinkSpec:
    """A GPU-to-GPU link: datasheet bandwidth (GB/s, both directions), utilisation, latency."""

    bandwidth_gbps: float
    utilisation: float = 0.72
    latency_us: float = 1.0
    halved: bool = True     # datasheet figure counts both directions: one direction is half
    source: str = ""        # where the bandwidth came from (for reports)

    def __post_init__(self):
        for name in ("bandwidth_gbps", "utilisation"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"LinkSpec.{name} must be a positive number, got {v!r}")
        if not (isinstance(self.latency_us, (int, float)) and self.latency_us >= 0):
            raise ValueError(f"LinkSpec.latency_us must be >= 0, got {self.latency_us!r}")

    @property
    def effective_gbps(self) -> float:
        """What one transfer sees: bandwidth * utilisation (/ 2 when halved), GB/s."""
        return self.bandwidth_gbps * self.utilisation / (2.0 if self.halved else 1.0)

    def allreduce_ms(self, nbytes, n: int):
        """Ring all-reduce of ``nbytes`` over ``n`` GPUs, ms (0 for n = 1)."""
        nbytes = np.asarray(nbytes, float)
        if n <= 1:
            return nbytes * 0.0
        steps = 2 * (n - 1)
        return (steps / n) * nbytes / (self.effective_gbps * 1e9) * 1e3 + \
            steps * self.latency_us * 1e-3

    def p2p_ms(self, nbytes):
        """A point-to-point send of ``nbytes``, ms."""
        nbytes = np.asarray(nbytes, float)
        return nbytes / (self.effective_gbps * 1e9) * 1e3 + self.latency_us * 1e-3

    def to_dict(self) -> dict:
        return {**asdict(self), "effective_gbps": self.effective_gbps}


# (regex on the lower-cased device name, GB/s both directions, what it is). First match wins.
LINK_RULES = (
    (r"(h100|h200|h800|gh200)(?!.*pcie)", 900.0, "NVLink 4 (Hopper SXM)"),
    (r"(h100|h200|h800).*pcie", 128.0, "PCIe 5.0 x16 (Hopper PCIe card)"),
    (r"(a100|a800).*sxm", 600.0, "NVLink 3 (A100 SXM)"),
    (r"v100.*sxm", 300.0, "NVLink 2 (V100 SXM2)"),
    (r"p100.*sxm", 160.0, "NVLink 1 (P100 SXM2)"),
    (r"(a100|a800|a10|a30|a40|l4|l40|rtx a|a6000).*|.*ampere|.*ada", 64.0,
     "PCIe 4.0 x16 (Ampere/Ada PCIe card)"),
    (r".*", 32.0, "PCIe 3.0 x16 (fallback)"),
)


def raw_spec(gpu, spec_path=None, data=None) -> dict:
    """The raw device JSON of a GPU (for optional keys the GPU dataclass does not carry)."""
    paths = []
    if spec_path is not None:
        paths.append(Path(spec_path))
    key = getattr(gpu, "key", "")
    if key:
        try:
            paths.append(data_root(data) / "data" / "device_configs" / f"{key}.json")
        except Exception:  # noqa: BLE001 - no data folder: no optional keys
            pass
    for p in paths:
        try:
            raw = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict):
            return raw
    return {}


def default_link(gpu, data=None, spec_path=None) -> LinkSpec:
    """The link of a GPU: ``Link_Bw`` (and ``Link_Util``, ``Link_Latency_us``) from its device
    JSON when present, else :data:`LINK_RULES` on its name (see the module docstring)."""
    raw = raw_spec(gpu, spec_path, data)
    name = getattr(gpu, "name", str(gpu))
    util = raw.get("Link_Util", 0.72)
    lat = raw.get("Link_Latency_us", 1.0)
    bw = raw.get("Link_Bw")
    if bw is not None:
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < bw < math.inf:
            raise ValueError(f"{name}: device JSON field 'Link_Bw' (GPU-to-GPU link bandwidth, "
                             f"GB/s both directions) must be a positive number, got {bw!r}")
        return LinkSpec(float(bw), float(util), float(lat), source="device JSON Link_Bw")
    low = name.lower()
    for pattern, gbps, what in LINK_RULES:
        if re.search(pattern, low):
            return LinkSpec(gbps, float(util), float(lat), source=f"rule: {what}")
    raise AssertionError("LINK_RULES ends with a catch-all")


def resolve_link(link, gpu, data=None, spec_path=None) -> LinkSpec:
    """``link`` as a LinkSpec: None -> :func:`default_link`; a number -> that datasheet
    bandwidth (GB/s) with the default utilisation, halving and latency; a LinkSpec as is;
    a dict -> LinkSpec fields."""
    if link is None:
        return default_link(gpu, data, spec_path)
    if isinstance(link, LinkSpec):
        return link
    if isinstance(link, dict):
        return LinkSpec(**link)
    if isinstance(link, (int, float)) and not isinstance(link, bool):
        base = default_link(gpu, data, spec_path)
        return replace(base, bandwidth_gbps=float(link), source="override")
    raise TypeError(f"link must be None, a bandwidth in GB/s, a dict or a LinkSpec, "
                    f"not {type(link).__name__}")


# --------------------------------------------------------------------------------------------
# The model: sizes and parameters per block
# --------------------------------------------------------------------------------------------

def model_info(model, mode: str = "train", data=None) -> dict:
    """Sizes of a model config: ``hidden``, ``heads``, ``layers`` (transformer blocks),
    ``vocab``, ``param_bytes`` (FP32 bytes of the parameters per block index, -1 for those
    outside the blocks; tied weights once) and ``vocab_modules`` (embedding modules with a
    vocabulary-sized table). Built on the meta device (no memory), cached."""
    config = load_model_config(model, data)
    return _model_info(json.dumps(config, sort_keys=True), mode)


@lru_cache(maxsize=32)
def _model_info(config_json: str, mode: str) -> dict:
    import torch.nn as nn
    config = json.loads(config_json)
    hf, model = build_model(config, MEASURED_ARCHITECTURE.get((config.get("model_type"), mode)))
    blocks = block_index(model)
    per: dict[int, float] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        layer = -1
        for i in range(len(parts) - 1, 0, -1):
            hit = blocks.get(".".join(parts[:i]))
            if hit is not None:
                layer = hit
                break
        per[layer] = per.get(layer, 0.0) + float(p.numel()) * sizes.BYTES_PER_ELEM
    vocab = int(getattr(hf, "vocab_size", 0) or 0)
    vocab_modules = tuple(n for n, m in model.named_modules()
                          if isinstance(m, nn.Embedding) and vocab and m.num_embeddings == vocab)
    return {"hidden": int(getattr(hf, "hidden_size")),
            "heads": int(getattr(hf, "num_attention_heads")),
            "layers": len(blocks), "vocab": vocab, "param_bytes": per,
            "vocab_modules": vocab_modules}


def check_degrees(info: dict, batch: int, dp: int = 1, tp: int = 1, pp: int = 1,
                  microbatches: int = 1) -> None:
    """ValueError unless the degrees are positive integers that divide the model."""
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if sum(d > 1 for d in (dp, tp, pp)) > 1:
        raise ValueError(f"combining parallelism kinds (dp={dp}, tp={tp}, pp={pp}) is not "
                         f"modelled: set only one of dp, tp, pp above 1")
    if microbatches > 1 and pp == 1:
        raise ValueError("microbatches applies to pipeline parallelism: set pp > 1 "
                         "(or microbatches=1)")
    if batch % dp:
        raise ValueError(f"data parallelism needs the global batch divisible by dp: batch "
                         f"{batch} is not divisible by dp={dp}")
    if info["heads"] % tp:
        raise ValueError(f"tensor parallelism needs the attention heads divisible by tp: "
                         f"{info['heads']} heads are not divisible by tp={tp}")
    if info["layers"] % pp or (pp > 1 and info["layers"] == 0):
        raise ValueError(f"pipeline parallelism needs the transformer layers divisible by pp: "
                         f"{info['layers']} layers are not divisible by pp={pp}")
    if pp > 1 and batch % microbatches:
        raise ValueError(f"pipeline micro-batches must divide the batch: batch {batch} is not "
                         f"divisible by microbatches={microbatches}")


# --------------------------------------------------------------------------------------------
# Frame helpers
# --------------------------------------------------------------------------------------------

def _count(row) -> float:
    """Elements of a row: B*H for vector ops, H (written) for memory rows."""
    if row["cls"] == "memory":
        return float(row["H"])
    return float(row["B"] * row["H"])


def _ceil_div(v: float, n: int) -> float:
    return float(np.ceil(v / n))


def _divide_vector(df: pd.DataFrame, i: int, n: int) -> None:
    """Divide the work of a non-GEMM row (or a BMM) n ways, in place."""
    c = df.at[i, "cls"]
    if c == "bmm":
        B, M = df.at[i, "B"], df.at[i, "M"]
        if B % n == 0 or B >= M:
            df.at[i, "B"] = _ceil_div(B, n)
        else:
            df.at[i, "M"] = _ceil_div(M, n)
        _gemm_counts(df, i)
        return
    if c == "memory":
        H = df.at[i, "H"]
        df.at[i, "H"] = _ceil_div(H, n) if H > 1 else H
        df.at[i, "bytes"] = df.at[i, "bytes"] / n
        df.at[i, "flops"] = df.at[i, "flops"] / n
        return
    B, H = df.at[i, "B"], df.at[i, "H"]
    old = B * H
    if B % n == 0 or (B >= H and B > 1):
        df.at[i, "B"] = _ceil_div(B, n)
    else:
        df.at[i, "H"] = _ceil_div(H, n)
    f = df.at[i, "B"] * df.at[i, "H"] / old
    df.at[i, "bytes"] = df.at[i, "bytes"] * f
    df.at[i, "flops"] = df.at[i, "flops"] * f


def _gemm_counts(df: pd.DataFrame, i: int) -> None:
    B, M, N, K = (float(df.at[i, c]) for c in ("B", "M", "N", "K"))
    df.at[i, "flops"] = 2.0 * B * M * N * K
    df.at[i, "bytes"] = float(sizes.BYTES_PER_ELEM * B * (M * N + N * K + M * K))


def _split_dim(df: pd.DataFrame, i: int, value: float, prefer: str, n: int) -> None:
    """Divide (ceil) the GEMM dim of row i that equals ``value``, preferring ``prefer``."""
    cands = [c for c in ("M", "N", "K") if df.at[i, c] == value]
    col = prefer if (prefer in cands or not cands) else cands[0]
    df.at[i, col] = _ceil_div(df.at[i, col], n)
    _gemm_counts(df, i)


def _comm_row(template: pd.Series, kid: int, op: str, nbytes: float, peers: int,
              phase: str | None = None, module: str = "") -> dict:
    return {"kid": kid, "phase": phase or template["phase"], "aten": f"comm.{op}",
            "cls": "comm", "op": op, "B": 1.0, "M": np.nan, "N": np.nan, "K": np.nan,
            "H": float(nbytes / sizes.BYTES_PER_ELEM), "flops": 0.0, "bytes": float(nbytes),
            "inputs": (int(template["kid"]),), "layer": int(template["layer"]),
            "module": module or template["module"], "peers": int(peers)}


def _insert_after(df: pd.DataFrame, extra: list[tuple[int, dict]]) -> pd.DataFrame:
    """``df`` with each extra row placed after the row at position ``pos``."""
    if not extra:
        out = df.copy()
        if "peers" not in out:
            out["peers"] = np.nan
        return out
    order = np.arange(len(df), dtype=float)
    add = pd.DataFrame([r for _, r in extra])
    add_order = np.array([p for p, _ in extra], float) + 0.5 + \
        np.arange(len(extra)) * 1e-6
    out = pd.concat([df.assign(_o=order), add.assign(_o=add_order)], ignore_index=True)
    out = out.sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)
    out["kid"] = out["kid"].astype(np.int64)
    out["layer"] = out["layer"].astype(np.int64)
    return out


def _module_lookup(table: dict, name: str):
    """The value for module ``name`` or its nearest ancestor in ``table`` (None if none)."""
    while True:
        if name in table:
            return table[name]
        if "." not in name:
            return table.get("")
        name = name.rsplit(".", 1)[0]


# --------------------------------------------------------------------------------------------
# Tensor parallelism: transform the trace
# --------------------------------------------------------------------------------------------

def shard_tensor_parallel(trace: pd.DataFrame, n: int, info: dict,
                          vocab_parallel: bool = True) -> pd.DataFrame:
    """What one of ``n`` tensor-parallel GPUs runs (see the module docstring), with
    all-reduce rows (``cls`` ``"comm"``, ``op`` ``"allreduce"``, ``peers`` = n) and a
    ``tp_split`` column naming what was done to each kernel (``col``, ``row``, ``shard``,
    ``vocab`` or ``""`` for a replicated kernel)."""
    if info["heads"] % n:
        raise ValueError(f"tensor parallelism needs the attention heads divisible by tp: "
                         f"{info['heads']} heads are not divisible by tp={n}")
    df = trace.reset_index(drop=True).copy()
    df["tp_split"] = ""
    if n == 1:
        df["peers"] = np.nan
        return df
    pos = {int(k): i for i, k in enumerate(df["kid"])}
    ins = [[pos[int(k)] for k in v if int(k) in pos] for v in df["inputs"]]
    phase = df["phase"].to_numpy()
    layer = df["layer"].to_numpy()
    cls = df["cls"].to_numpy()
    module = df["module"].fillna("").to_numpy()
    V = int(info.get("vocab") or 0)
    vocab_mods = set(info.get("vocab_modules") or ())
    sharded = np.zeros(len(df), bool)
    role: dict[str, str] = {}          # linear module -> "col" / "row"
    fw_dims: dict[str, tuple] = {}     # linear module -> forward (M, N, K)
    fw_input: dict[str, tuple] = {}    # linear module -> its forward input producers
    mod_votes: dict[str, list] = {}    # module -> sharded flags of its forward non-GEMM rows
    extra: list[tuple[int, dict]] = []
    next_kid = int(df["kid"].max()) + 1 if len(df) else 0

    def comm(i, nbytes, phase_=None):
        nonlocal next_kid
        extra.append((i, _comm_row(df.loc[i], next_kid, "allreduce", nbytes, n, phase_)))
        next_kid += 1

    # forward: propagate "sharded" along the edges, split the GEMMs, place the all-reduces
    for i in np.flatnonzero(phase == "fw"):
        any_sh = any(sharded[j] for j in ins[i])
        m = module[i]
        if cls[i] == "linear":
            M, N, K = (float(df.at[i, c]) for c in ("M", "N", "K"))
            r = None
            if layer[i] >= 0:
                r = "row" if any_sh else "col"
            elif vocab_parallel and V and K == V and not any_sh:
                r = "col"
            if r is None:
                continue
            role[m], fw_dims[m], fw_input[m] = r, (M, N, K), tuple(df.at[i, "inputs"])
            if r == "col":
                _split_dim(df, i, K, "K", n)
                sharded[i] = True
                df.at[i, "tp_split"] = "col" if layer[i] >= 0 else "vocab"
            else:
                _split_dim(df, i, N, "N", n)
                df.at[i, "tp_split"] = "row"
                comm(i, sizes.BYTES_PER_ELEM * M * K)
            continue
        if layer[i] >= 0:
            mod_votes.setdefault(m, []).append(bool(any_sh))
        if any_sh:
            sharded[i] = True
            _divide_vector(df, i, n)
            df.at[i, "tp_split"] = "shard"
        elif vocab_parallel and cls[i] == "memory" and m in vocab_mods:
            # vocabulary-parallel embedding: each GPU gathers its rows, then an all-reduce
            comm(i, sizes.BYTES_PER_ELEM * float(df.at[i, "H"]))
    mod_sharded = {m: (np.mean(v) >= 0.5) for m, v in mod_votes.items()}

    # backward: follow the module of each kernel
    bw_groups: dict[tuple, int] = {}   # column-split group (its forward input) -> last dX pos
    bw_bytes: dict[tuple, float] = {}
    fw_rows = phase == "fw"
    for i in np.flatnonzero(phase == "bw"):
        m = module[i]
        r = role.get(m)
        if cls[i] == "linear" and r is not None:
            M, N, K = fw_dims[m]
            dW = any(fw_rows[j] for j in ins[i])
            if r == "col":
                if dW:
                    _split_dim(df, i, K, "K", n)
                else:
                    _split_dim(df, i, K, "N", n)
                    key = (layer[i], fw_input[m])
                    bw_groups[key] = i
                    bw_bytes[key] = sizes.BYTES_PER_ELEM * M * N
            else:
                _split_dim(df, i, N, "M" if dW else "K", n)
            df.at[i, "tp_split"] = r if layer[i] >= 0 else "vocab"
            continue
        if cls[i] == "linear":
            if layer[i] < 0 and vocab_parallel and V and V in (df.at[i, "M"], df.at[i, "N"],
                                                                 df.at[i, "K"]):
                _split_dim(df, i, V, "K", n)
                df.at[i, "tp_split"] = "vocab"
            continue
        if r is not None:  # bias gradients and accumulation adds of a split linear
            M, N, K = fw_dims[m]
            if r == "col" or _count(df.loc[i]) == N * K:
                _divide_vector(df, i, n)
                df.at[i, "tp_split"] = "shard"
            continue
        if layer[i] >= 0:
            if _module_lookup(mod_sharded, m):
                _divide_vector(df, i, n)
                df.at[i, "tp_split"] = "shard"
            continue
        if vocab_parallel and V and _count(df.loc[i]) % V == 0 and _count(df.loc[i]) > 0:
            _divide_vector(df, i, n)
            df.at[i, "tp_split"] = "vocab"
    for key, i in bw_groups.items():
        comm(i, bw_bytes[key])
    return _insert_after(df, extra)


# --------------------------------------------------------------------------------------------
# Pipeline parallelism: stages
# --------------------------------------------------------------------------------------------

def pipeline_stages(trace: pd.DataFrame, n: int, layers: int | None = None) -> np.ndarray:
    """Stage index of each row: block ``l`` -> ``l // (layers / n)``; rows outside the blocks
    take the stage of the nearest block row before them in their phase (after it when none
    precedes)."""
    layer = trace["layer"].to_numpy()
    if layers is None:
        layers = int(layer.max()) + 1 if (layer >= 0).any() else 0
    if layers == 0:
        return np.zeros(len(trace), dtype=np.int64)
    if layers % n:
        raise ValueError(f"pipeline parallelism needs the transformer layers divisible by pp: "
                         f"{layers} layers are not divisible by pp={n}")
    per = layers // n
    stage = pd.Series(np.where(layer >= 0, layer // per, np.nan), index=trace.index, dtype=float)
    phase = trace["phase"].to_numpy()
    out = stage.copy()
    for p in pd.unique(phase):
        mask = phase == p
        out[mask] = stage[mask].ffill().bfill()
    return out.fillna(0).to_numpy().astype(np.int64)


def gpipe_time(stage_ms, microbatches: int, transfer_ms: float) -> float:
    """Finish time of ``microbatches`` through stages of the given times (GPipe recursion)."""
    stage_ms = list(stage_ms)
    done = [0.0] * len(stage_ms)   # finish time of the previous micro-batch on each stage
    for _ in range(microbatches):
        arrive = 0.0
        for s, t in enumerate(stage_ms):
            start = max(done[s], arrive + (transfer_ms if s > 0 else 0.0))
            done[s] = start + t
            arrive = done[s]
    return done[-1] if done else 0.0


# --------------------------------------------------------------------------------------------
# Prediction and schedules
# --------------------------------------------------------------------------------------------

def _predict_rows(frame: pd.DataFrame, spec, pred, link: LinkSpec,
                  launch_us: float | None = LAUNCH_US, data=None) -> pd.DataFrame:
    """Kernel rows by the predictor (as a kernel stream, :func:`nslib.model.stream.stream_ms`),
    comm rows by the link model; adds ``pred_ms``."""
    is_comm = (frame["cls"] == "comm").to_numpy()
    kf = kernel_frame(frame[~is_comm], spec)
    kf["pred_ms"] = stream_ms(pred, kf, launch_us, data)
    if not is_comm.any():
        return kf
    cf = frame[is_comm].copy()
    for k, v in spec.columns().items():
        cf[k] = v
    cf["kernel_class"] = "comm"
    peers = cf["peers"].to_numpy(float)
    nbytes = cf["bytes"].to_numpy(float)
    ms = np.where(cf["op"].to_numpy() == "allreduce",
                  [float(link.allreduce_ms(b, int(p))) for b, p in zip(nbytes, peers)],
                  link.p2p_ms(nbytes))
    cf["pred_ms"] = ms
    out = pd.concat([kf.assign(_o=np.flatnonzero(~is_comm)),
                     cf.assign(_o=np.flatnonzero(is_comm))])
    return out.sort_values("_o").drop(columns="_o").reset_index(drop=True)


def _per_class(frame: pd.DataFrame) -> dict:
    per = frame.groupby("kernel_class")["pred_ms"].sum()
    return {k: float(v) for k, v in per.items()}


def dp_schedule(frame: pd.DataFrame, n: int, link: LinkSpec, param_bytes: dict) -> dict:
    """Data-parallel step from a predicted per-GPU frame (see the module docstring).

    Returns ``fw_ms``, ``bw_ms`` (compute), ``comm_ms`` (all all-reduces), ``finish_ms`` (the
    last all-reduce's end, from the start of the backward), ``e2e_ms`` and ``buckets`` (one
    dict per all-reduce: layer, bytes, issue_ms, start_ms, end_ms)."""
    fw_ms = float(frame.loc[frame["phase"] == "fw", "pred_ms"].sum())
    bw = frame[(frame["phase"] == "bw") & (frame["cls"] != "comm")]
    bw_ms = float(bw["pred_ms"].sum())
    buckets = []
    if len(bw) and n > 1:
        end = np.cumsum(bw["pred_ms"].to_numpy(float))
        fw_kids = set(frame.loc[frame["phase"] == "fw", "kid"].astype(int))
        is_dw = np.array([c == "linear" and any(int(k) in fw_kids for k in ins)
                          for c, ins in zip(bw["cls"], bw["inputs"])])
        layer = bw["layer"].to_numpy()
        for l, b in sorted(param_bytes.items()):
            if b <= 0:
                continue
            if l < 0:
                issue = bw_ms
            else:
                sel = (layer == l) & is_dw
                if not sel.any():
                    sel = layer == l
                issue = float(end[sel].max()) if sel.any() else bw_ms
            buckets.append({"layer": int(l), "bytes": float(b), "issue_ms": issue})
    buckets.sort(key=lambda d: (d["issue_ms"], -d["layer"]))
    t = 0.0
    for d in buckets:
        d["start_ms"] = max(t, d["issue_ms"])
        d["end_ms"] = d["start_ms"] + float(link.allreduce_ms(d["bytes"], n))
        t = d["end_ms"]
    comm = float(sum(d["end_ms"] - d["start_ms"] for d in buckets))
    finish = t
    return {"fw_ms": fw_ms, "bw_ms": bw_ms, "comm_ms": comm, "finish_ms": finish,
            "exposed_comm_ms": max(finish - bw_ms, 0.0),
            "e2e_ms": fw_ms + max(bw_ms, finish), "buckets": buckets}


def tp_schedule(frame: pd.DataFrame) -> dict:
    """Tensor-parallel step: everything in sequence."""
    fw = float(frame.loc[frame["phase"] == "fw", "pred_ms"].sum())
    bw = float(frame.loc[frame["phase"] == "bw", "pred_ms"].sum())
    comm = float(frame.loc[frame["cls"] == "comm", "pred_ms"].sum())
    return {"fw_ms": fw, "bw_ms": bw, "comm_ms": comm, "e2e_ms": fw + bw}


def pp_schedule(frame: pd.DataFrame, n: int, microbatches: int, transfer_ms: float) -> dict:
    """Pipeline step (GPipe, see the module docstring) from a predicted frame of one
    micro-batch with a ``stage`` column."""
    k = frame[frame["cls"] != "comm"]
    fw_s = [float(k.loc[(k["phase"] == "fw") & (k["stage"] == s), "pred_ms"].sum())
            for s in range(n)]
    bw_s = [float(k.loc[(k["phase"] == "bw") & (k["stage"] == s), "pred_ms"].sum())
            for s in range(n)]
    t_fw = gpipe_time(fw_s, microbatches, transfer_ms)
    has_bw = any(b > 0 for b in bw_s)
    t_bw = gpipe_time(bw_s[::-1], microbatches, transfer_ms) if has_bw else 0.0
    n_xfer = (n - 1) * (2 if has_bw else 1)
    return {"fw_ms": t_fw, "bw_ms": t_bw, "e2e_ms": t_fw + t_bw,
            "comm_ms": n_xfer * transfer_ms, "stage_fw_ms": fw_s, "stage_bw_ms": bw_s,
            "transfer_ms": transfer_ms}


def predict_parallel(gpu, model, batch: int, seq: int, mode: str = "train",
                     predictor="neusight", data=None, quick: bool = False, *,
                     fused: bool = False, dp: int = 1, tp: int = 1, pp: int = 1,
                     microbatches: int = 1, link=None, vocab_parallel: bool = True,
                     launch_us: float | None = LAUNCH_US):
    """One step on ``dp``/``tp``/``pp`` GPUs: ``(frame, summary)`` as
    :func:`nslib.model.predict.predict_model` (which calls this when a degree is set).

    ``batch`` is the global batch. The frame is what one GPU runs (for PP: one micro-batch on
    every stage, with a ``stage`` column), comm rows included; the summary's ``e2e_ms`` is the
    step time of the strategy's schedule, ``fw_ms``/``bw_ms`` its forward and backward
    parts, ``comm_ms`` the communication time, ``parallel`` the strategy, link and schedule.
    ``launch_us`` as in :func:`nslib.model.predict.predict_model`.
    """
    spec = resolve_gpu(gpu, data)
    spec_path = spec_path_of(gpu)
    info = model_info(model, mode, data)
    check_degrees(info, batch, dp, tp, pp, microbatches)
    lk = resolve_link(link, spec, data, spec_path)
    pred = get_predictor(predictor, data, quick)
    desc = {"link": lk.to_dict(), "fused": bool(fused), "global_batch": int(batch)}

    def prep(tr):
        return fuse(tr, prologues=True) if fused else tr

    if dp > 1 or (tp == 1 and pp == 1):
        n = dp
        tr = prep(traced(model, batch // n, seq, mode, data))
        frame = _predict_rows(tr.assign(peers=np.nan), spec, pred, lk, launch_us, data)
        sched = dp_schedule(frame, n, lk, info["param_bytes"] if mode == "train" else {})
        comm_rows = [{"kid": int(frame["kid"].max()) + 1 + j, "phase": "bw",
                      "aten": "comm.allreduce", "cls": "comm", "op": "allreduce",
                      "B": 1.0, "H": d["bytes"] / sizes.BYTES_PER_ELEM, "flops": 0.0,
                      "bytes": d["bytes"], "inputs": (), "layer": d["layer"],
                      "module": "gradients", "peers": n, "kernel_class": "comm",
                      "pred_ms": d["end_ms"] - d["start_ms"]}
                     for j, d in enumerate(sched["buckets"])]
        if comm_rows:
            frame = pd.concat([frame, pd.DataFrame(comm_rows)], ignore_index=True)
        desc.update(kind="dp", degree=n, per_gpu_batch=batch // n,
                    **{k: sched[k] for k in ("finish_ms", "exposed_comm_ms", "buckets")})
    elif tp > 1:
        n = tp
        tr = traced(model, batch, seq, mode, data)
        tr = prep(shard_tensor_parallel(tr, n, info, vocab_parallel))
        frame = _predict_rows(tr, spec, pred, lk, launch_us, data)
        sched = tp_schedule(frame)
        desc.update(kind="tp", degree=n, vocab_parallel=bool(vocab_parallel),
                    allreduces=int((frame["cls"] == "comm").sum()))
    else:
        n = pp
        mb = batch // microbatches
        tr = traced(model, mb, seq, mode, data)
        tr = tr.assign(stage=pipeline_stages(tr, n, info["layers"]))
        tr = prep(tr)
        act = float(sizes.BYTES_PER_ELEM * mb * seq * info["hidden"])
        x = float(lk.p2p_ms(act))
        extra = []
        next_kid = int(tr["kid"].max()) + 1
        st, ph = tr["stage"].to_numpy(), tr["phase"].to_numpy()
        for p, senders in (("fw", range(n - 1)), ("bw", range(n - 1, 0, -1))):
            for s in senders:
                rows = np.flatnonzero((ph == p) & (st == s))
                if len(rows):
                    r = _comm_row(tr.iloc[rows[-1]], next_kid, "sendrecv", act, 2)
                    r["stage"] = s
                    extra.append((int(rows[-1]), r))
                    next_kid += 1
        tr = _insert_after(tr.reset_index(drop=True), extra)
        frame = _predict_rows(tr, spec, pred, lk, launch_us, data)
        sched = pp_schedule(frame, n, microbatches, x)
        desc.update(kind="pp", degree=n, microbatches=int(microbatches),
                    microbatch_size=mb, activation_bytes=act,
                    **{k: sched[k] for k in ("stage_fw_ms", "stage_bw_ms", "transfer_ms")})
    summary = {"e2e_ms": float(sched["e2e_ms"]), "fw_ms": float(sched["fw_ms"]),
               "bw_ms": float(sched["bw_ms"]), "per_class_ms": _per_class(frame),
               "n_kernels": int((frame["cls"] != "comm").sum()),
               "comm_ms": float(sched["comm_ms"]), "parallel": desc, "launch_us": launch_us}
    return frame, summary
