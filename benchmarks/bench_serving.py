"""Speed of serving forecasts. Targets (the serving issue): ``nslib serve`` answers in under
2 s as a whole process once the model is traced (engine table, model sizes and predictors
cached), and a 100-point concurrency sweep takes under 2 s in one process once its
``StepCost`` is built. Prints first use (tracing included, when the cache is cold), the
median of 5 cached runs and the sweep; run with NSLIB_DATA and NSLIB_MIXED set.

    python benchmarks/bench_serving.py [--model Qwen/Qwen3-32B] [--gpu "NVIDIA H200"] [--tp 2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np


def timed_cli(args) -> float:
    """Wall seconds of ``python -m nslib.cli ARGS`` as a whole process, timed as a default
    Python runs: bytecode written once, then read (a machine that sets
    PYTHONDONTWRITEBYTECODE compiles every module in every process, as bench_predict.py
    notes)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nslib.cli", *args], env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="Qwen/Qwen3-32B")
    p.add_argument("--gpu", default="NVIDIA H200")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--framework", default="vllm")
    a = p.parse_args(argv)
    cmd = ["serve", "--model", a.model, "--gpu", a.gpu, "--tp", str(a.tp), "--framework",
           a.framework, "--concurrency", "16", "--isl", "1024", "--osl", "128"]
    first = timed_cli(cmd)
    runs = [timed_cli(cmd) for _ in range(5)]
    print(f"nslib serve {a.model} on {a.tp} x {a.gpu}: first use {first:.2f} s, cached "
          f"median {np.median(runs):.2f} s (runs {', '.join(f'{r:.2f}' for r in runs)}; "
          "target < 2 s)")

    from nslib.model.serving import serve, step_cost
    cost = step_cost(a.model, a.gpu, a.tp)
    cost.predictors  # noqa: B018 - loaded before the clock starts, as in a session
    for isl, osl in ((1024, 128), (4096, 512)):
        t0 = time.perf_counter()
        out = serve(cost, np.arange(1, 101), isl, osl, a.framework)
        dt = time.perf_counter() - t0
        print(f"100-point concurrency sweep (isl {isl}, osl {osl}, {a.framework}): {dt:.2f} s "
              f"(target < 2 s); tokens/s at 1 / 100: {out['tokens_per_s'][0]:.0f} / "
              f"{out['tokens_per_s'][-1]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
