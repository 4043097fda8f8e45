"""Training time and accuracy of a predictor on this machine (issue target for NeuSight: all
five classes in at most 20 minutes with the defaults; quick profile under 2 minutes).

    python benchmarks/bench_train.py [--predictor neusight] [--quick] [--seed 0]

Trains from scratch (replacing the cached predictor of the same parameters), prints the wall
time and the per-class test error table (training GPUs / new GPUs).
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--predictor", default="nslib")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from nslib.evaluation.kernel_level import evaluate_predictor
    from nslib.data.settings import Settings
    from nslib.predictors import trained
    from nslib.predictors.training import train_frame
    settings = Settings(quick=a.quick, seed=a.seed)
    train_frame()  # build the tables outside the timing
    t0 = time.time()
    trained(a.predictor, settings, retrain=True)
    secs = time.time() - t0
    tab = evaluate_predictor(a.predictor, settings=settings)
    profile = "quick" if a.quick else "default"
    print(f"{a.predictor} ({profile} profile, seed {a.seed}): trained all classes in "
          f"{secs:.1f} s ({secs / 60:.1f} min)")
    print(tab.round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
