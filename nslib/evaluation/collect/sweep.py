"""The budgeted sweep every part of a collection runs: shapes in a planned order, each timed
unless it would not fit the time left, rows written in chunks.

A plan is a list of items (dicts); a part supplies, per item, a rough time (:func:`rough_s`
from its FLOPs and bytes against the device's probed rates), the call to time, and the row to
write. Items whose rough time exceeds the cap, or whose tensors do not fit, are skipped and
counted, never silently dropped; an out-of-memory error skips the item, any other error stops
the part with its message in the provenance record.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from nslib.evaluation.collect.timing import Clock, time_calls

CHUNK_S = 20.0  # write what was measured at least this often (seconds)


def probe(clock: Clock) -> dict:
    """The device's sustained FP32 and BF16 matrix rates (FLOP/s) and copy rate (bytes/s, read
    + write), each measured on one product or copy: the scale of the rough times, not a
    datasheet."""
    import torch

    n, elems = (2048, 1 << 26) if clock.cuda else (384, 1 << 22)
    a = torch.randn(n, n, device=clock.device)
    src = torch.empty(elems, device=clock.device)
    dst = torch.empty_like(src)
    t_mm = min(time_calls(lambda: a @ a, clock, 3)) / 1e3
    t_cp = min(time_calls(lambda: dst.copy_(src), clock, 3)) / 1e3
    h = a.to(torch.bfloat16)
    t_16 = min(time_calls(lambda: h @ h, clock, 3)) / 1e3
    return {"flops_per_s": 2 * n ** 3 / t_mm, "bytes_per_s": 8 * elems / t_cp,
            "bf16_flops_per_s": 2 * n ** 3 / t_16}


def rough_s(flops: float, nbytes: float, rates: dict) -> float:
    """Rough time (s) of one call: the slower of its FLOPs and its bytes at the probed rates,
    plus a launch."""
    return max(flops / rates["flops_per_s"], nbytes / rates["bytes_per_s"]) + 10e-6


def reps_for(rough: float, target_s: float = 0.05, lo: int = 3, hi: int = 25) -> int:
    """Timed repetitions of a call of ``rough`` seconds: about ``target_s`` in all, within
    ``[lo, hi]``."""
    return int(min(hi, max(lo, round(target_s / max(rough, 1e-7)))))


def unmeasured(items: list[dict], key_of, done: set) -> list[dict]:
    """The items whose ``key_of(item)`` is not in ``done`` (the keys of rows already written:
    a rerun resumes), each key once (a plan can repeat a shape)."""
    seen, out = set(done), []
    for x in items:
        k = key_of(x)
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


@dataclass
class Tally:
    """What a part did: rows measured, items skipped by reason, and an error that stopped it."""
    rows: int = 0
    skipped: dict = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def run_plan(plan, measure, write, deadline: float, cap_s: float, what: str,
             progress: bool = True) -> Tally:
    """Measure ``plan`` in order until ``deadline`` (``time.monotonic()`` seconds).

    ``measure(item) -> (rough seconds, thunk)``: the thunk times the item and returns its row
    (or None to skip it). Rows go to ``write(rows)`` in chunks. Items with a rough time over
    ``cap_s`` or over the time left are skipped.
    """
    import torch

    tally, rows, last = Tally(), [], time.monotonic()
    start = last
    bar = tqdm(plan, desc=what, disable=not progress, unit="shape")
    for item in bar:
        now = time.monotonic()
        if now >= deadline:
            tally.skip("time budget spent")
            continue
        try:
            rough, thunk = measure(item)
            if rough > cap_s or rough * 6 > deadline - now:
                tally.skip("longer than the cap or the time left")
                continue
            row = thunk()
        except torch.OutOfMemoryError:
            tally.skip("out of device memory")
            torch.cuda.empty_cache()
            continue
        except Exception as e:  # noqa: BLE001 - recorded in the provenance, the rows so far kept
            tally.error = f"{type(e).__name__}: {e}"[:500]
            break
        if row is None:
            tally.skip("not runnable here")
            continue
        rows.append(row)
        tally.rows += 1
        if time.monotonic() - last > CHUNK_S:
            write(rows)
            rows, last = [], time.monotonic()
    bar.close()
    write(rows)
    tally.seconds = round(time.monotonic() - start, 1)
    return tally
