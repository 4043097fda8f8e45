"""Communication rows in a trace, and the schedules that turn a predicted frame into a step time.

**Communication rows** (``cls`` ``"comm"``, :func:`comm_row`): an all-reduce or a send of
``bytes`` among ``peers`` GPUs, placed in launch order after the kernel whose output it carries
(:func:`insert_after`); the link model (:mod:`nslib.model.parallel.links`) predicts them.

**Data parallel** (``dp=n``): each GPU runs the trace at ``batch / n``. Every parameter's
gradient is all-reduced, one message per transformer block (its parameters, counted on the
model built on the meta device) and one for the parameters outside the blocks. Walking the
backward kernels in launch order with their predicted times, a block's all-reduce is issued
when its last weight-gradient GEMM finishes (a backward ``linear`` kernel that reads a
forward activation); the parameters outside the blocks (embeddings, whose gradient is
complete only at the end, final norm, head) are issued when the backward ends. The link
carries one all-reduce at a time, in issue order. ``step = forward + max(backward compute,
time the last all-reduce finishes)`` (:func:`dp_schedule`).

**Tensor parallel** (:mod:`nslib.model.parallel.tensor`): nothing overlaps, ``step = sum of
kernels + sum of all-reduces`` (:func:`tp_schedule`).

**Pipeline parallel** (:mod:`nslib.model.parallel.pipeline`): between stages the activation is
sent forward and its gradient backward (:func:`insert_transfers`); GPipe schedule
(:func:`pp_schedule`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels import sizes
from nslib.model.parallel.links import LinkSpec
from nslib.model.parallel.pipeline import gpipe_time

__all__ = ["comm_row", "comm_row_after", "insert_after", "gradient_rows", "insert_transfers",
           "dp_schedule", "tp_schedule", "pp_schedule"]

# Extra rows after the same kernel keep their order: each sorts this much after the previous.
INSERT_STEP = 1e-6


# --------------------------------------------------------------------------------------------
# Communication rows
# --------------------------------------------------------------------------------------------

def comm_row(kid: int, op: str, nbytes: float, peers: int, *, phase: str, layer: int,
             module: str, inputs: tuple = ()) -> dict:
    """A communication row: ``op`` (``"allreduce"``, ``"sendrecv"``) of ``nbytes`` bytes among
    ``peers`` GPUs, as a trace row (``H``: the message in FP32 elements)."""
    return {"kid": kid, "phase": phase, "aten": f"comm.{op}",
            "cls": "comm", "op": op, "B": 1.0, "M": np.nan, "N": np.nan, "K": np.nan,
            "H": float(nbytes / sizes.BYTES_PER_ELEM), "flops": 0.0, "bytes": float(nbytes),
            "inputs": tuple(inputs), "layer": int(layer), "module": module,
            "peers": int(peers)}


def comm_row_after(template: pd.Series, kid: int, op: str, nbytes: float,
                   peers: int) -> dict:
    """:func:`comm_row` carrying the output of the kernel row ``template``: its phase, layer
    and module, reading it."""
    return comm_row(kid, op, nbytes, peers, phase=template["phase"], layer=template["layer"],
                    module=template["module"], inputs=(int(template["kid"]),))


def insert_after(df: pd.DataFrame, extra: list[tuple[int, dict]]) -> pd.DataFrame:
    """``df`` with each extra row placed after the row at position ``pos``."""
    if not extra:
        out = df.copy()
        if "peers" not in out:
            out["peers"] = np.nan
        return out
    order = np.arange(len(df), dtype=float)
    add = pd.DataFrame([r for _, r in extra])
    add_order = np.array([p for p, _ in extra], float) + 0.5 + \
        np.arange(len(extra)) * INSERT_STEP
    out = pd.concat([df.assign(_o=order), add.assign(_o=add_order)], ignore_index=True)
    out = out.sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)
    out["kid"] = out["kid"].astype(np.int64)
    out["layer"] = out["layer"].astype(np.int64)
    return out


def gradient_rows(frame: pd.DataFrame, buckets: list[dict], n: int) -> pd.DataFrame:
    """``frame`` (predicted, one data-parallel GPU) with one predicted all-reduce row per
    gradient bucket of :func:`dp_schedule` appended (module ``"gradients"``)."""
    first = int(frame["kid"].max()) + 1
    rows = [{**comm_row(first + j, "allreduce", d["bytes"], n, phase="bw", layer=d["layer"],
                        module="gradients"),
             "kernel_class": "comm", "pred_ms": d["end_ms"] - d["start_ms"]}
            for j, d in enumerate(buckets)]
    if not rows:
        return frame
    return pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)


def insert_transfers(trace: pd.DataFrame, n: int, nbytes: float) -> pd.DataFrame:
    """A pipeline trace (``stage`` column, ``n`` stages) with a send of ``nbytes`` after each
    stage's last kernel of each phase: forward to the next stage, backward to the previous."""
    extra = []
    next_kid = int(trace["kid"].max()) + 1
    st, ph = trace["stage"].to_numpy(), trace["phase"].to_numpy()
    for p, senders in (("fw", range(n - 1)), ("bw", range(n - 1, 0, -1))):
        for s in senders:
            rows = np.flatnonzero((ph == p) & (st == s))
            if len(rows):
                r = comm_row_after(trace.iloc[rows[-1]], next_kid, "sendrecv", nbytes, 2)
                r["stage"] = s
                extra.append((int(rows[-1]), r))
                next_kid += 1
    return insert_after(trace.reset_index(drop=True), extra)


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------

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
