"""Per-class model-level errors: predicted ms per kernel class against the measured per-node
latencies of the one-layer label CSVs (repeated n_layer times; see
:mod:`nslib.data.reference_graphs`)."""
from __future__ import annotations

import pandas as pd

from nslib.data.labels import load_labels
from nslib.data.reference_graphs import (class_ms, gemm_copies_inside, host_nodes, layer_repeats,
                                         measured_nodes)
from nslib.data.settings import Settings
from nslib.evaluation.folds import Folds
from nslib.evaluation.metrics import ape
from nslib.kernels.sizes import MODEL_CLASSES
from nslib.model.config import load_model_config
from nslib.model.operators import per_operator_class_ms
from nslib.model.predict import predict_model
from nslib.model.step import Step
from nslib.model.stream import LAUNCH_US, stream_terms
from nslib.predictors.gpu_range import range_warnings_once

# Streaming kernels, whichever of the two classes an operator lands in: the original graphs
# apply the causal mask with a per-layer `where` (memory op), transformers today with an
# `add` of the mask (elementwise), so the two classes trade milliseconds between the label
# and the trace while the kernels are the same kind of memory stream.
STREAMING = ("elementwise", "memory")


def host_overlap(data=None) -> pd.DataFrame:
    """Whether the label CSVs' host-only nodes (views, getitems, sizes, timed one by one at
    7-9 us each) add to the end-to-end time: per single-GPU, unfused label with a CSV, the
    measured e2e over the sum of every timed node (layer nodes times the layer count) and over
    the sum of the kernel-launching nodes only (:func:`nslib.data.reference_graphs.host_nodes`).

    A ratio near 1 for kernels only, below 1 for all nodes, says the host ops overlap GPU work
    (the host runs ahead of the GPU) and cost nothing end to end. Columns: gpu_key, tag,
    e2e_ms, all_nodes_ms, kernel_nodes_ms, host_ms, e2e_over_all, e2e_over_kernels.
    """
    labs = load_labels(data)
    labs = labs[labs["variant"] == ""]
    rows = []
    for _, lab in labs.iterrows():
        df = measured_nodes(lab["gpu_key"], lab["tag"], data)
        if df is None:
            continue
        rep = layer_repeats(df, layer_count(load_model_config(lab["model"], data)))
        ms, host = df["latency"] * rep, host_nodes(df)
        rows.append({"gpu_key": lab["gpu_key"], "tag": lab["tag"], "e2e_ms": lab["e2e_ms"],
                     "all_nodes_ms": ms.sum(), "kernel_nodes_ms": ms[~host].sum(),
                     "host_ms": ms[host].sum()})
    out = pd.DataFrame(rows)
    if len(out):
        out["e2e_over_all"] = out["e2e_ms"] / out["all_nodes_ms"]
        out["e2e_over_kernels"] = out["e2e_ms"] / out["kernel_nodes_ms"]
    return out


def layer_count(config: dict) -> int:
    """The number of transformer layers a HuggingFace ``config`` dict declares."""
    for k in ("n_layer", "num_hidden_layers", "num_layers"):
        if k in config:
            return int(config[k])
    raise ValueError("model config has no layer count (n_layer / num_hidden_layers)")


@range_warnings_once()
def per_class_results(results: pd.DataFrame, predictor: str, *, logo: bool = False,
                      settings: Settings | None = None) -> pd.DataFrame:
    """One row per (label with a CSV, class): measured ms, predicted ms, APE, ood flag.

    Both sides are classed by operator, as the label CSVs time them: the prediction by
    :func:`nslib.model.operators.operator_class`, the measurement by
    :func:`nslib.data.reference_graphs.node_classes`. The label CSVs time one node at a time
    as the kernel microbenchmarks time one kernel (an ``add`` of 1.3M elements: 34 us in a
    V100 label, 34-36 us in the V100 kernel table), dispatch included: each predicted operator
    is its kernels' stream times plus one dispatch
    (:func:`nslib.model.operators.per_operator_class_ms` with the microbenchmark latencies).
    Operand copies of a batched GEMM go where the measured code put them: inside the GEMM's
    operator when its nodes call ``matmul``, memory operators of their own when they call
    ``bmm`` (:func:`nslib.data.reference_graphs.gemm_copies_inside`).

    ``results`` is :func:`nslib.evaluation.model_level.evaluate_models` output (its rows name the
    labels). ``logo``, ``settings``: which trained predictor prices each label
    (:class:`nslib.evaluation.folds.Folds`).
    """
    rows = []
    folds = Folds(logo, settings)
    data = folds.settings.data
    labs = results[results["predictor"] == predictor].drop_duplicates(["gpu_key", "tag"])
    for _, r in labs.iterrows():
        nodes = measured_nodes(r["gpu_key"], r["tag"], data)
        if nodes is None:
            continue
        meas = class_ms(nodes, layer_count(load_model_config(r["model"], data)),
                        train="-train-" in r["tag"])
        fitted = folds.predictor(predictor, r["gpu"])
        # the microbenchmark latencies (the plain sum), then each operator timed alone: its
        # kernels' GPU times in a stream (not stretched to the step's host,
        # nslib.model.stream.step_ms) plus one dispatch
        frame, _ = predict_model(r["gpu_key"], r["model"], Step(r["batch"], r["seq"], r["mode"]),
                                 fitted, launch_us=None, settings=folds.settings)
        raw, gpu_ms, _ = stream_terms(fitted, frame, LAUNCH_US, data,
                                      raw=frame["pred_ms"].to_numpy())
        # the measured code's batched GEMMs either copy their operands inside their node or
        # take operands copied by separate nodes: the trace's copies are filed to match
        pred = per_operator_class_ms(frame.assign(pred_ms=gpu_ms), raw_ms=raw,
                                     gemm_copies=gemm_copies_inside(nodes))
        groups = [(c, (c,)) for c in MODEL_CLASSES] + [(" + ".join(STREAMING), STREAMING)]
        for name, members in groups:
            measured = sum(float(meas.get(c, 0.0)) for c in members)
            if measured > 0:
                rows.append({"gpu": r["gpu"], "tag": r["tag"], "cls": name,
                             "measured_ms": measured,
                             "pred_ms": sum(pred.get(c, 0.0) for c in members),
                             "ood": bool(r["new_gpu"] or r["ood_model"])})
    out = pd.DataFrame(rows)
    if len(out):
        out["err"] = ape(out["pred_ms"], out["measured_ms"])
    return out


def per_class_table(per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean APE per class, in-distribution vs out-of-distribution columns."""
    if per_class.empty:
        return pd.DataFrame(columns=["in-distribution", "out-of-distribution"])
    tab = per_class.pivot_table(index="cls", columns="ood", values="err", aggfunc="mean")
    return tab.rename(columns={False: "in-distribution", True: "out-of-distribution"})


def per_class_by_gpu(per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean APE per class (rows) and GPU (columns) over the labels with a CSV."""
    if per_class.empty:
        return pd.DataFrame()
    return per_class.pivot_table(index="cls", columns="gpu", values="err", aggfunc="mean")
