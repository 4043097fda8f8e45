"""KernelBench's level-2 (short fused chains) and level-3 (whole small models) problems as
whole-step checks: any PyTorch module, traced and priced, against its measured eager time.
Level 1's single operators that the kernel table (:mod:`nslib.evaluation.kernelbench`) has no
class for (convolutions, pooling, norms, reductions, losses, operators of several kernels) are
checked the same way, one operator call each: the kernels a module's layers map to, one
family at a time.

Each problem file is traced on the meta device as KernelBench's harness runs it (the module as
built, in training mode, under ``no_grad``; :func:`nslib.model.module_trace.problem_trace`),
its kernels priced on the datasheet of the GPU it ran on like any model step
(:func:`nslib.model.inputs.kernel_frame`, :func:`nslib.model.stream.step_ms`: the kernel stream
no faster than the host issues it, each operator call dispatched once), plus the campaign's
fixed per-call cost ``h`` bounded on its level-1 problems
(:func:`nslib.evaluation.kernelbench.harness_ms`).

The host is the campaign's, not the NeuSight measurement hosts': ``h`` is also what the
campaign's host took for its cheapest one-operator problem, so each operator call costs the
host ``h`` times its class's floor ratio (:func:`nslib.model.stream.floors`) to issue, but
never more than the least any of the campaign's level-1 kernel-table problems of that class
took beyond its roofline (:func:`nslib.evaluation.kernelbench.class_harness_ms`). Hosts
differ by more than GPUs do here (the cheapest level-1 call: about 3 us on one campaign's
machine, 21-50 us on the others, 50 us being
:data:`nslib.evaluation.kernelbench.MAX_HARNESS_MS`), and a chain of a few small operators
is all host.

A problem that does not trace, or whose trace has aten ops without a kernel mapping, is
listed with the reason and its unpriced share of the launches; only fully priced problems
are scored.

Families come from the problem's name (what the model is), never from the GPU.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nslib.data import kernelbench as kb
from nslib.data.paths import DataNotFoundError
from nslib.data.settings import Settings, settings_of
from nslib.evaluation import kernelbench as level1
from nslib.evaluation.metrics import ape
from nslib.model.module_predict import priced_frame
from nslib.model.module_trace import ProblemError, shortened, unpriced_calls
from nslib.model.stream import LAUNCH_US, HostFloor
from nslib.model.tf32 import tensor_for, tensor_gemm

# (family, words of the problem name), first match wins; level 2 by its first operator
FAMILIES = {
    1: (("convolution", ("conv",)), ("pooling", ("pool",)), ("normalization", ("norm",)),
        ("reduction", ("reduction", "argm", "cum")), ("loss", ("loss",))),
    3: (("recurrent", ("rnn", "lstm", "ltsm", "gru")),
        ("attention", ("attention", "gpt", "transformer", "vit", "swin")),
        ("mlp", ("mlp",)),
        ("cnn", ("cnn", "net", "vgg", "conv", "block", "layer", "module", "unit", "inception"))),
    2: (("convolution", ("conv",)),
        ("gemm", ("gemm", "matmul", "linear", "bmm"))),
}


def family(problem: str, level: int) -> str:
    """The family of a problem from the words of its name (``other`` when none matches)."""
    name = re.sub(r"^\d+_", "", problem.removesuffix(".py")).lower()
    for fam, words in FAMILIES.get(level, ()):
        if any(w in name for w in words):
            return fam
    return "other"


def problem_steps(root=None, level: int = 3, progress: bool = True,
                  keep: set | None = None) -> pd.DataFrame:
    """One row per (campaign, problem) (those in ``keep``, a set of such pairs, when given):
    ``campaign, problem, hardware, family, latency_ms``,
    ``trial_cv`` (the spread of the harness's trials: their standard deviation over their mean,
    NaN where the file gives none), ``n_kernels``, ``unpriced`` (aten ops without a mapping,
    ``op xN``; "" when none), ``unpriced_share`` (their share of the traced calls), ``reason``
    ("" when priced)."""
    times = kb.timings(root, level)
    if keep is not None:
        times = times[[(c, p) in keep for c, p in zip(times["campaign"], times["problem"])]]
    sheets = kb.datasheets(root)
    rows = []
    for t in tqdm(times.itertuples(index=False), total=len(times), disable=not progress,
                  desc=f"KernelBench level {level}"):
        row = {"campaign": t.campaign, "problem": t.problem, "hardware": t.hardware,
               "family": family(t.problem, level), "latency_ms": t.latency_ms,
               "trial_cv": t.std_ms / t.latency_ms,
               "n_kernels": 0, "unpriced": "", "unpriced_share": 0.0, "reason": "",
               "path": t.path}
        if t.hardware not in sheets:
            row["reason"] = f"no datasheet with Device {t.hardware!r}"
        elif not isinstance(t.path, str):
            row["reason"] = "problem file missing"
        else:
            trace = level1.trace_of(t.path)
            if isinstance(trace, ProblemError):
                row["reason"] = f"cannot trace: {shortened(str(trace).split(': ', 1)[-1], 160)}"
            else:
                unknown, share = unpriced_calls(trace)
                row.update(n_kernels=len(trace), unpriced=", ".join(
                    f"{k.split('.')[1]} x{v}" for k, v in sorted(unknown.items())),
                    unpriced_share=share)
                if unknown:
                    row["reason"] = "aten ops without a kernel mapping"
                elif not len(trace):
                    row["reason"] = "no kernel"
        rows.append(row)
    return pd.DataFrame(rows)


def price(pred, steps: pd.DataFrame, harness: pd.Series, root=None, data=None,
          launch_us: float | None = LAUNCH_US, tensor="nslib",
          settings: Settings | None = None, tf32: bool = False,
          class_harness: dict | None = None) -> np.ndarray:
    """Predicted time (ms) of each priced problem of ``steps`` (NaN for the others): the step
    of its traced kernels on its GPU's datasheet, issued by the campaign's host, plus the
    campaign's per-call cost (``harness``, ms per campaign:
    :func:`nslib.evaluation.kernelbench.harness_ms`; module docstring). A campaign missing
    from ``harness`` keeps the predictor's own dispatch floors; ``launch_us=None``, or a
    method that sums kernels as measured (NeuSight as published), prices the plain sum,
    which has no host term to replace. ``tf32``: the convolutions may run in TF32 on a
    datasheet with a tensor-core peak, priced by ``tensor``, a 16-bit GEMM predictor (a name
    or a fitted one; :func:`nslib.model.tf32.tf32_gpu_ms`; ``settings`` find its data).
    ``class_harness``: per campaign, ``{kernel class: ms}``, the most one call of the class
    costs its host (:func:`nslib.evaluation.kernelbench.class_harness_ms`), bounding ``h``
    times the class ratio."""
    sheets = kb.datasheets(root)
    s = settings_of(settings).but(data=data)
    if tf32 and isinstance(tensor, str) and any(g.bf16_gflops for g in sheets.values()):
        try:   # trained (or read from the cache) once, not once per problem
            tensor = tensor_gemm(tensor, s)
        except DataNotFoundError:
            pass   # priced_frame warns and keeps the FP32 prices
    # each campaign's host, once; a campaign without a bound on its host (or the plain sum)
    # keeps the predictor's floor
    hosts = {} if launch_us is None else {
        c: HostFloor(max(float(h), launch_us / 1000.0),
                     tuple(sorted((class_harness or {}).get(c, {}).items())))
        for c, h in harness.items()}
    out = np.full(len(steps), np.nan)
    for i, r in enumerate(steps.itertuples(index=False)):
        if r.reason:
            continue
        h = harness.get(r.campaign)
        frame, notes = priced_frame(level1.trace_of(r.path), sheets[r.hardware], pred,
                                    launch_us, s, tf32, tensor, hosts.get(r.campaign))
        for note in notes:
            warnings.warn(note, stacklevel=2)
        gpu_ms = frame["pred_ms"].sum()
        out[i] = gpu_ms + float(h or 0.0)
    return out


def evaluate(predictors=("nslib", "roofline"), root=None, level: int = 3,
             settings: Settings | None = None, tf32: bool = False,
             **overrides) -> pd.DataFrame:
    """:func:`problem_steps` with ``pred_<name>`` (ms) and ``err_<name>`` (APE, %) per
    predictor (registered names, trained on the NeuSight training GPUs with ``settings`` and
    the training ``overrides``; ``tf32``: convolutions in TF32 where a datasheet allows,
    :func:`price`). ``level`` 1 scores the level-1 problems the kernel table skips."""
    from nslib.predictors import trained

    s = settings_of(settings)
    data, progress = s.data, s.progress
    if level not in (1, 2, 3):
        raise ValueError(f"level must be 1 (the single operators the kernel table has no "
                         f"class for), 2 (fused chains) or 3 (whole models), not {level}")
    # each campaign's per-call cost, bounded on its level-1 problems (once for every predictor)
    kernels, skipped = level1.problem_rows(root, 1, progress=False)
    harness, by_class = level1.harness_ms(kernels), level1.class_harness_ms(kernels)
    # level 1: the operators the kernel table skips (convolutions, pooling, norms, reductions,
    # losses, ops of several kernels), each priced as a one-call step as in a model
    keep = set(zip(skipped["campaign"], skipped["problem"])) if level == 1 else None
    steps = problem_steps(root, level, progress, keep)
    lacking = sorted(set(steps["campaign"]) - set(harness.index)) if len(steps) else []
    if lacking:
        raise ValueError(f"campaign(s) {', '.join(lacking)}: no priced level-1 problem, which "
                         "bounds a campaign's per-call cost (the harness); add the campaign's "
                         "level-1 timings (level1 in its baseline_time_torch.json, with the "
                         "problem files) or leave the campaign out")
    for name in [predictors] if isinstance(predictors, str) else predictors:
        pred = trained(name, s, **overrides)
        steps[f"pred_{name}"] = price(pred, steps, harness, root, data,
                                      tensor=tensor_for(name), settings=s, tf32=tf32,
                                      class_harness=by_class)
        steps[f"err_{name}"] = ape(steps[f"pred_{name}"], steps["latency_ms"])
    return steps


def summary(steps: pd.DataFrame, by=("hardware",)) -> pd.DataFrame:
    """Per group: median APE (%) of each predictor over the priced problems, ``n_priced``,
    ``n_total`` and, where the timings give it, ``trial_cv``: the median over the group's
    problems of their trials' standard deviation over their mean (%), how steady the machine
    was while it measured (a few % where nothing else ran; a campaign far above its peers
    measured something besides its GPU's work, and no forecast of the GPU can follow it)."""
    names = [c.removeprefix("err_") for c in steps.columns if c.startswith("err_")]
    keys = [steps[b] for b in by]
    tab = steps.groupby(keys, sort=True)[[f"err_{n}" for n in names]].median()
    tab.columns = names
    tab["n_priced"] = (steps["reason"] == "").groupby(keys, sort=True).sum()
    tab["n_total"] = steps.groupby(keys, sort=True).size()
    if "trial_cv" in steps:
        tab["trial_cv"] = 100 * steps["trial_cv"].groupby(keys, sort=True).median()
    return tab


def summary_json(steps: pd.DataFrame, predictor: str = "nslib") -> dict:
    """``{GPU: {median_error, n_priced, n_total, trial_cv}}`` of one predictor (the issue's
    JSON; ``trial_cv`` as in :func:`summary`, %, null where the timings give no spread)."""
    tab = summary(steps)

    def number(v):
        return round(float(v), 2) if pd.notna(v) else None
    return {g: {"median_error": number(r[predictor]), "n_priced": int(r["n_priced"]),
                "n_total": int(r["n_total"]), "trial_cv": number(r.get("trial_cv"))}
            for g, r in tab.iterrows()}
