"""End-to-end evaluation against the measured labels (method.md section 8).

For every single-GPU, non-fused label of the chosen mode, predict the model with each
predictor and compare with the measured ``e2e_ms``. GPUs, models and configurations all come
from the label folder, so a new GPU's labels join the tables without code changes.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import data as nsdata
from .evaluate import ape
from .gpus import load_gpus
from .labels import load_labels
from .predict import predict_model

# Models the paper treats as out of distribution (never in the original tool's training).
OOD_MODELS = ("gpt3_xl", "gpt3_27", "opt_13")


def label_configs(mode: str, data=None, gpus=None, models=None, variant: str = "") -> pd.DataFrame:
    """The labels of ``mode`` (and ``variant``) whose GPU has a spec, filtered by name lists."""
    lab = load_labels(data)
    lab = lab[(lab["mode"] == mode) & (lab["variant"] == variant)]
    specs = load_gpus(data)
    lab = lab[lab["gpu_key"].isin(list(specs))]
    if gpus:
        lab = lab[lab["gpu_key"].isin(list(gpus)) | lab["gpu_key"].map(
            lambda k: specs[k].name).isin(list(gpus))]
    if models:
        lab = lab[lab["model"].isin(list(models))]
    lab = lab.assign(gpu=lab["gpu_key"].map(lambda k: specs[k].name))
    return lab.sort_values(["gpu_key", "model", "batch"]).reset_index(drop=True)


def evaluate_models(mode: str, predictors, data=None, gpus=None, models=None,
                    quick: bool = False, progress: bool = True) -> pd.DataFrame:
    """One row per (label, predictor): measured and predicted ms, APE, and whether the GPU
    and model are in distribution. Configurations the tracer cannot handle are reported in a
    ``note`` column, not dropped silently."""
    lab = label_configs(mode, data, gpus, models)
    new = set(nsdata.gpu_splits(data)["new_gpus"])
    rows = []
    for _, r in tqdm(list(lab.iterrows()), desc=f"{mode} configs", disable=not progress):
        for name in predictors:
            rec = {**r.to_dict(), "predictor": name}
            try:
                _, s = predict_model(r["gpu_key"], r["model"], r["batch"], r["seq"], mode,
                                     predictor=name, data=data, quick=quick)
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
    out["ood_model"] = out["model"].isin(OOD_MODELS)
    out["config"] = out["model"] + " b" + out["batch"].astype(str)
    return out


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
