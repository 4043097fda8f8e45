"""Tables of the fused-kernel evaluation (notebook 06), from
:func:`nslib.evaluation.model_level.evaluate_variant` results of kind ``"fusion"`` with
``with_base=True``: latencies in ms, errors in percent. Every function is pure over frames."""
from __future__ import annotations

import pandas as pd

from nslib.evaluation.metrics import error_summary

# result columns -> the results table's headers, in the table's order
FUSION_COLUMNS = {"base_e2e_ms": "measured ms", "e2e_ms": "measured fused ms",
                  "base_pred_ms": "predicted ms", "pred_ms": "predicted fused ms",
                  "base_err": "error %", "err": "fused error %"}
# the model the example of fused groups avoids when another one has fused labels
PLAIN_EXAMPLE = "bert_large"


def fusion_table(results: pd.DataFrame) -> pd.DataFrame:
    """Measured and predicted ms of the non-fused and the fused model, and both errors (%),
    indexed by (gpu, config, predictor)."""
    keys = ["gpu", "config", "predictor"]
    return results[keys + list(FUSION_COLUMNS)].rename(columns=FUSION_COLUMNS).set_index(keys)


def fusion_summary(results: pd.DataFrame) -> pd.DataFrame:
    """Mean fused error (%) per predictor (rows) and GPU (columns), then the mean over every
    GPU of the fused (``fused (all)``) and of the non-fused (``non-fused (all)``) error."""
    return error_summary(results, "gpu", "fused (all)", "non-fused (all)")


def fusion_speedups(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` with the speed-up from fusion (non-fused ms / fused ms): ``measured`` from
    the labels, ``predicted`` from the predictions."""
    return results.assign(measured=results["base_e2e_ms"] / results["e2e_ms"],
                          predicted=results["base_pred_ms"] / results["pred_ms"])


def fusion_example(results: pd.DataFrame) -> pd.Series:
    """The configuration whose fused groups are shown: the first one not of
    :data:`PLAIN_EXAMPLE` (GPT-2 when present), else the first one."""
    configs = results.drop_duplicates("tag")
    other = configs[configs["model"] != PLAIN_EXAMPLE]
    return other.iloc[0] if len(other) else configs.iloc[0]


def fused_group_counts(trace: pd.DataFrame, fused: pd.DataFrame) -> pd.DataFrame:
    """The fused groups of ``fused`` (a :func:`nslib.model.fusion.fuse` of ``trace``) by their
    member ops (``"mul+add+..."``, index ``ops``): how many groups (``groups``), members per
    group (``members``) and mean bytes a group moves (``fused_bytes``), most frequent first."""
    groups = fused[fused["fused_from"].map(len) > 1]
    op_of = trace.set_index("kid")["op"]
    kinds = groups.assign(members=groups["fused_from"].map(len),
                          ops=groups["fused_from"].map(lambda ks: "+".join(op_of.loc[list(ks)])))
    counts = kinds.groupby("ops").agg(groups=("kid", "size"), members=("members", "first"),
                                      fused_bytes=("bytes", "mean"))
    return counts.sort_values("groups", ascending=False)
