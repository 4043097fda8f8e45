"""Tensor parallelism (Megatron-LM): what one of ``n`` GPUs runs of a single-GPU trace.

**Tensor parallel** (``tp=n``): inside each transformer block, a forward pass over the
``inputs`` edges marks what is sharded: a ``linear`` whose input is replicated is column-split
(its output features ``K`` divided by ``n``: QKV, fc1), one whose input is sharded is
row-split (its reduction ``N`` divided: attention output projection, fc2) and its output,
after an all-reduce, is replicated; any other kernel reading a sharded tensor is sharded
(attention BMMs and softmax over ``heads / n``, the activation function over ``fc1 / n``
features), the rest (LayerNorms, residual adds, dropouts after the row-split GEMMs) is
replicated. Backward kernels follow their module: the input- and weight-gradient GEMMs of a
split linear are divided on the matching dimension, the other backward kernels of a sharded
module are divided, those of a replicated one are not. With ``vocab_parallel`` (default, as
the original tool's graph and Megatron's GPT: ``Linear (4096, 1280, 12564)`` for GPT2-Large)
the token embedding and the LM head are split over the vocabulary (``ceil(V / n)`` rows each)
and so are the vocabulary-sized kernels outside the blocks (logits, embedding gradients).
Communication rows (``cls`` ``"comm"``): an all-reduce of the activation after each row-split
GEMM and after the token embedding (forward), and of the input gradient of each column-split
group (the linears reading one tensor: QKV or q, k, v; fc1; the LM head) in the backward: two
per block each way. ``n`` must divide the attention heads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.model.parallel.schedules import comm_row_after, insert_after

__all__ = ["shard_tensor_parallel"]

# A module's backward kernels are sharded when at least this share of its forward non-GEMM
# kernels read a sharded tensor.
SHARDED_MAJORITY = 0.5


# --------------------------------------------------------------------------------------------
# Dividing one row's work
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
        B, M, elem = df.at[i, "B"], df.at[i, "M"], _elem(df, i)
        if B % n == 0 or B >= M:
            df.at[i, "B"] = _ceil_div(B, n)
        else:
            df.at[i, "M"] = _ceil_div(M, n)
        _gemm_counts(df, i, elem)
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


def _elem(df: pd.DataFrame, i: int) -> float:
    """Bytes per element of GEMM row i (4 in an FP32 trace, 2 for a 16-bit GEMM)."""
    B, M, N, K = (float(df.at[i, c]) for c in ("B", "M", "N", "K"))
    return float(df.at[i, "bytes"]) / (B * (M * N + N * K + M * K))


def _gemm_counts(df: pd.DataFrame, i: int, elem: float) -> None:
    """FLOPs and bytes of GEMM row i from its dims, at ``elem`` bytes per element."""
    B, M, N, K = (float(df.at[i, c]) for c in ("B", "M", "N", "K"))
    df.at[i, "flops"] = 2.0 * B * M * N * K
    df.at[i, "bytes"] = float(elem * B * (M * N + N * K + M * K))


def _split_dim(df: pd.DataFrame, i: int, value: float, prefer: str, n: int) -> None:
    """Divide (ceil) the GEMM dim of row i that equals ``value``, preferring ``prefer``."""
    cands = [c for c in ("M", "N", "K") if df.at[i, c] == value]
    col = prefer if (prefer in cands or not cands) else cands[0]
    elem = _elem(df, i)
    df.at[i, col] = _ceil_div(df.at[i, col], n)
    _gemm_counts(df, i, elem)


def _divide(df: pd.DataFrame, i: int, n: int, how: str) -> None:
    """:func:`_divide_vector` and record ``how`` (``shard``, ``vocab``) as the row's split."""
    _divide_vector(df, i, n)
    df.at[i, "tp_split"] = how


def _module_lookup(table: dict, name: str):
    """The value for module ``name`` or its nearest ancestor in ``table`` (None if none)."""
    while True:
        if name in table:
            return table[name]
        if "." not in name:
            return table.get("")
        name = name.rsplit(".", 1)[0]


# --------------------------------------------------------------------------------------------
# The walk over the trace
# --------------------------------------------------------------------------------------------

@dataclass
class _Walk:
    """One tensor-parallel pass over a trace (``df``, positional index, edited in place): its
    columns as arrays, what the forward learned about each module, the all-reduces to add."""

    df: pd.DataFrame
    n: int
    vocab: int                      # vocabulary size (0: unknown)
    vocab_modules: set
    vocab_parallel: bool
    next_kid: int
    ins: list = field(init=False)   # row -> positions of the rows it reads
    phase: np.ndarray = field(init=False)
    layer: np.ndarray = field(init=False)
    cls: np.ndarray = field(init=False)
    module: np.ndarray = field(init=False)
    sharded: np.ndarray = field(init=False)  # row -> its output is sharded
    role: dict = field(default_factory=dict)       # linear module -> "col" / "row"
    fw_dims: dict = field(default_factory=dict)    # linear module -> forward (M, N, K)
    fw_input: dict = field(default_factory=dict)  # linear module -> its forward input producers
    votes: dict = field(default_factory=dict)      # module -> sharded flags of its fw non-GEMMs
    groups: dict = field(default_factory=dict)     # column-split group -> (last dX row, bytes)
    extra: list = field(default_factory=list)      # (row, all-reduce row after it)

    def __post_init__(self):
        df = self.df
        pos = {int(k): i for i, k in enumerate(df["kid"])}
        self.ins = [[pos[int(k)] for k in v if int(k) in pos] for v in df["inputs"]]
        self.phase = df["phase"].to_numpy()
        self.layer = df["layer"].to_numpy()
        self.cls = df["cls"].to_numpy()
        self.module = df["module"].fillna("").to_numpy()
        self.sharded = np.zeros(len(df), bool)

    def comm(self, i: int, nbytes: float) -> None:
        """An all-reduce of ``nbytes`` after row ``i``."""
        row = comm_row_after(self.df.loc[i], self.next_kid, "allreduce", nbytes, self.n)
        self.extra.append((i, row))
        self.next_kid += 1


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
    walk = _Walk(df, n, int(info.get("vocab") or 0), set(info.get("vocab_modules") or ()),
                 vocab_parallel, int(df["kid"].max()) + 1 if len(df) else 0)
    _forward(walk)
    _backward(walk)
    return insert_after(walk.df, walk.extra)


# --------------------------------------------------------------------------------------------
# Forward: propagate "sharded" along the edges, split the GEMMs, place the all-reduces
# --------------------------------------------------------------------------------------------

def _forward(w: _Walk) -> None:
    df = w.df
    for i in np.flatnonzero(w.phase == "fw"):
        any_sh = any(w.sharded[j] for j in w.ins[i])
        m = w.module[i]
        if w.cls[i] == "linear":
            _forward_linear(w, i, any_sh)
            continue
        if w.layer[i] >= 0:
            w.votes.setdefault(m, []).append(bool(any_sh))
        if any_sh:
            w.sharded[i] = True
            _divide(df, i, w.n, "shard")
        elif w.vocab_parallel and w.cls[i] == "memory" and m in w.vocab_modules:
            # vocabulary-parallel embedding: each GPU gathers its rows, then an all-reduce
            w.comm(i, sizes.BYTES_PER_ELEM * float(df.at[i, "H"]))


def _forward_linear(w: _Walk, i: int, any_sh: bool) -> None:
    """Column-split a linear reading a replicated tensor (in a block, or the LM head over the
    vocabulary), row-split one reading a sharded tensor (then all-reduce its output)."""
    df, m = w.df, w.module[i]
    M, N, K = (float(df.at[i, c]) for c in ("M", "N", "K"))
    r = None
    if w.layer[i] >= 0:
        r = "row" if any_sh else "col"
    elif w.vocab_parallel and w.vocab and K == w.vocab and not any_sh:
        r = "col"
    if r is None:
        return
    w.role[m], w.fw_dims[m], w.fw_input[m] = r, (M, N, K), tuple(df.at[i, "inputs"])
    elem = _elem(df, i)  # the all-reduce carries the output in the GEMM's format
    if r == "col":
        _split_dim(df, i, K, "K", w.n)
        w.sharded[i] = True
        df.at[i, "tp_split"] = "col" if w.layer[i] >= 0 else "vocab"
    else:
        _split_dim(df, i, N, "N", w.n)
        df.at[i, "tp_split"] = "row"
        w.comm(i, elem * M * K)


# --------------------------------------------------------------------------------------------
# Backward: follow the module of each kernel
# --------------------------------------------------------------------------------------------

def _backward(w: _Walk) -> None:
    mod_sharded = {m: (np.mean(v) >= SHARDED_MAJORITY) for m, v in w.votes.items()}
    for i in np.flatnonzero(w.phase == "bw"):
        r = w.role.get(w.module[i])
        if w.cls[i] == "linear" and r is not None:
            _backward_split_linear(w, i, r)
        elif w.cls[i] == "linear":
            _backward_vocab_linear(w, i)
        else:
            _backward_other(w, i, r, mod_sharded)
    for i, nbytes in w.groups.values():
        w.comm(i, nbytes)


def _backward_split_linear(w: _Walk, i: int, r: str) -> None:
    """The weight- (reads a forward activation) or input-gradient GEMM of a split linear,
    divided on the split dimension; a column-split group's last input gradient is
    all-reduced."""
    df, m = w.df, w.module[i]
    M, N, K = w.fw_dims[m]
    dW = any(w.phase[j] == "fw" for j in w.ins[i])
    if r == "col":
        if dW:
            _split_dim(df, i, K, "K", w.n)
        else:
            _split_dim(df, i, K, "N", w.n)
            w.groups[(w.layer[i], w.fw_input[m])] = (i, sizes.BYTES_PER_ELEM * M * N)
    else:
        _split_dim(df, i, N, "M" if dW else "K", w.n)
    df.at[i, "tp_split"] = r if w.layer[i] >= 0 else "vocab"


def _backward_vocab_linear(w: _Walk, i: int) -> None:
    """A vocabulary-sized backward GEMM outside the blocks (embedding gradient), split."""
    df = w.df
    if w.layer[i] < 0 and w.vocab_parallel and w.vocab and \
            w.vocab in (df.at[i, "M"], df.at[i, "N"], df.at[i, "K"]):
        _split_dim(df, i, w.vocab, "K", w.n)
        df.at[i, "tp_split"] = "vocab"


def _backward_other(w: _Walk, i: int, r: str | None, mod_sharded: dict) -> None:
    """A backward non-GEMM: divided with its split linear (bias gradients, accumulation adds),
    its sharded module, or over the vocabulary outside the blocks."""
    df, n = w.df, w.n
    if r is not None:
        M, N, K = w.fw_dims[w.module[i]]
        if r == "col" or _count(df.loc[i]) == N * K:
            _divide(df, i, n, "shard")
        return
    if w.layer[i] >= 0:
        if _module_lookup(mod_sharded, w.module[i]):
            _divide(df, i, n, "shard")
        return
    if w.vocab_parallel and w.vocab:
        count = _count(df.loc[i])
        if count % w.vocab == 0 and count > 0:
            _divide(df, i, n, "vocab")
