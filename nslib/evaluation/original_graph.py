"""A predictor on the original tool's own operator graphs: the trace taken out of a comparison.

The NeuSight data ships, for every configuration the paper evaluated, the operator graph its
tool parsed (``results/opgraph/<tag>.csv``, read by
:func:`nslib.data.reference_graphs.load_opgraph`): per node the kernels of its forward
(``FwOps``), of its backward (``BwOps``) and of its gradient accumulation (``AccOps``), each a
kind with its dims. The graph holds one transformer layer, run ``n_layer`` times
(:func:`nslib.data.reference_graphs.layer_repeats`). Its backward is not nslib's: a layer
norm's input gradient is one elementwise ``mul``, an addition's gradients are two copies, a
softmax's a ``mul`` and a softmax.

:func:`graph_kernels` turns a graph into kernel rows (dims as nslib's tracer writes them:
``Linear (M, N, K)`` is an ``M x N`` input times an ``N x K`` weight); :func:`graph_ms` prices
them with a predictor and sums them as the original tool does (the plain sum; memory
operators at bytes over bandwidth for a method as published, :func:`nslib.model.stream.stream_ms`);
:func:`evaluate_graphs` does it for every single-GPU label that has a graph. Where the paper's
method reproduced on nslib's trace and on the original graphs agree, the gap to the paper's
numbers is in the predictor, not in the trace. Units: ms.
"""
from __future__ import annotations

import ast

import numpy as np
import pandas as pd

from nslib.data.gpus import load_gpus
from nslib.data.reference_graphs import layer_repeats, load_opgraph
from nslib.data.settings import Settings, settings_of
from nslib.evaluation.metrics import ape
from nslib.evaluation.model_level import label_configs
from nslib.evaluation.per_class import layer_count
from nslib.kernels import sizes
from nslib.model.config import load_model_config
from nslib.model.inputs import kernel_frame
from nslib.model.stream import stream_ms

# the graph's kernel columns and their phases; inference runs the first only
PHASES = {"FwOps": "fw", "BwOps": "bw", "AccOps": "acc"}
# kinds of the multi-GPU graphs: a single-GPU pricing has no link to put them on
COMMUNICATION = ("ALLREDUCE", "ALLREDUCE_ASYNC", "SENDRECV")
NAN = float("nan")


def kernel_row(kind: str, dims) -> dict:
    """One kernel row (``cls``, ``op``, dims ``B M N K H``, and ``bytes`` for a memory
    operator: 4 bytes per element of every tensor it lists) of an original op."""
    if kind == "Linear":
        M, N, K = (int(d) for d in dims)
        return {"cls": "linear", "op": "linear", "B": 1, "M": M, "N": N, "K": K, "H": NAN}
    if kind == "BMM":
        B, M, N, K = (int(d) for d in dims)
        return {"cls": "bmm", "op": "bmm", "B": B, "M": M, "N": N, "K": K, "H": NAN}
    if kind.startswith("VEC") and kind[3:] in sizes.OPS:
        rows, cols = (int(d) for d in dims)
        return {"cls": sizes.OPS[kind[3:]][0], "op": kind[3:], "B": rows, "M": NAN, "N": NAN,
                "K": NAN, "H": cols}
    if kind == "MEM":
        n = sum(int(np.prod(s)) for s in dims)
        return {"cls": "memory", "op": "mem", "B": 1, "M": NAN, "N": NAN, "K": NAN, "H": NAN,
                "bytes": float(sizes.BYTES_PER_ELEM * n)}
    if kind in COMMUNICATION:
        raise ValueError(f"the graph holds a {kind}: a multi-GPU graph, which a single-GPU "
                         "pricing cannot take")
    raise ValueError(f"unknown original op kind {kind!r}")


def graph_kernels(tag: str, n_layer: int, train: bool, data=None) -> pd.DataFrame:
    """Kernel rows of configuration ``tag``'s original graph (forward; with ``train``, also
    backward and gradient accumulation), with ``count``: how many times each runs (the
    layer's nodes ``n_layer`` times) and ``phase`` (``fw``, ``bw``, ``acc``)."""
    graph = load_opgraph(tag, data)
    reps = layer_repeats(graph, n_layer).to_numpy()
    rows = []
    for col, phase in list(PHASES.items())[:None if train else 1]:
        for rep, ops in zip(reps, graph[col].astype(str)):
            for kind, dims in ast.literal_eval(ops):
                rows.append({**kernel_row(kind, dims), "count": int(rep), "phase": phase})
    if not rows:
        raise ValueError(f"the original graph of {tag} lists no kernel")
    df = pd.DataFrame(rows)
    vec = df["cls"] != "memory"
    flops, nbytes = sizes.flops_bytes(df[vec])
    df.loc[vec, "flops"], df.loc[vec, "bytes"] = flops, nbytes
    df["flops"] = df["flops"].fillna(0.0)
    return df


def graph_ms(pred, tag: str, gpu, n_layer: int, train: bool, data=None) -> float:
    """The original tool's estimate (ms) of ``tag`` on datasheet ``gpu`` with the fitted
    predictor ``pred``: every kernel of its graph priced alone and summed, each as many times
    as it runs."""
    rows = graph_kernels(tag, n_layer, train, data)
    frame = kernel_frame(rows.drop(columns=["count", "phase"]), gpu)
    return float((stream_ms(pred, frame, launch_us=None) * rows["count"].to_numpy()).sum())


def evaluate_graphs(mode: str, predictor="neusight", *, models=None,
                    settings: Settings | None = None) -> pd.DataFrame:
    """Every single-GPU label of ``mode`` with an original graph, priced on that graph: rows
    like :func:`nslib.evaluation.model_level.evaluate_models`'s (``pred_ms``, ``err``,
    ``note`` saying why a label was not priced), ``predictor`` named
    ``"<predictor> on the original graphs"``."""
    from nslib.predictors import trained

    s = settings_of(settings)
    pred = trained(predictor, s) if isinstance(predictor, str) else predictor
    name = f"{predictor if isinstance(predictor, str) else pred.name} on the original graphs"
    specs = load_gpus(s.data)
    rows = []
    for _, r in label_configs(mode, s.data, models=models).iterrows():
        rec = {**r.to_dict(), "predictor": name, "pred_ms": NAN, "note": ""}
        try:
            n_layer = layer_count(load_model_config(r["model"], s.data))
            rec["pred_ms"] = graph_ms(pred, r["tag"], specs[r["gpu_key"]], n_layer,
                                      mode == "train", s.data)
        except (ValueError, FileNotFoundError) as e:
            rec["note"] = str(e).splitlines()[0][:200]
        rows.append(rec)
    out = pd.DataFrame(rows)
    if len(out):
        out["err"] = ape(out["pred_ms"], out["e2e_ms"])
    return out


__all__ = ["evaluate_graphs", "graph_kernels", "graph_ms", "kernel_row"]
