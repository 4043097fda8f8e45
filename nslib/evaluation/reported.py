"""Reported vs reproduced: the NeuSight paper's result tables beside nslib's reproduction.

Every frame here is keyed like the paper's ``summary.csv`` (:data:`nslib.data.paper_results.KEYS`:
label folder, model, sequence, batch, mode, variant), so a configuration the paper reports
meets nslib's evaluation of the same label, and a new GPU's rows join with no list of GPUs.
Errors in percent, latencies in ms. ``neusight`` is the paper's method (reported: the
paper's numbers; reproduced: :class:`nslib.predictors.neusight.NeuSight` trained here);
``nslib`` is nslib's own design, which the paper never ran (reproduced only).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from nslib.data.paper_results import KEYS
from nslib.data.settings import Settings
from nslib.evaluation.metrics import ape
from nslib.kernels import sizes
from nslib.model.operators import per_operator_class_ms
from nslib.model.predict import predict_model
from nslib.model.step import Step

# nslib's per-class keys -> the paper's summary classes (the rest is "other")
CLASS_OF = {c: c for c in sizes.CLASSES}
TOLERANCE = 5.0  # points: a reproduced mean this close to the reported one agrees


def side_by_side(reported: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, method) the paper reports or nslib evaluates.

    ``reported``: :func:`nslib.data.paper_results.reported_configs`; ``results``: nslib's
    evaluation of the same labels (rows of :func:`nslib.evaluation.model_level.evaluate_models`
    or ``evaluate_variant``, ``predictor`` naming the method). Columns: :data:`KEYS`,
    ``method``, ``measured_ms`` (the label the paper scored), ``label_ms`` (the label in the
    data), ``reported_ms``, ``reported_err``, ``reproduced_ms``, ``reproduced_err``, ``ood``.
    Configurations the paper reports with no label in the data (its kept-back GPU, a GPU
    folder missing here) keep their reported columns and NaN reproduced ones; methods nslib
    adds keep NaN reported ones."""
    ours = results.assign(variant=results["variant"].fillna("")).rename(columns={
        "predictor": "method", "e2e_ms": "label_ms", "pred_ms": "reproduced_ms"})
    ours = ours[KEYS + ["method", "label_ms", "reproduced_ms"]]
    theirs = reported.rename(columns={"pred_ms": "reported_ms", "err": "reported_err"})
    both = theirs.merge(ours, on=KEYS + ["method"], how="outer")
    # configuration-level facts for the methods only one side has
    facts = pd.concat([theirs[KEYS + ["measured_ms", "ood"]],
                       ours[KEYS + ["label_ms"]]]).groupby(KEYS, dropna=False).first()
    both = both.drop(columns=["measured_ms", "ood", "label_ms"]).join(facts, on=KEYS)
    truth = both["measured_ms"].fillna(both["label_ms"])
    both["reproduced_err"] = ape(both["reproduced_ms"], truth)
    cols = KEYS + ["method", "measured_ms", "label_ms", "reported_ms", "reported_err",
                   "reproduced_ms", "reproduced_err", "ood"]
    return both[cols].sort_values(KEYS + ["method"]).reset_index(drop=True)


def gpu_means(side: pd.DataFrame, methods=None) -> pd.DataFrame:
    """Mean error (%) per (``gpu_key``, ``mode``) and method: ``reported`` and
    ``reproduced`` over the configurations both have (so the two means are comparable), and
    ``n`` configurations. Columns (method, reported/reproduced/n); methods nslib adds
    (``nslib``) are averaged over the configurations the paper reports."""
    methods = list(methods or pd.unique(side["method"]))
    reported = side.dropna(subset=["reported_err"])[KEYS].drop_duplicates()
    rows = {}
    for m in methods:
        sub = side[side["method"] == m]
        if sub["reported_err"].notna().any():
            sub = sub.dropna(subset=["reported_err", "reproduced_err"])
        else:  # a method only nslib runs: on the configurations the paper reports
            sub = sub.merge(reported, on=KEYS).dropna(subset=["reproduced_err"])
        g = sub.groupby(["gpu_key", "mode"])
        rows[(m, "reported")] = g["reported_err"].mean()
        rows[(m, "reproduced")] = g["reproduced_err"].mean()
        rows[(m, "n")] = g.size()
    return pd.DataFrame(rows)


def agreement(means: pd.DataFrame, method: str = "neusight",
              tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Per (GPU, mode) cell of :func:`gpu_means`: ``reported``, ``reproduced``, their
    difference ``delta`` (points) and ``agrees`` (``|delta| <= tolerance``)."""
    cells = means[method][["reported", "reproduced"]].dropna()
    return cells.assign(delta=cells["reproduced"] - cells["reported"],
                        agrees=(cells["reproduced"] - cells["reported"]).abs() <= tolerance)


def class_gaps(reported_class: pd.DataFrame, reproduced_class: pd.DataFrame) -> pd.DataFrame:
    """Where a reproduction's prediction departs from the paper's, class by class.

    ``reported_class``: :func:`nslib.data.paper_results.reported_class_ms` (the paper's
    predicted and measured ms per class); ``reproduced_class``: :func:`class_frame` of the
    same configurations. One row per (configuration, class): ``label_ms``, ``reported_ms``,
    ``reproduced_ms`` and ``gap_ms`` (reproduced - reported)."""
    theirs = reported_class.rename(columns={"pred_ms": "reported_ms"})
    both = theirs.merge(reproduced_class, on=KEYS + ["cls"], how="inner")
    both["gap_ms"] = both["reproduced_ms"] - both["reported_ms"]
    return both[KEYS + ["cls", "label_ms", "reported_ms", "reproduced_ms", "gap_ms"]]


def class_frame(configs: pd.DataFrame, per_class: list[dict]) -> pd.DataFrame:
    """Long frame of predicted ms per class for ``configs`` (rows with :data:`KEYS`), from
    one ``per_class_ms`` dict each (:func:`nslib.model.predict.predict_model`'s summary):
    nslib's classes, the memory and host operators as ``other``."""
    rows = []
    for (_, r), pcs in zip(configs.iterrows(), per_class):
        by = {}
        for cls, ms in pcs.items():
            key = CLASS_OF.get(cls, "other")
            by[key] = by.get(key, 0.0) + float(ms)
        rows += [{**{k: r[k] for k in KEYS}, "cls": c, "reproduced_ms": ms}
                 for c, ms in by.items()]
    return pd.DataFrame(rows, columns=KEYS + ["cls", "reproduced_ms"])


def operator_split(configs: pd.DataFrame, predictor="neusight", data=None,
                   quick: bool = False) -> list[dict]:
    """Per configuration of ``configs`` (rows with :data:`KEYS`, single GPU), the predicted ms
    per *operator* class (:func:`nslib.model.operators.per_operator_class_ms`), one dict each
    for :func:`class_frame`.

    The summary's per-class columns file a node's forward and backward time under the node's
    operator (a layer norm's backward under ``VECln``, GELU's backward under its ``VEC``
    ops), as the label CSVs time them; a split by kernel class would put every backward
    vector kernel under elementwise and compare two different partitions."""
    out = []
    for _, r in configs.iterrows():
        frame, _ = predict_model(r["gpu_key"], r["model"],
                                 Step(int(r["batch"]), int(r["seq"]), r["mode"]), predictor,
                                 settings=Settings(data=data, quick=quick))
        out.append(per_operator_class_ms(frame))
    return out


def node_ratios(per_class: pd.DataFrame) -> pd.DataFrame:
    """Predicted over measured ms per (``gpu``, ``mode``, ``cls``), summed over the labels of
    :func:`nslib.evaluation.per_class.per_class_results` (each operator against the label
    CSV's time for its node); ``training`` is True for a GPU with in-distribution labels."""
    pc = per_class.assign(mode=np.where(per_class["tag"].str.contains("-train-"), "train", "inf"))
    g = pc.groupby(["gpu", "mode", "cls"])[["measured_ms", "pred_ms"]].sum()
    trained_on = set(pc.loc[~pc["ood"].astype(bool), "gpu"])
    return pd.DataFrame({"ratio": g["pred_ms"] / g["measured_ms"],
                         "training": [k[0] in trained_on for k in g.index]}, index=g.index)


def _node_sentence(ratios: pd.DataFrame | None, gpu: str, mode: str, classes) -> str:
    """How the reproduction prices each of ``classes`` node by node on ``gpu`` and on the
    training GPUs, in ``mode`` (:func:`node_ratios`); empty when it has no such rows."""
    parts = []
    for cls in classes:
        if ratios is None or (gpu, mode, cls) not in ratios.index:
            continue
        ref = ratios.xs((mode, cls), level=("mode", "cls"))
        ref = ref.loc[ref["training"] & (ref.index != gpu), "ratio"]
        span = f"{ref.min():.2f}x" if len(ref) and ref.min() == ref.max() else \
            f"{ref.min():.2f}-{ref.max():.2f}x"
        seen = f" (training GPU{'s' if len(ref) > 1 else ''} {span})" if len(ref) else ""
        parts.append(f"{cls} {ratios.loc[(gpu, mode, cls), 'ratio']:.2f}x{seen}")
    if not parts:
        return ""
    return (" Node by node (each operator against its label-CSV time), the reproduction "
            f"prices this GPU's operators ({mode}): {', '.join(parts)}.")


def gap_shares(gaps: pd.DataFrame) -> pd.DataFrame:
    """Per (``gpu_key``, ``mode``) and class: the summed ``gap_ms`` and its share of the
    summed absolute class gaps (``share``, 0-1), and how the class's prediction compares with
    the label in each reproduction (``reported / label``, ``reproduced / label``: ratios of
    the summed ms)."""
    g = gaps.groupby(["gpu_key", "mode", "cls"])[["label_ms", "reported_ms", "reproduced_ms",
                                                  "gap_ms"]].sum()
    total = g["gap_ms"].abs().groupby(["gpu_key", "mode"]).transform("sum")
    out = pd.DataFrame({"gap_ms": g["gap_ms"], "share": g["gap_ms"].abs() / total,
                        "reported / label": g["reported_ms"] / g["label_ms"],
                        "reproduced / label": g["reproduced_ms"] / g["label_ms"],
                        "label_ms": g["label_ms"], "reported_ms": g["reported_ms"],
                        "reproduced_ms": g["reproduced_ms"]})
    return out.replace([np.inf, -np.inf], np.nan)


def _streams(sub: pd.DataFrame) -> str:
    """Elementwise and other operators together, when the top class is one of them: the
    measured code masks attention scores with a ``where`` (the summary's ``other``), today's
    transformers with an elementwise ``add``, so the two classes trade the mask's time."""
    if sub.index[0] not in ("elementwise", "other") or not {"elementwise", "other"} <= \
            set(sub.index) or "label_ms" not in sub.columns:
        return ""
    both = sub.loc[["elementwise", "other"], ["label_ms", "reported_ms", "reproduced_ms"]].sum()
    return (" Elementwise and other together (the measured code's attention mask is a `where`, "
            "filed under other; the trace's is an elementwise `add`): the paper's NeuSight "
            f"{both['reported_ms'] / both['label_ms']:.2f}x, the reproduction "
            f"{both['reproduced_ms'] / both['label_ms']:.2f}x.")


def readings(cells: pd.DataFrame, shares: pd.DataFrame, gpu_names: dict | None = None,
             nodes: pd.DataFrame | None = None, graphs: pd.Series | None = None) -> list[str]:
    """One sentence per cell of :func:`agreement` that does not agree with the report: the
    gap, and the class that carries most of it (:func:`gap_shares`), with how each
    reproduction's prediction of that class compares with the label and, given ``nodes``
    (:func:`node_ratios`, keyed by GPU name), how the reproduction prices that class node by
    node on the same GPU and on the training GPUs; "not explained" by one class when none
    carries at least half of the class gaps (then the node-by-node prices of the classes
    carrying 20% or more). ``graphs``: the same predictor's mean error per (GPU, mode) on the
    original tool's own operator graphs (:mod:`nslib.evaluation.original_graph`); each
    sentence then says how much of the gap the trace accounts for."""
    out = []
    names = gpu_names or {}
    for (gpu, mode), c in cells[~cells["agrees"]].iterrows():
        head = (f"{names.get(gpu, gpu)}, {mode}: reported {c['reported']:.1f}%, reproduced "
                f"{c['reproduced']:.1f}% ({c['delta']:+.1f} points). "
                + _graph_sentence(graphs, (gpu, mode), c))
        if (gpu, mode) not in shares.index:
            out.append(head + "Not explained: the summary has no per-class split of it.")
            continue
        sub = shares.loc[(gpu, mode)].sort_values("share", ascending=False)
        top, row = sub.index[0], sub.iloc[0]
        if row["share"] < 0.5:
            out.append(head + "Not explained by one kernel class: the class gaps are spread "
                       f"({', '.join(f'{k} {v:.0%}' for k, v in sub['share'].items())})."
                       + _node_sentence(nodes, names.get(gpu, gpu), mode,
                                        sub.index[sub["share"] >= 0.2]))
            continue
        out.append(head + f"{row['share']:.0%} of the class gaps is {top}: the paper's "
                   f"NeuSight predicted {row['reported / label']:.2f}x the label's {top} time, "
                   f"the reproduction {row['reproduced / label']:.2f}x." + _streams(sub)
                   + _node_sentence(nodes, names.get(gpu, gpu), mode, [top]))
    return out


def _graph_sentence(graphs: pd.Series | None, key, cell) -> str:
    """How much of a cell's gap the trace accounts for: the reproduction on the original
    tool's graphs against the same on nslib's trace ("" without a figure)."""
    if graphs is None or key not in graphs.index or pd.isna(graphs[key]):
        return ""
    moved = float(graphs[key]) - cell["reproduced"]
    part = moved / -cell["delta"] if cell["delta"] else 0.0   # share of the gap closed
    return (f"On the original tool's own graphs the same predictor gives {graphs[key]:.1f}% "
            f"({moved:+.1f} points): the trace accounts for {max(part, 0.0):.0%} of the gap. ")


def variant_readings(side: pd.DataFrame, method: str = "neusight",
                     tolerance: float = TOLERANCE, gpu_names: dict | None = None) -> list[str]:
    """One sentence per fused or multi-GPU configuration whose reproduced error of
    ``method`` is further than ``tolerance`` points from the reported one.

    The gap is measured as ``(reproduced ms - reported ms) / measured ms`` in points; it is
    explained as inherited when the plain single-GPU configuration of the same GPU, model and
    mode with the same per-GPU batch (the global batch over the degree for data parallelism)
    shows a gap of the same sign and at least half the size (the fusion or parallel model
    then adds little of its own), and "not explained" otherwise."""
    names = gpu_names or {}
    rows = side[(side["method"] == method)].dropna(subset=["reported_ms", "reproduced_ms"])
    gap = 100 * (rows["reproduced_ms"] - rows["reported_ms"]) / rows["measured_ms"]
    rows = rows.assign(gap=gap)
    plain = rows[rows["variant"] == ""].set_index(["gpu_key", "model", "mode", "batch"])["gap"]
    out = []
    for _, r in rows[rows["variant"] != ""].iterrows():
        delta = r["reproduced_err"] - r["reported_err"]
        if abs(delta) <= tolerance:
            continue
        head = (f"{names.get(r['gpu_key'], r['gpu_key'])} {r['model']} b{r['batch']} "
                f"{r['variant']}: reported {r['reported_err']:.1f}%, reproduced "
                f"{r['reproduced_err']:.1f}% ({delta:+.1f} points); the reproduction predicts "
                f"{r['gap']:+.1f} points of the measured time away from the paper's. ")
        dp = re.fullmatch(r"dp(\d+)", r["variant"])
        key = (r["gpu_key"], r["model"], r["mode"], r["batch"] // int(dp[1]) if dp else r["batch"])
        if key in plain.index and np.sign(plain[key]) == np.sign(r["gap"]) and \
                abs(plain[key]) >= 0.5 * abs(r["gap"]):
            out.append(head + f"Inherited: the plain configuration is {plain[key]:+.1f} "
                       "points away too.")
        else:
            seen = f" (the plain configuration: {plain[key]:+.1f})" if key in plain.index else \
                " (no plain configuration of it is reported)"
            out.append(head + "Not explained" + seen + ".")
    return out


def per_class_readings(per_class: pd.DataFrame, method: str = "neusight",
                       tolerance: float = TOLERANCE) -> list[str]:
    """One sentence per (distribution, class) cell of the per-class table (columns
    ``(method, reported|reproduced)``) further than ``tolerance`` points from the report. The
    paper does not say which labels its per-class table averages, so a cell is read against
    the per-GPU class gaps (:func:`gap_shares`), not explained on its own."""
    out = []
    if (method, "reported") not in per_class or (method, "reproduced") not in per_class:
        return out
    cells = per_class[[(method, "reported"), (method, "reproduced")]].dropna()
    for (dist, cls), (a, b) in cells.iterrows():
        if abs(b - a) > tolerance:
            out.append(f"{cls}, {dist}: reported {a:.1f}%, reproduced {b:.1f}% "
                       f"({b - a:+.1f} points). Not explained on its own: the paper does not "
                       "say which labels it averages; the class gaps per GPU below show where "
                       "the reproduction prices this class differently.")
    return out
