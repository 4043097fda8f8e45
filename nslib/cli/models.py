"""``nslib eval-models``: end-to-end error against the measured labels, from the command line.

A thin layer over :mod:`nslib.evaluation.model_level`: the mean error per GPU of each
predictor (the paper's protocol), or with ``--logo`` the training GPUs' labels under both
protocols (:func:`nslib.evaluation.model_level.logo_table`).
"""
from __future__ import annotations

import json

import pandas as pd

from nslib.cli.common import warnings_as_lines
from nslib.data.checks import arg_int
from nslib.data.settings import Settings


def _eval_kernelbench_models(args) -> int:
    from nslib.evaluation import kernelbench_models as km
    if args.logo or args.gpus or args.models or args.mode != "inf":
        raise ValueError("--kernelbench scores KernelBench's problems (inference, as "
                         "its harness ran them) on their own GPUs: drop --logo, --gpus, "
                         "--models and --mode")
    names = list(dict.fromkeys(args.predictor + ["roofline"]))
    steps = km.evaluate(names, root=args.kernelbench or None, level=args.level,
                        settings=Settings(quick=args.quick, seed=args.seed,
                                          progress=not args.json))
    if args.json:
        print(json.dumps(km.summary_json(steps, args.predictor[0]), indent=1))
        return 0
    print(f"KernelBench level {args.level}: median error (%) of the priced problems per GPU, "
          "then per family (each problem traced from its file, priced on its GPU's datasheet)")
    print(km.summary(steps).round(1).to_string())
    print(km.summary(steps, by=("family",)).round(1).to_string())
    skipped = steps[steps["reason"] != ""].drop_duplicates("problem")
    for _, r in skipped.iterrows():
        what = f" ({r['unpriced']}; {100 * r['unpriced_share']:.0f}% of the calls)" \
            if r["unpriced"] else ""
        print(f"not priced: {r['problem']}: {r['reason']}{what}")
    return 0


def _eval_models(args) -> int:
    with warnings_as_lines():
        return _eval_models_quietly(args)


def _eval_models_quietly(args) -> int:
    if args.kernelbench is not None:
        return _eval_kernelbench_models(args)
    from nslib.evaluation.model_level import evaluate_models, logo_table, training_gpu_keys
    from nslib.predictors import available
    unknown = [p for p in args.predictor if p not in available()]
    if unknown:
        raise ValueError(f"unknown predictor(s) {unknown}; known: {sorted(available())}")
    kw = dict(gpus=args.gpus, models=args.models,
              settings=Settings(quick=args.quick, seed=args.seed, progress=not args.json))
    res = evaluate_models(args.mode, args.predictor, **kw)
    if res.empty:
        raise ValueError(f"no {args.mode} labels match the given --gpus/--models: `nslib gpus` "
                         "lists the GPUs; labels live in the data's label/<GPU>/ folders")
    failed = res[res["note"] != ""]
    if args.logo:
        keys = training_gpu_keys(res)
        if not keys:
            raise ValueError(f"--logo holds training GPUs out, and none of them has {args.mode} "
                             f"labels here: drop --logo or widen --gpus")
        held = evaluate_models(args.mode, args.predictor, **{**kw, "gpus": keys}, logo=True)
        tab = logo_table(res, held)
        failed = pd.concat([failed, held[held["note"] != ""]])
        title = (f"{args.mode}: mean end-to-end error (%) on the training GPUs' labels, the "
                 "paper's protocol and leave-one-GPU-out (each GPU priced by the predictor "
                 "trained without it)")
    else:
        tab = res.pivot_table(index="predictor", columns="gpu", values="err", aggfunc="mean")
        tab["all"] = res.groupby("predictor")["err"].mean()
        title = f"{args.mode}: mean end-to-end error (%) per GPU (the paper's protocol)"
    if args.json:
        print(json.dumps({r: {c: round(float(v), 4) for c, v in row.items() if pd.notna(v)}
                          for r, row in tab.iterrows()}, indent=1))
        return 0
    print(title)
    print(tab.round(1).to_string())
    for _, r in failed.iterrows():
        print(f"not priced: {r['gpu']} {r['tag']} ({r['predictor']}): {r['note']}")
    return 0


def add_eval_models_parser(sub) -> None:
    s = sub.add_parser("eval-models", help="end-to-end error against the measured labels")
    s.add_argument("--mode", choices=("inf", "train"), default="inf",
                   help="inference or training labels (default inf)")
    s.add_argument("--predictor", nargs="+", default=["nslib"],
                   help="predictor names (default nslib; see `nslib predictors`)")
    s.add_argument("--gpus", nargs="+", metavar="GPU",
                   help="GPU file stems or Device names (default: every GPU with labels)")
    s.add_argument("--models", nargs="+", metavar="MODEL",
                   help="model names (default: every labelled model)")
    s.add_argument("--logo", action="store_true",
                   help="also price each training GPU's labels with the predictor trained "
                        "without it (JSON: {'<predictor> (<protocol>)': {GPU: error}})")
    s.add_argument("--kernelbench", nargs="?", const="", metavar="DIR",
                   help="score KernelBench's problems (any PyTorch module; --level) against "
                        "their measured times instead (DIR, default: $NSLIB_KERNELBENCH or "
                        "datasets/kernelbench; JSON: {GPU: {median_error, n_priced, n_total, "
                        "trial_cv}})")
    s.add_argument("--level", type=int, choices=(1, 2, 3), default=3,
                   help="with --kernelbench: 3 (whole models; default), 2 (fused chains) or 1 "
                        "(the single operators eval-kernels has no class for: convolutions, "
                        "pooling, norms, reductions, losses)")
    s.add_argument("--seed", type=arg_int(minimum=0), default=0)
    s.add_argument("--quick", action="store_true", help="the quick profile (tests)")
    s.add_argument("--json", action="store_true",
                   help="JSON: {predictor: {GPU: mean error %%, 'all': ...}}")
    s.set_defaults(func=_eval_models)
