"""The ``nslib`` command line. Every sub-command is a thin layer over library functions."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from nslib.data.checks import arg_int
from nslib.data.settings import Settings


def _gpus(args) -> int:
    from nslib.data.gpus import listing_table
    from nslib.data.registry import sources, variant_of
    # one line per datasheet file: the NeuSight data's, then the 16-bit data's (with
    # Bf16FLOPs) and KernelBench's when those folders are there; `predict --gpu` takes any.
    # A variant file (same Device as a canonical one) says so: its name resolves elsewhere
    rows = [{"key": k, "data": src, **g.to_json(), "variant_of": variant_of(sheets).get(k)}
            for src, sheets in sources().items() for k, g in sheets.items()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        if not any(r["variant_of"] for r in rows):   # no empty column
            rows = [{k: v for k, v in r.items() if k != "variant_of"} for r in rows]
        print(listing_table(rows))  # optional TDP (W) etc.: "-" where a datasheet lacks it
    for line in _sm_mismatches():
        print(f"warning: {line}", file=sys.stderr)
    return 0


def _sm_mismatches() -> list[str]:
    """The NeuSight datasheets whose SM count their measured kernels contradict
    (:func:`nslib.kernels.profiled.sm_mismatches`); none without the NeuSight data."""
    from nslib.data.paths import DataNotFoundError
    from nslib.kernels.profiled import sm_mismatches
    try:
        return sm_mismatches()
    except DataNotFoundError:
        return []


def _fetch(args) -> int:
    from nslib.data.fetch import fetch, read_lock
    if args.fetch_kernelbench is not None:
        if args.fetch_mixed is not None:
            raise ValueError("--kernelbench and --mixed fetch different data: pass one of them")
        if args.sha256:
            raise ValueError("--sha256 pins the NeuSight archive; the KernelBench data is "
                             "checked file by file against datasets/kernelbench_registry.json: "
                             "drop --sha256")
        from nslib.data.fetch_kernelbench import fetch_kernelbench
        dest = fetch_kernelbench(dest=args.fetch_kernelbench or None, source=args.source,
                                 force=args.force)
        print(f"KernelBench timings ready at {dest} (every pinned file checked)")
        return 0
    if args.fetch_mixed is not None:
        from nslib.data.fetch_mixed import fetch_mixed
        if args.sha256:
            raise ValueError("--sha256 pins the NeuSight archive; the 16-bit data is checked "
                             "file by file against datasets/mixed_registry.json: drop --sha256")
        dest = fetch_mixed(dest=args.fetch_mixed or None, source=args.source, force=args.force)
        print(f"16-bit data ready at {dest} (every pinned file checked)")
        return 0
    from nslib.data.fetch import load_registry
    dest = fetch(dest=args.data, source=args.source, sha256=args.sha256, force=args.force)
    lock = read_lock(dest) or {}
    print(f"NeuSight data ready at {dest} (sha256 {lock.get('sha256')})")
    if lock.get("sha256") and not (args.sha256 or load_registry().get("sha256")):
        # say so rather than imply a check: nothing pinned the archive's hash yet
        print("note: the archive was not checked against a pinned SHA-256 (datasets/"
              "registry.json records none); copy the hash above into its \"sha256\" so "
              "later fetches are verified", file=sys.stderr)
    return 0


def _predictors(args) -> int:
    from nslib.predictors import KINDS, available
    for kind in KINDS:
        print(f"{kind} kernels:")
        for name, desc in available(kind).items():
            print(f"  {name:12s} {desc}")
    return 0


def _settings(args, progress: bool = True) -> tuple[Settings, dict]:
    """The run's settings from the flags, and the training overrides (``--epochs``)."""
    return (Settings(quick=args.quick, seed=args.seed, progress=progress),
            {} if getattr(args, "epochs", None) is None else {"epochs": args.epochs})


def _train(args) -> int:
    from nslib.predictors import trained
    from nslib.predictors.training import train_all
    settings, overrides = _settings(args)
    if args.all:
        if overrides or args.predictor:
            raise ValueError("--all trains every predictor with its own defaults: drop "
                             "--epochs and --predictor, or train one with --predictor NAME")
        names = train_all(settings, retrain=args.retrain, out=args.out)
        print(f"trained {', '.join(names)}; {_where(args.out)}")
        return 0
    args.predictor = args.predictor or "nslib"
    trained(args.predictor, settings, out=args.out, retrain=args.retrain, **overrides)
    print(f"trained {args.predictor}; {_where(args.out)}")
    return 0


def _where(out) -> str:
    """Where ``nslib train`` left the weights: the cache, or only the ``--out`` folder."""
    return (f"weights written to {out} (not to the cache)" if out else
            "cached for every command and notebook")


def _eval_kernels_16bit(args) -> int:
    from nslib.evaluation.kernel_level import evaluate_16bit
    if args.lookup:
        raise ValueError("--lookup applies to the FP32 kernels only (16-bit kernels have no "
                         "kernel names to take tiles from): drop it")
    if args.logo and args.test_gpus:
        raise ValueError("--logo and --test-gpus are two protocols: give one of them")
    if args.epochs is not None:
        raise ValueError("--epochs applies to the FP32 predictors; the 16-bit ones train "
                         "with their own settings: drop it")
    res = evaluate_16bit(args.predictor, args.test_gpus, args.seed, args.quick)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    how = (f"trained on every other measured GPU, predicting {', '.join(args.test_gpus)}"
           if args.test_gpus else "leave-one-GPU-out over the measured GPUs")
    print(f"MAPE (%) of the {args.dtype} {args.predictor} predictor, {how}")
    print(pd.DataFrame(res).round(1).to_string())
    return 0


def _eval_kernelbench(args) -> int:
    from nslib.evaluation.kernelbench import MEAN, evaluate, table_json
    if args.dtype != "fp32" or args.logo or args.lookup or args.test_gpus:
        raise ValueError("--kernelbench evaluates FP32 kernels on the KernelBench GPUs with "
                         "the predictor trained on the NeuSight training GPUs: drop --dtype, "
                         "--logo, --lookup and --test-gpus")
    root = args.kernelbench or None
    names = [args.predictor] + [b for b in ("roofline",) if b != args.predictor]
    settings, overrides = _settings(args, progress=not args.json)
    res = evaluate(names, root=root, settings=settings, **overrides)
    if args.json:
        print(json.dumps(table_json(res[args.predictor]), indent=1))
        return 0
    skipped, n = res["skipped"], len(res["frame"])
    print(f"KernelBench level 1: {n} priced problem runs, {len(skipped)} skipped "
          f"({', '.join(f'{k} {v}' for k, v in skipped['reason'].value_counts().items())})")
    for name in names:
        print(f"\nMAPE (%) of {name}, trained on the NeuSight training GPUs (per-call "
              f"harness cost added)")
        print(res[name].round(1).to_string())
    print(f"\n'{MEAN}' is the mean of the per-GPU MAPEs of a row")
    return 0


def _eval_kernels(args) -> int:
    from nslib.kernels.dtypes import check_dtype
    args.dtype = check_dtype(args.dtype)
    if args.kernelbench is not None:
        return _eval_kernelbench(args)
    if args.dtype != "fp32":
        return _eval_kernels_16bit(args)
    if args.test_gpus:
        raise ValueError("--test-gpus applies to the 16-bit kernels (--dtype bf16); the FP32 "
                         "test GPUs are the data's own split")
    from nslib.evaluation.kernel_level import evaluate_logo, evaluate_predictor, logo_json
    from nslib.evaluation.metrics import table_json
    settings, overrides = _settings(args)
    if args.logo:
        tab = evaluate_logo(args.predictor, settings, **overrides)
        if args.json:
            print(json.dumps(logo_json(tab), indent=1))
        else:
            print(f"Leave-one-GPU-out MAPE (%) of {args.predictor}: each training GPU's test "
                  "kernels predicted by the predictor trained on the other training GPUs; "
                  "new GPUs by the one trained on all of them")
            print(tab.round(1).to_string())
        return 0
    tab = evaluate_predictor(args.predictor, args.lookup, settings, **overrides)
    if args.json:
        print(json.dumps(table_json(tab), indent=1))
    else:
        print(f"Mean absolute percentage error (%) of {args.predictor} on the test kernels")
        print(tab.round(1).to_string())
    return 0


def _reproduce(args) -> int:
    from nslib.reproduce import output_paths, run
    recs = run(quick=args.quick, force=args.force, only=args.only or None, out=args.out,
               results=args.results)
    print(f"{'notebook':28s} {'status':12s} seconds")
    for r in recs:
        print(f"{r['notebook']:28s} {r['status']:12s} {r['seconds']:7.1f}")
    print(f"total {sum(r['seconds'] for r in recs):.1f} s; figures and tables in "
          f"{output_paths(args.quick, args.out, args.results)[0]}")
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument error as one line naming the command's help, not the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nslib", description=__doc__)
    p.add_argument("--data", help="NeuSight data root (default: $NSLIB_DATA or datasets/neusight)")
    p.add_argument("--mixed", help="16-bit measurements root (default: $NSLIB_MIXED or "
                   "datasets/mixed)")
    p.add_argument("--cache", help="cache folder (default: $NSLIB_CACHE or ~/.cache/nslib)")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_data_commands(sub)
    _add_kernel_commands(sub)
    _add_reproduce(sub)
    from nslib.cli.models import add_eval_models_parser
    from nslib.cli.predict import add_predict_parser
    from nslib.cli.intervals import add_calibrate_parser
    from nslib.cli.serving import add_serving_parsers
    from nslib.cli.collect import add_collect_parser
    add_predict_parser(sub)
    add_eval_models_parser(sub)
    add_serving_parsers(sub)
    add_calibrate_parser(sub)
    add_collect_parser(sub)
    _global_options_anywhere(p, sub)
    return p


def _add_data_commands(sub) -> None:
    """``gpus``, ``fetch`` and ``predictors``."""
    s = sub.add_parser("gpus", help="table of known GPUs (NeuSight data, then the 16-bit "
                       "and KernelBench data; variant_of: the GPU a variant datasheet "
                       "describes again)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_gpus)

    s = sub.add_parser("fetch", help="download the pinned NeuSight data (or copy a mirror); "
                       "--mixed: the 16-bit data; --kernelbench: the KernelBench timings")
    s.add_argument("--mixed", dest="fetch_mixed", nargs="?", const="", metavar="PATH",
                   help="fetch the 16-bit data instead, into PATH (default: $NSLIB_MIXED, "
                   "or the global --mixed, or datasets/mixed)")
    s.add_argument("--kernelbench", dest="fetch_kernelbench", nargs="?", const="",
                   metavar="PATH", help="fetch the KernelBench timings instead, into PATH "
                   "(default: $NSLIB_KERNELBENCH, or datasets/kernelbench)")
    s.add_argument("--source", help="mirror URL, local archive or folder (with --mixed: a "
                   "folder holding each repository as a folder or .tar.gz/.zip; with "
                   "--kernelbench: a copy laid out like the data, or <commit>/ folders or "
                   "<commit>.tar.gz archives)")
    s.add_argument("--sha256", help="expected SHA-256 of the archive")
    s.add_argument("--force", action="store_true", help="replace existing data")
    s.set_defaults(func=_fetch)

    s = sub.add_parser("predictors", help="list the kernel predictors")
    s.set_defaults(func=_predictors)


def _train_opts(s, default="nslib") -> None:
    s.add_argument("--predictor", default=default,
                   help="predictor name (see `nslib predictors`; default nslib, nslib's design)")
    s.add_argument("--epochs", type=arg_int(), help="training epochs of every class "
                   "(predictors trained by epochs only)")
    s.add_argument("--seed", type=arg_int(minimum=0), default=0)
    s.add_argument("--quick", action="store_true", help="the quick profile (tests)")


def _add_kernel_commands(sub) -> None:
    """``train`` and ``eval-kernels``."""
    s = sub.add_parser("train", help="train a predictor on the training GPUs (cached)")
    _train_opts(s, default=None)
    s.add_argument("--all", action="store_true", help="train every predictor (ahead of use)")
    s.add_argument("--out", help="folder for the weights (default: the cache)")
    s.add_argument("--retrain", action="store_true", help="train even if cached")
    s.set_defaults(func=_train)

    s = sub.add_parser("eval-kernels", help="per-class kernel error on the test split")
    _train_opts(s)
    s.add_argument("--lookup", action="store_true",
                   help="look every tile up as on an unprofiled GPU (default: only where "
                        "the GPU was never trained on)")
    s.add_argument("--logo", action="store_true",
                   help="leave-one-GPU-out: hold each training GPU out in turn (JSON: "
                        "{class: {GPU: mape}}); the default protocol in 16 bits")
    s.add_argument("--dtype", default="fp32",
                   help="fp32 (the paper's kernels, default), or bf16/fp16: the 16-bit GEMM "
                        "and attention kernels of the mixed data (classes gemm, attention)")
    s.add_argument("--test-gpus", nargs="+", metavar="GPU",
                   help="16-bit only: train on every other measured GPU and report these "
                        "(Device names or file stems)")
    s.add_argument("--kernelbench", nargs="?", const="", metavar="DIR",
                   help="KernelBench's level-1 problems on its GPUs as the test set (DIR, "
                        "default: $NSLIB_KERNELBENCH or datasets/kernelbench; JSON: {class or "
                        "family: {GPU: mape}}), the roofline beside the predictor")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_eval_kernels)


def _add_reproduce(sub) -> None:
    s = sub.add_parser("reproduce", help="run every notebook (papermill), write figures/")
    s.add_argument("--quick", action="store_true", help="the quick profile (minutes)")
    s.add_argument("--force", action="store_true", help="rerun up-to-date notebooks too")
    s.add_argument("--only", nargs="*", help="notebook names to run (default: all)")
    s.add_argument("--out", help="figures folder (default: figures/, or figures/quick/ with "
                   "--quick)")
    s.add_argument("--results", help="executed notebooks folder (default: results/<profile>)")
    s.set_defaults(func=_reproduce)


def _global_options_anywhere(p, sub) -> None:
    """Accept --data, --mixed and --cache after the sub-command too (``nslib predict --data X``;
    ``fetch`` has its own ``--mixed [PATH]``).

    SUPPRESS keeps a sub-command that was not given them from resetting the value given
    before it."""
    for s in sub.choices.values():
        for opt in ("--data", "--mixed", "--cache"):
            if opt in s._option_string_actions:
                continue
            s.add_argument(opt, default=argparse.SUPPRESS,
                           help=next(a.help for a in p._actions if opt in a.option_strings))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.data:
        os.environ["NSLIB_DATA"] = args.data
    if args.mixed:
        os.environ["NSLIB_MIXED"] = args.mixed
    if args.cache:
        os.environ["NSLIB_CACHE"] = args.cache
    from nslib.data.paths import CacheError, DataNotFoundError
    try:
        return args.func(args)
    except Exception as e:
        from nslib.reproduce import NotebookFailed
        if not isinstance(e, (NotebookFailed, DataNotFoundError, FileNotFoundError,
                              FileExistsError, ValueError, KeyError, CacheError,
                              ConnectionError)):
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, KeyError) and " " not in str(msg):   # a bare lookup, not a message
            import traceback
            where = traceback.extract_tb(e.__traceback__)[-1]
            msg = (f"no field {msg!r} where nslib looked for it ({Path(where.filename).name}, "
                   f"line {where.lineno}): an input lacks it, or this is a bug to report")
        print(f"nslib: error: {msg}", file=sys.stderr)
        return 2
