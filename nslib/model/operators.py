"""Kernels filed by the PyTorch operator that launched them, as a per-operator profile (and
the label CSVs, which time one graph node at a time) sees a model: the like-for-like side of the
per-class model-level comparison (:mod:`nslib.evaluation.per_class`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.data.reference_graphs import SELECT_OPS

# classes whose operator call owns the helper kernels it launches (copies, bias reductions)
OWNING_CLASSES = ("linear", "bmm", "softmax", "layernorm")


def operator_class(frame: pd.DataFrame, gemm_copies: bool = True) -> pd.Series:
    """The class of the PyTorch operator that launched each kernel, as a per-operator
    profile (and the label CSVs, which time one graph node, forward and backward, at a time)
    sees it.

    Every kernel of a call (``call`` column of the trace; in the backward, the forward call
    whose gradient runs) takes the call's class: that of its slowest GEMM, softmax or
    layer-norm kernel if it launches one (``matmul`` on transposed views copies its operands
    before its ``bmm``, a linear layer's backward sums its bias gradient), else that of its
    first forward kernel (dropout's backward is a multiply, its node a memory op). Kernels
    outside any call (``call == -1``) keep their own class. Selects (``where``,
    ``masked_fill``) count as elementwise on both sides of the comparison
    (:data:`nslib.data.reference_graphs.SELECT_OPS`).

    ``gemm_copies=False``: the operand copies of a batched GEMM call stay memory operators of
    their own (:func:`_copies_apart`), as in code that makes the operands contiguous with
    separate ``contiguous()`` calls before a ``torch.bmm``.
    """
    return _classes(frame, gemm_copies)[0]


def _classes(frame: pd.DataFrame, gemm_copies: bool) -> tuple[pd.Series, pd.Series]:
    """(:func:`operator_class` of each kernel, whether it is an operand copy kept apart)."""
    own = _selects(frame, frame["kernel_class"].astype(str))
    owner = own
    if "call" in frame.columns and (frame["call"] >= 0).any():
        call = frame["call"]
        sub = frame.loc[call >= 0, ["call", "pred_ms", "phase"]].assign(c=own[call >= 0])
        owning = sub[sub["c"].isin(OWNING_CLASSES)]
        owners = (owning.sort_values("pred_ms", kind="stable")
                  .drop_duplicates("call", keep="last").set_index("call")["c"])
        firsts = sub[sub["phase"] == "fw"].drop_duplicates("call").set_index("call")["c"]
        mapped = call.map(owners).fillna(call.map(firsts))
        owner = mapped.where(mapped.notna() & (call >= 0), own)
    apart = (pd.Series(False, index=frame.index) if gemm_copies
             else _copies_apart(frame, own, owner))
    return owner.where(~apart, "memory"), apart


def _selects(frame: pd.DataFrame, cls: pd.Series) -> pd.Series:
    """Selects (:data:`nslib.data.reference_graphs.SELECT_OPS`) as elementwise operators."""
    if "aten" not in frame.columns:
        return cls
    base = frame["aten"].astype(str).str.split(".").str[1]
    return cls.where(~base.isin(SELECT_OPS), "elementwise")


def _copies_apart(frame: pd.DataFrame, own: pd.Series, owner: pd.Series) -> pd.Series:
    """Operand copies of a batched-GEMM operator call (``owner`` bmm): its forward kernels of
    own class (``own``, selects as elementwise) memory. A backward copy there makes the
    incoming gradient contiguous, which the measured code does in a view's backward, not in a
    copy node."""
    fw = frame["phase"].astype(str) == "fw" if "phase" in frame.columns else True
    return (own == "memory") & (owner == "bmm") & fw


def per_operator_class_ms(frame: pd.DataFrame, raw_ms=None,
                          gemm_copies: bool = True) -> dict[str, float]:
    """Predicted ms per operator class (:func:`operator_class`) of a frame with ``pred_ms``.

    ``raw_ms`` (per row, optional): the predictor's microbenchmark latencies of the same
    kernels, ``pred_ms`` being their stream times (:func:`nslib.model.stream.stream_ms`). Each
    operator call, timed on its own, then costs its kernels' stream times plus one dispatch:
    the largest ``raw_ms - pred_ms`` of its kernels (per phase; kernels outside any call are
    calls of their own). That is how a profile timing one operator at a time records it.
    ``gemm_copies``: as in :func:`operator_class`; copies kept apart are calls of their own.
    """
    pred = frame["pred_ms"].astype(float)
    cls, apart = _classes(frame, gemm_copies)
    if raw_ms is not None:
        pred = pred.copy()
        gap = (pd.Series(np.asarray(raw_ms, float), index=frame.index) - pred).clip(lower=0.0)
        call = frame["call"] if "call" in frame.columns else pd.Series(-1, index=frame.index)
        call = call.where(~apart, -1)
        solo = pd.Series(-1 - np.arange(len(frame)), index=frame.index)  # one call per row
        group = frame["phase"].astype(str) + ":" + call.where(call >= 0, solo).astype(str)
        first = gap.groupby(group).idxmax()
        pred.loc[first.to_numpy()] += gap.loc[first.to_numpy()]
    per = pred.groupby(cls).sum()
    return {k: float(v) for k, v in per.items()}
