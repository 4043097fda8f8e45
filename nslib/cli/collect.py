"""``nslib collect``: measure this machine's GPU into the layouts nslib reads
(:mod:`nslib.evaluation.collect`), or drop a collection into a copy of the data."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from nslib.data.checks import arg_float, arg_int


def _collect(args) -> int:
    from nslib.data.settings import Settings
    from nslib.evaluation.collect.layout import merge_into
    from nslib.evaluation.collect.run import PARTS, collect
    from nslib.evaluation.collect.steps import DEFAULT_STEPS, parse_step

    if args.merge_into:
        written = merge_into(Path(args.out), Path(args.merge_into))
        print(f"nslib: {len(written)} file(s) of {args.out} dropped into {args.merge_into}")
        return 0
    vendor = None
    if args.datasheet:
        from nslib.data.gpus import load_gpu_file
        load_gpu_file(args.datasheet)  # a clear error for a malformed sheet
        vendor = json.loads(Path(args.datasheet).read_text())
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    models = [m.strip() for m in args.models.split(",")] if args.models else list(DEFAULT_STEPS)
    for m in models:
        parse_step(m)  # the format error before any measuring
    record = collect(args.out, device=args.device, minutes=args.minutes, parts=parts or PARTS,
                     vendor_sheet=vendor, models=models, flush_l2=args.flush_l2,
                     settings=Settings(seed=args.seed, progress=not args.json))
    if args.json:
        print(json.dumps(record, indent=1, default=str))
        return 0
    print(f"nslib: measured {record['device']} into {args.out}")
    for part, r in record["parts"].items():
        skipped = ", ".join(f"{v} {k}" for k, v in r["skipped"].items()) or "none"
        print(f"  {part}: {r['rows']} rows in {r['seconds']} s; skipped: {skipped}"
              + (f"; stopped by {r['error']}" if r.get("error") else ""))
    missing = record["datasheet"]["vendor_figures_missing"]
    if missing:
        print(f"  the datasheet lacks {', '.join(missing)} (no driver reports such figures): "
              "add the vendor's figures with --datasheet FILE", file=sys.stderr)
    return 0


def _eval_measured(args) -> int:
    from nslib.evaluation import measured_gpu as mg

    folders = mg.collections(args.folder)
    if not folders:
        raise ValueError(f"no `nslib collect` output at or under {args.folder}: pass the folder "
                         "that `nslib collect --out` wrote (or the folder holding several)")
    pick = lambda s: [x for x in s.split(",") if x] if s is not None else None  # noqa: E731
    kw = {k: v for k, v in (("fp32", pick(args.fp32)), ("tensor", pick(args.tensor)),
                            ("steps", pick(args.steps))) if v is not None}
    reports = [mg.report(f, quick=args.quick, seed=args.seed, **kw) for f in folders]
    if args.json:
        print(json.dumps([mg.report_json(r) for r in reports], indent=1))
        return 0
    for rep in reports:
        print(f"{rep['gpu']}: forecasts from its datasheet alone against its measurements")
        for check, what in (("fp32", "FP32 kernels, MAPE % by class"),
                            ("tensor", "16-bit kernels, MAPE % by kind"),
                            ("steps", "model steps, MAPE % by format")):
            if check in rep:
                tab = rep[check]["errors"]
                ratio = [c for c in tab.columns if c.startswith("ratio_")]
                print(f"\n{what}\n{tab.drop(columns=ratio).round(1).to_string()}")
                if ratio:
                    print("median predicted / measured\n" + tab[ratio].rename(
                        columns=lambda c: c.removeprefix("ratio_")).round(2).to_string())
        rows = rep.get("steps", {}).get("rows")
        if rows is not None:
            cols = ["tag", "latency_ms"] + [c for c in rows.columns if c.startswith("pred_")]
            print(f"\nmodel steps, ms\n{rows[cols].round(1).to_string(index=False)}")
    return 0


def add_collect_parser(sub) -> None:
    s = sub.add_parser("collect", help="measure this machine's GPU (FP32 kernels, 16-bit GEMMs "
                       "and attention, model steps) into the layouts nslib reads")
    s.add_argument("--out", required=True, help="output folder (a rerun into it resumes)")
    s.add_argument("--device", default="cuda",
                   help="cuda, cuda:N, or cpu (to try the harness; default cuda)")
    s.add_argument("--minutes", type=arg_float(positive=True), default=10.0,
                   help="time budget for the whole collection (default 10)")
    s.add_argument("--parts", default="fp32,tensor,models",
                   help="comma-separated parts: fp32, tensor, models (default all)")
    s.add_argument("--models", default=None,
                   help="model steps, comma-separated name:inf|train:seq:batch[:bf16] "
                   "(default: the paper's configurations and one 16-bit model)")
    s.add_argument("--datasheet", default=None,
                   help="the vendor's datasheet (NeuSight JSON) for the figures the driver "
                   "cannot report (Bf16FLOPs, Link_Bw, FP32 peak, TDP)")
    s.add_argument("--seed", type=arg_int(minimum=0), default=0)
    s.add_argument("--flush-l2", action="store_true",
                   help="overwrite the L2 before each timed kernel call (cold-cache timings)")
    s.add_argument("--merge-into", default=None,
                   help="instead of measuring: drop the collection at --out into this copy "
                   "of the data (a folder holding neusight/ and mixed/)")
    s.add_argument("--json", action="store_true", help="print the provenance record as JSON")
    s.set_defaults(func=_collect)

    e = sub.add_parser("eval-measured", help="forecasts from the datasheet alone against a GPU "
                       "measured with `nslib collect` (kernel classes, 16-bit kernels, steps)")
    e.add_argument("folder", help="a `nslib collect --out` folder, or a folder of them "
                   "(e.g. datasets/measured)")
    e.add_argument("--fp32", default=None, help="FP32 predictors, comma-separated ('' skips)")
    e.add_argument("--tensor", default=None, help="16-bit predictors, comma-separated")
    e.add_argument("--steps", default=None, help="model-step predictors, comma-separated")
    e.add_argument("--quick", action="store_true", help="quick predictor profile")
    e.add_argument("--seed", type=arg_int(minimum=0), default=0)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_eval_measured)
