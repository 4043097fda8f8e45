"""End-to-end evaluation against the measured labels (method.md section 8).

For every single-GPU, non-fused label of the chosen mode, predict the model with each
predictor and compare with the measured ``e2e_ms``. GPUs, models and configurations all come
from the label folder, so a new GPU's labels join the tables without code changes.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nslib.data.gpus import load_gpus
from nslib.data.labels import load_labels
from nslib.data.protocol import ood_models
from nslib.data.settings import Settings, settings_of
from nslib.evaluation.folds import LOGO, PAPER, Folds
from nslib.evaluation.kernel_level import with_logo_summary
from nslib.evaluation.metrics import ape
from nslib.evaluation.per_class import per_class_by_gpu, per_class_results, per_class_table
from nslib.kernels import measured
from nslib.model.inputs import get_predictor
from nslib.model.predict import predict_model
from nslib.model.step import Step, split_options
from nslib.model.stream import LAUNCH_US
from nslib.predictors import predictor_class
from nslib.predictors.gpu_range import range_warnings_once


def label_configs(mode: str, data=None, gpus=None, models=None, variant: str = "") -> pd.DataFrame:
    """The labels of ``mode`` (and ``variant``) whose GPU has a spec, filtered by name lists."""
    lab = load_labels(data)
    specs = load_gpus(data)
    lab = lab[lab["gpu_key"].isin(list(specs))]
    gpus = _labelled_names(lab, specs, gpus, models, data)
    lab = lab[(lab["mode"] == mode) & (lab["variant"] == variant)]
    if gpus:
        lab = lab[lab["gpu_key"].isin(list(gpus)) | lab["gpu_key"].map(
            lambda k: specs[k].name).isin(list(gpus))]
    if models:
        lab = lab[lab["model"].isin(list(models))]
    lab = lab.assign(gpu=lab["gpu_key"].map(lambda k: specs[k].name))
    return lab.sort_values(["gpu_key", "model", "batch"]).reset_index(drop=True)


def _labelled_names(lab, specs, gpus, models, data) -> list | None:
    """``gpus`` as names the labels ``lab`` hold (file stems or Device names; an alias of a
    datasheet, ``T4``, becomes its stem); a GPU or model no label has is a KeyError listing
    the labelled ones, not a silently smaller table."""
    from nslib.model.inputs import resolve_gpu
    keys = sorted(set(lab["gpu_key"]))
    out = []
    for g in gpus or []:
        if g in keys or g in {specs[k].name for k in keys}:
            out.append(g)
            continue
        try:
            key = resolve_gpu(str(g), data).key
        except (KeyError, ValueError):
            key = None
        if key not in keys:
            raise KeyError(f"no labels for GPU {g!r}; GPUs with labels: {', '.join(keys)}")
        out.append(key)
    unknown = sorted(set(models or []) - set(lab["model"]))
    if unknown:
        raise KeyError(f"no labels for model(s) {', '.join(map(repr, unknown))}; labelled models: "
                       f"{', '.join(sorted(set(lab['model'])))}")
    return out or None


@range_warnings_once()
def evaluate_models(mode: str, predictors, *, gpus=None, models=None,
                    launch_us: float | None = LAUNCH_US, logo: bool = False,
                    settings: Settings | None = None) -> pd.DataFrame:
    """One row per (label, predictor): measured and predicted ms, APE, and whether the GPU
    and model are in distribution. Configurations the tracer cannot handle are reported in a
    ``note`` column, not dropped silently. ``launch_us``: as in
    :func:`nslib.model.predict.predict_model` (``None``: plain sums of kernel latencies).

    ``logo``: price each training GPU's labels with the predictor of the leave-one-GPU-out
    fold that held it out (:class:`nslib.evaluation.folds.Folds`); the ``held_out`` column
    says which rows were. ``settings``: data, training profile, seed, progress bars
    (:class:`nslib.data.settings.Settings`)."""
    st = settings_of(settings)
    lab = label_configs(mode, st.data, gpus, models)
    new = set(measured.gpu_splits(st.data)["new_gpus"])
    folds = Folds(logo, st)
    rows = []
    for _, r in tqdm(list(lab.iterrows()), desc=f"{mode} configs", disable=not st.progress):
        for name in predictors:
            rec = {**r.to_dict(), "predictor": name, "held_out": folds.held_out(r["gpu"])}
            pred = folds.predictor(name, r["gpu"])  # a failed training is an error, not a note
            try:
                _, s = predict_model(r["gpu_key"], r["model"], Step(r["batch"], r["seq"], mode),
                                     pred, launch_us=launch_us, settings=st)
                rec.update(pred_ms=s["e2e_ms"], pred_fw_ms=s["fw_ms"], pred_bw_ms=s["bw_ms"],
                           note="")
            except (ValueError, NotImplementedError, RuntimeError) as e:
                rec.update(pred_ms=np.nan, pred_fw_ms=np.nan, pred_bw_ms=np.nan,
                           note=str(e)[:200])
            rows.append(rec)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["err"] = ape(out["pred_ms"], out["e2e_ms"])
    out["new_gpu"] = out["gpu"].isin(new)
    out["ood_model"] = out["model"].isin(ood_models())
    out["config"] = out["model"] + " b" + out["batch"].astype(str)
    return out


@range_warnings_once()
def time_breakdown(results: pd.DataFrame, gpu_key: str, predictor: str, *,
                   settings: Settings | None = None) -> pd.DataFrame:
    """Predicted ms per kernel class (columns) for each configuration (rows) of ``results``
    on one GPU (``predictor`` trained with the settings' seed, the paper's protocol)."""
    st = settings_of(settings)
    rows = []
    fitted = get_predictor(predictor, st.data, st.quick, st.seed)
    for _, r in results[results["gpu_key"] == gpu_key].drop_duplicates("tag").iterrows():
        _, s = predict_model(gpu_key, r["model"], Step(r["batch"], r["seq"], r["mode"]),
                             fitted, settings=st)
        rows.append({"config": r["config"], **s["per_class_ms"]})
    return pd.DataFrame(rows).set_index("config").fillna(0.0)


def aggregation_table(mode: str, predictors, *, gpus=None, models=None,
                      results: pd.DataFrame | None = None,
                      settings: Settings | None = None) -> pd.DataFrame:
    """Mean error (%) per predictor and GPU with kernels summed as a stream (the default,
    :mod:`nslib.model.stream`) and as plain sums of microbenchmark latencies (the original tool's
    aggregation): rows (predictor, aggregation), columns GPUs and ``all``. ``results``: the
    default :func:`evaluate_models` output (same ``settings``) when already computed."""
    quiet = settings_of(settings).but(progress=False)
    if results is None:
        results = evaluate_models(mode, predictors, gpus=gpus, models=models, settings=quiet)
    plain = evaluate_models(mode, predictors, gpus=gpus, models=models, launch_us=None,
                            settings=quiet)
    both = pd.concat([results.assign(aggregation="stream"), plain.assign(aggregation="plain sum")])
    # a method whose own aggregation is the plain sum (NeuSight as published) has no stream row
    own_plain = [n for n in pd.unique(both["predictor"])
                 if getattr(predictor_class(n), "plain_sum", False)]
    both = both[~(both["predictor"].isin(own_plain) & (both["aggregation"] == "stream"))]
    tab = both.pivot_table(index=["predictor", "aggregation"], columns="gpu", values="err")
    tab["all"] = both.groupby(["predictor", "aggregation"])["err"].mean()
    return tab


def paper_table(results: pd.DataFrame) -> pd.DataFrame:
    """Rows predictors, columns (GPU, model x batch), cells percent error: the paper's layout."""
    return results.pivot_table(index="predictor", columns=["gpu", "config"], values="err")


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean error per predictor and GPU, plus in/out-of-distribution means."""
    by_gpu = results.pivot_table(index="predictor", columns="gpu", values="err")
    ood = results["new_gpu"] | results["ood_model"]
    by_gpu["in-distribution"] = results[~ood].groupby("predictor")["err"].mean()
    by_gpu["out-of-distribution"] = results[ood].groupby("predictor")["err"].mean()
    by_gpu["all"] = results.groupby("predictor")["err"].mean()
    return by_gpu


def logo_table(paper: pd.DataFrame, logo: pd.DataFrame) -> pd.DataFrame:
    """Mean error (%) per GPU of the training GPUs' labels under both protocols, side by side:
    rows ``<predictor> (<protocol>)`` (the paper's protocol, then leave-one-GPU-out), columns
    the held-out training GPUs, their mean and the worst of them.

    ``paper``, ``logo``: :func:`evaluate_models` output without and with ``logo=True``. A
    predictor that is not trained (the roofline) has the same numbers under both.
    """
    held = logo[logo["held_out"]]
    gpus = sorted(held["gpu"].unique())
    parts = []
    for proto, res in ((PAPER, paper), (LOGO, logo)):
        res = res[res["gpu"].isin(gpus) & res["predictor"].isin(held["predictor"].unique())]
        tab = res.pivot_table(index="predictor", columns="gpu", values="err", aggfunc="mean")
        parts.append(tab.rename(index=lambda p, proto=proto: f"{p} ({proto})"))
    return with_logo_summary(pd.concat(parts).reindex(columns=gpus), gpus)


# --------------------------------------------------------------------------------------------
# Fused and multi-GPU label variants
# --------------------------------------------------------------------------------------------

_DIST_VARIANT = re.compile(r"^(?P<kind>dp|tp|pp)(?P<n>\d+)(?:_(?P<m>\d+))?$")


def variant_args(variant: str) -> dict:
    """The :func:`nslib.model.predict.predict_model` arguments a label variant stands for.

    ``fusion`` -> ``fused=True``; ``dp4`` / ``tp4`` -> ``dp=4`` / ``tp=4``; ``pp4_<m>`` ->
    ``pp=4, microbatches=m`` (``pp4`` alone: one micro-batch). The batch in a label's name is
    the global batch: the original tool's graphs show it (``-dp4`` at batch 4 runs 1024-token
    GEMMs per GPU, ``-tp4`` and ``-pp4_1`` 4096-token ones)."""
    if variant == "fusion":
        return {"fused": True}
    m = _DIST_VARIANT.match(variant or "")
    if not m:
        raise ValueError(f"unknown label variant {variant!r}: expected 'fusion', 'dp<n>', "
                         f"'tp<n>' or 'pp<n>_<microbatches>'")
    n = int(m["n"])
    if m["kind"] == "pp":
        return {"pp": n, "microbatches": int(m["m"] or 1)}
    if m["m"]:
        raise ValueError(f"label variant {variant!r}: only pipeline variants take a "
                         f"micro-batch count")
    return {m["kind"]: n}


def variant_labels(kind: str, data=None, gpus=None, models=None) -> pd.DataFrame:
    """Labels of a variant kind: ``"fusion"``, ``"distributed"`` (every dp/tp/pp variant) or
    one variant name (``"tp4"``), in both modes, on GPUs with a spec; with ``kind``
    (fusion/dp/tp/pp), ``degree`` and ``microbatches`` columns."""
    lab = load_labels(data)
    present = sorted(v for v in lab["variant"].unique() if v)
    if kind == "fusion":
        variants = [v for v in present if v == "fusion"]
    elif kind == "distributed":
        variants = [v for v in present if _DIST_VARIANT.match(v)]
    else:
        variant_args(kind)
        variants = [kind]
    parts = [label_configs(mode, data, gpus, models, variant=v)
             for v in variants for mode in ("inf", "train")]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=list(lab.columns) + ["gpu", "kind", "degree",
                                                         "microbatches"])
    out = pd.concat(parts, ignore_index=True)
    args = out["variant"].map(variant_args)
    out["kind"] = args.map(lambda a: "fusion" if a.get("fused") else
                           next(k for k in ("dp", "tp", "pp") if k in a))
    out["degree"] = args.map(lambda a: int(a.get("dp", a.get("tp", a.get("pp", 1)))))
    out["microbatches"] = args.map(lambda a: int(a.get("microbatches", 1)))
    return out.sort_values(["kind", "gpu_key", "model", "batch"]).reset_index(drop=True)


@range_warnings_once()
def evaluate_variant(kind: str, predictors, *, gpus=None, models=None,
                     with_base: bool = False, link=None, logo: bool = False,
                     settings: Settings | None = None) -> pd.DataFrame:
    """One row per (variant label, predictor): measured and predicted ms and APE.

    ``kind``: see :func:`variant_labels`. ``with_base``: also predict the single-GPU,
    non-fused configuration behind the variant as ``base_pred_ms`` (for DP the per-GPU batch
    ``batch / dp``, in ``base_batch``; otherwise the same batch), with the plain label's
    ``base_e2e_ms`` where one exists, to separate the single-GPU prediction error from the
    fusion/parallel modelling. ``link``: passed to predict_model (None: each GPU's default).
    ``logo``, ``settings``: as :func:`evaluate_models`. Failures are reported in ``note``, not
    dropped."""
    st = settings_of(settings)
    data = st.data
    lab = variant_labels(kind, data, gpus, models)
    plain = load_labels(data)
    plain = plain[plain["variant"] == ""].set_index(["gpu_key", "model", "mode", "seq",
                                                     "batch"])["e2e_ms"]
    new = set(measured.gpu_splits(data)["new_gpus"])
    folds = Folds(logo, st)
    rows = []
    for _, r in tqdm(list(lab.iterrows()), desc=f"{kind} configs", disable=not st.progress):
        args = variant_args(r["variant"])
        if not args.get("fused"):
            args["link"] = link
        for name in predictors:
            rec = {**r.to_dict(), "predictor": name, "held_out": folds.held_out(r["gpu"])}
            pred = folds.predictor(name, r["gpu"])
            try:
                step, par = split_options(r["batch"], r["seq"], r["mode"], **args)
                _, s = predict_model(r["gpu_key"], r["model"], step, pred, parallel=par,
                                     settings=st)
                rec.update(pred_ms=s["e2e_ms"], pred_fw_ms=s["fw_ms"], pred_bw_ms=s["bw_ms"],
                           comm_ms=s.get("comm_ms", 0.0), note="")
            except (ValueError, NotImplementedError, RuntimeError) as e:
                rec.update(pred_ms=np.nan, pred_fw_ms=np.nan, pred_bw_ms=np.nan,
                           comm_ms=np.nan, note=str(e)[:200])
            if with_base:
                b0 = int(r["batch"]) // int(args.get("dp", 1))
                key = (r["gpu_key"], r["model"], r["mode"], r["seq"], b0)
                rec["base_batch"] = b0
                rec["base_e2e_ms"] = float(plain.get(key, np.nan))
                try:
                    _, s0 = predict_model(r["gpu_key"], r["model"],
                                          Step(b0, r["seq"], r["mode"]), pred, settings=st)
                    rec["base_pred_ms"] = s0["e2e_ms"]
                except (ValueError, NotImplementedError, RuntimeError):
                    rec["base_pred_ms"] = np.nan
            rows.append(rec)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["err"] = ape(out["pred_ms"], out["e2e_ms"])
    if with_base:
        out["base_err"] = ape(out["base_pred_ms"], out["base_e2e_ms"])
    out["new_gpu"] = out["gpu"].isin(new)
    out["ood_model"] = out["model"].isin(ood_models())
    out["config"] = out["model"] + " b" + out["batch"].astype(str)
    return out


def training_gpu_keys(results: pd.DataFrame, data=None) -> list[str]:
    """The label folders (``gpu_key``) of ``results`` whose GPU is a training GPU: the labels
    leave-one-GPU-out can hold out."""
    train = measured.gpu_splits(data)["train_gpus"]
    return sorted(results.loc[results["gpu"].isin(train), "gpu_key"].unique())


def variant_logo(kind: str, results: pd.DataFrame, predictors, *, models=None,
                 settings: Settings | None = None, **kw) -> pd.DataFrame | None:
    """:func:`logo_table` of a variant kind's labels (``results``: :func:`evaluate_variant`
    output under the paper's protocol), or None when no training GPU has such labels. ``kw``
    goes to :func:`evaluate_variant` (``link``)."""
    s = settings_of(settings)
    keys = training_gpu_keys(results, s.data) if len(results) else []
    if not keys:
        return None
    held = evaluate_variant(kind, predictors, gpus=keys, models=models, logo=True,
                            settings=s.but(progress=False), **kw)
    return logo_table(results, held)


def report(mode: str, predictors, *, gpus=None, models=None, logo_predictors=(),
           settings: Settings | None = None) -> dict:
    """Evaluate ``mode``: the model-level tables (:func:`saved_tables` names them for saving).

    Returns ``{"results", "paper", "summary", "per_class", "per_class_by_gpu", "aggregation"}``
    frames (see the functions above; ``per_class`` and ``per_class_by_gpu`` are
    :func:`nslib.evaluation.per_class.per_class_table` and ``per_class_by_gpu`` for the first
    predictor, ``aggregation`` :func:`aggregation_table`). ``logo_predictors`` (those of
    ``predictors`` to also price leave-one-GPU-out) add ``logo_results``, ``logo``
    (:func:`logo_table`) and ``logo_per_class_by_gpu`` (the first of them, with the mean over the
    held-out GPUs and the worst) when any training GPU has labels of ``mode``. ``settings``:
    data, training profile and seed.
    """
    s = settings_of(settings)
    results = evaluate_models(mode, predictors, gpus=gpus, models=models, settings=s)
    per_class = per_class_results(results, predictors[0], settings=s)
    tables = {"results": results, "paper": paper_table(results),
              "summary": summary_table(results), "per_class": per_class_table(per_class),
              "per_class_by_gpu": per_class_by_gpu(per_class),
              "aggregation": aggregation_table(mode, predictors, gpus=gpus, models=models,
                                               results=results, settings=s)}
    logo = [p for p in logo_predictors if p in list(predictors)]
    keys = training_gpu_keys(results, s.data) if logo and len(results) else []
    if keys:
        tables.update(_logo_tables(mode, logo, results, keys, models, s))
    return tables


# the tables of a report as the notebooks save them: (stem, table name, digits)
_SAVED = (("results", "results", 2), ("error_table", "paper", 1), ("summary", "summary", 1),
          ("per_class_error", "per_class", 1), ("per_class_by_gpu", "per_class_by_gpu", 1),
          ("aggregation", "aggregation", 1), ("logo", "logo", 1),
          ("logo_per_class_by_gpu", "logo_per_class_by_gpu", 1))


def saved_tables(tables: dict) -> list[tuple[str, pd.DataFrame, int]]:
    """``(file stem, frame, digits shown)`` of each table of a :func:`report` to save (the caller
    saves them, e.g. as ``<prefix>_<mode>_<stem>``): the results by GPU, configuration and
    predictor (without the notes), then the tables, the leave-one-GPU-out ones when present."""
    out = []
    for stem, name, digits in _SAVED:
        if name not in tables:
            continue
        tab = tables[name]
        if name == "results":
            tab = tab.drop(columns=["note", "held_out"]).set_index(["gpu", "config",
                                                                    "predictor"])
        out.append((stem, tab, digits))
    return out


def _logo_tables(mode, predictors, results, keys, models, settings: Settings) -> dict:
    """The leave-one-GPU-out part of :func:`report`, on the labels of the training GPUs'
    folders ``keys`` (the new GPUs are priced alike under both protocols)."""
    logo = evaluate_models(mode, predictors, gpus=keys, models=models, logo=True,
                           settings=settings)
    per_class = per_class_by_gpu(per_class_results(logo, predictors[0], logo=True,
                                                   settings=settings))
    if len(per_class):
        per_class = with_logo_summary(per_class, list(per_class.columns))
    return {"logo_results": logo, "logo": logo_table(results, logo),
            "logo_per_class_by_gpu": per_class}
