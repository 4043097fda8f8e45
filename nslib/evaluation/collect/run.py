"""One collection: probe the device, write its datasheet, run the parts within their shares of
the budget, and record the provenance (see :mod:`nslib.evaluation.collect`)."""
from __future__ import annotations

import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from nslib import __version__
from nslib.data.checks import check_float
from nslib.data.paths import atomic_write_text
from nslib.data.settings import Settings, settings_of
from nslib.evaluation.collect import fp32, layout, steps, tensor16
from nslib.evaluation.collect.sheet import datasheet
from nslib.evaluation.collect.sweep import probe, run_plan
from nslib.evaluation.collect.timing import Clock

PARTS = ("fp32", "tensor", "models")
SHARES = {"fp32": 0.4, "tensor": 0.3, "models": 0.3}  # of the budget; unused time carries over
CAP_S = 0.5  # no single kernel call longer than this (seconds) is measured
MIN_SHAPES = 50  # nor one longer than a part's time over this: a short budget covers many shapes


def versions(clock: Clock) -> dict:
    """Torch, CUDA, cuDNN, driver and Python versions, as recorded beside the rows."""
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda or "cpu",
            "cudnn": torch.backends.cudnn.version() if clock.cuda else None,
            "python": platform.python_version(), "nslib": __version__}


def _columns(v: dict, device: str) -> dict:
    """The version columns of a NeuSight kernel row."""
    return {"Device": device, "Torch Version": "p" + v["torch"].split("+")[0],
            "CUDNN Version": v["cudnn"] or 0,
            "CUDA Version": "cu" + v["cuda"].replace(".", "") if v["cuda"] != "cpu" else "cpu"}


def _memory_cap(clock: Clock) -> float:
    """Bytes a part may hold at once: a quarter of the device's free memory (1 GB on the CPU)."""
    import torch

    if not clock.cuda:
        return 1e9
    free, _ = torch.cuda.mem_get_info(clock.device)
    return free / 4


def _run_part(part, clock, out, device, deadline, rates, v, args) -> dict:
    cap = min(CAP_S, max(deadline - time.monotonic(), 0.0) / MIN_SHAPES)
    if part == "fp32":
        items = fp32.pending(fp32.plan(args["data"], args["seed"]), out)
        measure = fp32.measurer(clock, rates, _columns(v, device), _memory_cap(clock))
        tally = run_plan(items, measure, fp32.writer(out), deadline, cap, "FP32 kernels",
                         args["progress"])
    elif part == "tensor":
        tv = v["torch"].split("+")[0]
        items = tensor16.pending(tensor16.plan(args["seed"]), out, device, tv)
        common = {"framework": "torch", "version": tv, "device": device}
        measure = tensor16.measurer(clock, rates, common, _memory_cap(clock))
        tally = run_plan(items, measure, tensor16.writer(out, device, tv), deadline, cap,
                         "16-bit kernels", args["progress"])
    else:
        return steps.measure_steps([steps.parse_step(s) for s in args["models"]], clock, out,
                                   device, deadline, args["data"], args["progress"])
    return {"rows": tally.rows, "skipped": tally.skipped, "error": tally.error,
            "seconds": tally.seconds}


def collect(out, *, device: str = "cuda", minutes: float = 10.0, parts=PARTS,
            vendor_sheet: dict | None = None, models=steps.DEFAULT_STEPS,
            flush_l2: bool = False, settings: Settings | None = None) -> dict:
    """Measure ``device`` for about ``minutes`` into ``out`` (see the package doc); returns the
    provenance record (also written to ``out/provenance.json``). A rerun into the same folder
    resumes: rows and labels already there are kept and not measured again. ``settings``: the
    seed of the sampled shapes, the data the model steps are configured from, progress bars."""
    import torch

    s = settings_of(settings)
    seed = s.seed

    minutes = check_float("minutes", minutes, positive=True)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise ValueError(f"unknown part(s) {unknown or parts}; choose from {', '.join(PARTS)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("no CUDA device here: run on a machine with an NVIDIA GPU, or pass "
                         "--device cpu to try the harness")
    start = time.monotonic()
    clock = Clock(device, flush_l2=flush_l2)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 products as the NeuSight data ran them
    try:
        torch.manual_seed(seed)
        rates = probe(clock)
        sheet, origin = datasheet(device, rates, vendor_sheet)
        out = Path(out)
        record = _record(out, sheet, origin, versions(clock), rates, clock, minutes, seed)
        for path in layout.datasheet_paths(out, sheet["Device"]):
            atomic_write_text(path, json.dumps(sheet, indent=4))
        return _run_parts(record, parts, clock, out, start, minutes, rates,
                          {"data": s.data, "seed": seed, "progress": s.progress,
                           "models": models})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _record(out: Path, sheet: dict, origin: dict, v: dict, rates: dict, clock: Clock,
            minutes: float, seed: int) -> dict:
    """The provenance record of a run, with the records of earlier runs into ``out``; a
    ValueError when ``out`` holds another GPU's measurements."""
    record = {"device": sheet["Device"], "datasheet": origin, "versions": v, "rates": rates,
              "protocol": {"clock": "CUDA events" if clock.cuda else "wall clock",
                           "kernel_latency": "median of 3-25 timed calls after 2 warm-ups",
                           "tensor_kernels": "CUDA graph of 1-20 calls, replayed 3-25 times, "
                                             "median per call (GPU only)",
                           "flush_l2": clock.flush_l2, "tf32": False,
                           "label": "mean of the 5 fastest of up to 10 steps after 2 warm-ups"},
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "minutes": minutes, "seed": seed, "parts": {}}
    earlier = out / "provenance.json"
    if earlier.is_file():  # a resumed collection keeps the record of every run into it
        old = json.loads(earlier.read_text())
        if old.get("device") != sheet["Device"]:
            raise ValueError(f"{out} holds measurements of {old.get('device')!r}, not of "
                             f"{sheet['Device']!r}: collect into another --out folder")
        record["earlier_runs"] = old.pop("earlier_runs", []) + [old]
    return record


def _run_parts(record: dict, parts, clock, out: Path, start: float, minutes: float,
               rates: dict, args: dict) -> dict:
    """Run the chosen parts in order, each within its share of the time left."""
    chosen = [p for p in PARTS if p in parts]
    budget = minutes * 60 - (time.monotonic() - start)
    share_left = sum(SHARES[p] for p in chosen)
    for part in chosen:
        left = minutes * 60 - (time.monotonic() - start)
        deadline = time.monotonic() + max(0.0, left * SHARES[part] / share_left)
        share_left -= SHARES[part]
        record["parts"][part] = _run_part(part, clock, out, record["device"], deadline, rates,
                                          record["versions"], args)
        atomic_write_text(out / "provenance.json", json.dumps(record, indent=2, default=str))
    record["budget_s"] = round(budget, 1)
    record["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    atomic_write_text(out / "provenance.json", json.dumps(record, indent=2, default=str))
    return record
