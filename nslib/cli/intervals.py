"""``nslib calibrate``: the intervals of every forecast, calibrated and checked.

A thin layer over :mod:`nslib.predictors.intervals` (the calibration) and
:mod:`nslib.evaluation.interval_eval` (how well it holds).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from nslib.data.checks import arg_float


def _calibrate(args) -> int:
    from nslib.evaluation.interval_eval import (e2e_summary, e2e_table, kernel_table,
                                                tensor_kernel_table)
    from nslib.predictors.intervals import calibration
    cal = calibration(args.predictor, quick=args.quick, coverage=args.coverage,
                      progress=not args.json)
    tensor = _tensor(args)
    tab = kernel_table(args.predictor, args.coverage, quick=args.quick)
    tab16 = tensor_kernel_table("nslib", args.coverage, quick=args.quick) if tensor else None
    e2e = {m: e2e_summary(e2e_table(m, args.predictor, args.coverage, quick=args.quick))
           for m in (args.e2e or [])}
    if args.json:
        print(json.dumps({"calibration": cal.to_dict(),
                          "calibration16": tensor.to_dict() if tensor else None,
                          "kernels": _rows(tab),
                          "kernels16": _rows(tab16) if tab16 is not None else None,
                          "e2e": {m: _rows(t) for m, t in e2e.items()}},
                         indent=1))
        return 0
    pct = 100 * cal.coverage
    print(f"{pct:.0f}% intervals of {args.predictor}, calibrated on its leave-one-GPU-out "
          f"residuals ({', '.join(cal.gpus)} held out in turn); a kernel predicted at p lies "
          "in [p x lower, p x upper]:")
    for c, (lo, hi) in cal.bounds.items():
        print(f"  {c:12s} lower {np.exp(-hi):.3f}  upper {np.exp(-lo):.3f}  ({cal.n[c]} "
              "kernels)")
    print("\nEach GPU against the calibration of the others (achieved coverage and half-width, "
          "%), the +-MAPE band beside:")
    print(tab.round(1).to_string())
    for m, t in e2e.items():
        print(f"\nEnd to end, {m}, GPUs never trained on:")
        print(t.round(1).to_string())
    if tensor is not None:
        print(f"\n16-bit kernels (nslib predict --dtype bf16, nslib serve), held out over "
              f"{', '.join(tensor.gpus)}:")
        for c, (lo, hi) in tensor.bounds.items():
            print(f"  {c:12s} lower {np.exp(-hi):.3f}  upper {np.exp(-lo):.3f}")
        print("Each of them against the calibration of the others:")
        print(tab16.round(1).to_string())
    return 0


def _rows(tab) -> dict:
    """``{row: {column: value}}`` of a coverage table (rows: classes or GPUs), for JSON."""
    return {c: {k: round(float(v), 2) for k, v in r.items()} for c, r in tab.iterrows()}


def _tensor(args):
    """The 16-bit predictors' calibration (``nslib``), or None without the 16-bit data."""
    from nslib.data.paths import DataNotFoundError
    from nslib.predictors.intervals import tensor_calibration
    try:
        return tensor_calibration("nslib", args.quick, coverage=args.coverage,
                                  progress=not args.json)
    except DataNotFoundError:
        return None


def calibrate_hint(predictor: str, quick: bool, tensor_predictor: str | None = None,
                   data=None) -> str | None:
    """The one-line note for a forecast shown without its interval because ``nslib
    calibrate`` has not been run: None when the calibrations it needs (``predictor``'s and,
    for a 16-bit forecast, ``tensor_predictor``'s) are cached, or when the command would not
    build them (it calibrates the 16-bit ``nslib`` predictors only)."""
    from nslib.data.paths import DataNotFoundError
    from nslib.predictors.intervals import COVERAGE, calibration, tensor_calibration
    try:
        tensor_missing = (tensor_predictor is not None and
                          tensor_calibration(tensor_predictor, quick, build=False) is None)
        if tensor_missing and tensor_predictor != "nslib":
            return None
        if not tensor_missing and calibration(predictor, data, quick, build=False) is not None:
            return None
    except (DataNotFoundError, KeyError, ValueError):
        return None
    flags = (f" --predictor {predictor}" if predictor != "nslib" else "") + \
        (" --quick" if quick else "")
    return (f"note: no {100 * COVERAGE:.0f}% interval: `nslib calibrate{flags}` calibrates "
            f"the intervals once (it trains a fold per training GPU), then every forecast "
            f"shows one")


def add_calibrate_parser(sub) -> None:
    s = sub.add_parser("calibrate", help="calibrate (and check) the intervals of a "
                       "predictor's forecasts")
    s.add_argument("--predictor", default="nslib",
                   help="the FP32 predictor whose forecasts the intervals bound (default nslib)")
    s.add_argument("--coverage", type=_coverage, default=0.8,
                   help="central coverage of the intervals (default 0.8)")
    s.add_argument("--e2e", nargs="*", choices=("inf", "train"),
                   help="also check end to end on these modes' labels of the new GPUs")
    s.add_argument("--quick", action="store_true", help="quick-profile predictors")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_calibrate)


__all__ = ["add_calibrate_parser", "calibrate_hint"]


def _coverage(text: str) -> float:
    """argparse type of ``--coverage``: a fraction strictly between 0 and 1, checked before
    any fold trains."""
    value = arg_float(positive=True)(text)
    if not value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1 (0.8 is an 80% "
                                         f"interval), got {text}")
    return value
