"""Operator fusion on a kernel trace (method.md section 5.3).

``fuse(trace_frame)`` merges groups of elementwise and memory kernels into one kernel each, the
way a fusing compiler (and the original NeuSight opgraph's ``fused`` nodes) runs them:

- **Which kernels.** Only ``cls`` ``elementwise`` and ``memory`` rows are ever fused; GEMMs
  (``bmm``, ``linear``), ``softmax``, ``layernorm`` and anything else (e.g. ``comm``) stay as
  they are. A fusible kernel joins the group of its consumer when it has exactly one consumer,
  that consumer is fusible too and both run in the same phase (``fw``/``bw``). Consumers come
  from the ``inputs`` edges of the trace (a kernel that lists ``k`` among its inputs consumes
  ``k``'s output). Following these links from every kernel ends at a kernel that is not merged
  further (several consumers, a non-fusible consumer, or none): the group's *root*, its last
  op. A group is therefore a chain (``a -> b -> c``) or, where a member reads several group
  members, a tree converging on the root: GPT-2's tanh-GELU ``0.5*x * (1 + tanh(...))`` is one
  group of eight ops, as in the original opgraph's fused GELU node. Every non-root member's
  only consumer is inside its group, so nothing outside reads an intermediate, and the fused
  kernel runs where the root ran.
- **Bytes** = the group's external inputs + its output. Each row's output size is known from
  its class (``4*B*H`` for vector ops, ``4*B*M*K`` for GEMMs, ``min(4*H, bytes)`` for memory
  rows, which count bytes at their real dtypes); a member's reads (its ``bytes`` minus its
  output) are attributed to its producers (scaled down where it reads only part of a
  producer's output, e.g. one third of a fused QKV GEMM output) and the rest to inputs that
  have no producer row (parameters, model inputs, constants). Reads of group members vanish;
  a tensor from outside that several members read is read once (the largest of those reads).
- **FLOPs** = the sum of the members' FLOPs (in ``flops``).
- **How it is predicted.** The fused row has ``cls`` ``elementwise`` and the op of the root
  (memory roots count as ``addu``/``add``, the copy kernel :func:`nslib.model.inputs.kernel_frame`
  uses for memory ops). Predictors derive a vector kernel's bytes from its op and ``B*H``
  (``MemPerO = 4*(inputs + 1)`` per output), so the op's input count is set to the group's
  effective number of full-size inputs (``bytes / output - 1``, rounded to 1 or 2): the unary
  form (``mulu``, ``addu``, ...) when the group reads one tensor the size of its output, the
  binary form (``mul``, ``add``, ...) otherwise (``tanh``, ``relu``, ``gelu`` have only the
  unary form). ``B*H`` is then ``bytes / MemPerO``: exactly the output element count when the
  external inputs are full-size tensors, and in every case the element count whose bytes the
  predictor sees are the group's bytes. ``H`` is the root's row length when it divides that
  count (``B`` = count / ``H``), else ``B = 1``. The predictors count one FLOP per output for
  elementwise ops, fewer than the members' sum; these kernels are memory bound, so the bytes
  decide their time.
- **The frame.** One row per fused group or unfused kernel, in launch order (a group at its
  root's position), ``kid`` renumbered ``0..n-1``, ``inputs`` remapped to the new kids (a
  group's inputs are the groups of its external producers), ``phase``, ``layer`` and
  ``module`` of the root, ``aten`` ``fused(<member aten ops>)`` for groups of two or more, and
  ``fused_from``: the sorted tuple of the original kids merged into the row (one kid for an
  unfused kernel). Other columns are the root's. Rows left alone are unchanged apart from the
  renumbering.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels import sizes

__all__ = ["fuse", "FUSIBLE", "output_bytes"]

FUSIBLE = ("elementwise", "memory")

# (unary form, binary form) of each measured elementwise op; None where no such form exists
_FORMS = {
    "add": ("addu", "add"), "addu": ("addu", "add"),
    "mul": ("mulu", "mul"), "mulu": ("mulu", "mul"),
    "div": ("divu", "div"), "divu": ("divu", "div"),
    "pow": ("powu", "pow"), "powu": ("powu", "pow"),
    "tanh": ("tanh", None), "relu": ("relu", None), "gelu": ("gelu", None),
}


def output_bytes(frame: pd.DataFrame) -> np.ndarray:
    """Bytes each row writes as its output tensor (FP32 for the measured classes).

    Vector classes ``4*B*H``; GEMMs ``4*B*M*K``; memory rows ``min(4*H, bytes)`` (H counts
    the elements written, bytes the reads and writes at their real dtypes); 0 otherwise.
    """
    cls = frame["cls"].to_numpy()
    B, M, K, H = (frame[c].to_numpy(float) for c in ("B", "M", "K", "H"))
    nbytes = frame["bytes"].to_numpy(float)
    e = sizes.BYTES_PER_ELEM
    out = np.zeros(len(frame))
    vec = np.isin(cls, sizes.VECTOR_CLASSES)
    gemm = np.isin(cls, sizes.GEMM_CLASSES)
    mem = cls == "memory"
    out[vec] = e * B[vec] * H[vec]
    out[gemm] = e * B[gemm] * M[gemm] * K[gemm]
    out[mem] = np.minimum(e * H[mem], nbytes[mem])
    return np.nan_to_num(out)


def _check(frame: pd.DataFrame) -> None:
    need = {"kid", "phase", "cls", "op", "B", "M", "N", "K", "H", "flops", "bytes", "inputs"}
    missing = sorted(need - set(frame.columns))
    if missing:
        raise ValueError(f"fuse needs a trace frame (nslib.model.trace.trace); missing columns "
                         f"{missing}")
    if frame["kid"].duplicated().any():
        raise ValueError("fuse: kernel ids (kid) must be unique")


REDUCTIONS = ("softmax", "layernorm")


def fuse(trace_frame: pd.DataFrame, prologues: bool = False) -> pd.DataFrame:
    """The trace with fusible elementwise/memory groups merged into single kernels.

    See the module docstring for the rule, the bytes and FLOPs of a fused kernel and the
    columns of the result (which adds ``fused_from``). ``prologues=True`` also merges a group
    whose single consumer is a softmax or layernorm into that kernel (as the original tool's
    fused graphs do, e.g. scale + mask + softmax, residual add + layernorm): the result keeps
    the reduction's class, op and dims, so its own predictor times it; the merged
    elementwise kernels' intermediate writes and reads disappear.
    """
    _check(trace_frame)
    df = trace_frame.reset_index(drop=True)
    kids = df["kid"].to_numpy()
    pos = {int(k): i for i, k in enumerate(kids)}
    inputs = [tuple(int(k) for k in ins if int(k) in pos) for ins in df["inputs"]]
    root = _roots(df, pos, inputs, prologues)
    members: dict[int, list[int]] = {}
    for i in range(len(df)):
        members.setdefault(int(root[i]), []).append(i)
    order = sorted(members)  # roots in launch order
    new_kid = {r: j for j, r in enumerate(order)}
    group_of = {int(kids[i]): new_kid[int(root[i])] for i in range(len(df))}
    rows = df.iloc[order].copy().reset_index(drop=True)
    cols = {c: rows[c].to_numpy(float).copy() for c in ("B", "M", "N", "K", "H", "flops",
                                                          "bytes")}
    for c in ("op", "cls", "aten"):
        if c in rows:
            cols[c] = rows[c].to_numpy(object).copy()
    out_b = output_bytes(df)
    fused_from, new_inputs = [], []
    for j, r in enumerate(order):
        mem = members[r]
        fused_from.append(tuple(sorted(int(kids[i]) for i in mem)))
        ext = {group_of[k] for i in mem for k in inputs[i]} - {j}
        new_inputs.append(tuple(sorted(ext)))
        if len(mem) > 1:
            _merge_group(df, cols, j, r, mem, _group_bytes(mem, r, inputs, pos, df, out_b),
                         out_b[r])
    rows["kid"] = np.arange(len(rows), dtype=np.int64)
    for c, v in cols.items():
        rows[c] = v
    rows["inputs"] = new_inputs
    rows["fused_from"] = fused_from
    return rows


def _roots(df: pd.DataFrame, pos: dict, inputs: list, prologues: bool) -> np.ndarray:
    """Row index of each kernel's group root: a fusible kernel with one consumer (a later one
    in its phase that can root a group) joins that consumer's group."""
    n = len(df)
    cls, phase = df["cls"].to_numpy(), df["phase"].to_numpy()
    fusible = np.isin(cls, FUSIBLE)
    consumers: list[set] = [set() for _ in range(n)]
    for i, ins in enumerate(inputs):
        for k in ins:
            if pos[k] != i:
                consumers[pos[k]].add(i)
    parent = np.full(n, -1)
    can_root = fusible | (np.isin(cls, REDUCTIONS) if prologues else False)
    for i in range(n):
        if fusible[i] and len(consumers[i]) == 1:
            (c,) = consumers[i]
            if can_root[c] and phase[c] == phase[i] and c > i:
                parent[i] = c
    root = np.arange(n)
    for i in range(n - 1, -1, -1):  # consumers come later: their roots are already final
        if parent[i] >= 0:
            root[i] = root[parent[i]]
    return root


def _group_bytes(mem: list[int], r: int, inputs: list, pos: dict, df: pd.DataFrame,
                 out_b: np.ndarray) -> float:
    """DRAM bytes of a fused group (bytes): each outside producer's output read once, reads
    that no producer in the trace explains, and the root's output written."""
    nbytes = df["bytes"].to_numpy(float)
    inside = set(mem)
    ext_reads: dict[int, float] = {}
    other = 0.0
    for i in mem:
        reads = max(nbytes[i] - out_b[i], 0.0)
        prods = [pos[k] for k in inputs[i] if pos[k] != i]
        total = float(sum(out_b[p] for p in prods))
        scale = 1.0 if total <= reads or total == 0 else reads / total
        other += max(reads - total, 0.0)
        for p in prods:
            if p not in inside:
                ext_reads[p] = max(ext_reads.get(p, 0.0), out_b[p] * scale)
    return sum(ext_reads.values()) + other + out_b[r]


def _merge_group(df: pd.DataFrame, cols: dict, j: int, r: int, mem: list[int],
                 b: float, out_root: float) -> None:
    """Write fused group ``j`` (root row ``r`` writing ``out_root`` bytes, rows ``mem``, ``b``
    bytes in all) into ``cols``."""
    cls = df["cls"].to_numpy()
    cols["bytes"][j] = b
    cols["flops"][j] = float(df["flops"].to_numpy(float)[mem].sum())
    if "aten" in cols:
        cols["aten"][j] = "fused(" + ",".join(str(df.at[i, "aten"]) for i in mem) + ")"
    if cls[r] in REDUCTIONS:  # a prologue merged into a softmax/layernorm: keep its dims
        return
    op, h_root = _fused_op(df.at[r, "op"], cls[r], b, out_root), df.at[r, "H"]
    n_in = sizes.OPS[op][1]
    count = max(float(np.round(b / (sizes.BYTES_PER_ELEM * (n_in + 1)))), 1.0)
    if cls[r] != "memory" and np.isfinite(h_root) and h_root > 0 and count % h_root == 0:
        cols["B"][j], cols["H"][j] = count / h_root, float(h_root)
    else:
        cols["B"][j], cols["H"][j] = 1.0, count
    cols["M"][j] = cols["N"][j] = cols["K"][j] = np.nan
    cols["op"][j], cols["cls"][j] = op, "elementwise"


def _fused_op(root_op: str, root_cls: str, nbytes: float, out_root: float) -> str:
    """The op a fused group is predicted as: the root's op in the unary or binary form that
    matches the group's effective number of full-size inputs (memory roots: addu/add)."""
    k = (nbytes - out_root) / out_root if out_root > 0 else 1.0
    binary = k >= 1.5
    forms = _FORMS.get(root_op, ("addu", "add")) if root_cls != "memory" else ("addu", "add")
    if binary and forms[1] is not None:
        return forms[1]
    return forms[0]
