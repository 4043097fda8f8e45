"""Timing one operation on a device, and the kernels it launches.

On a CUDA device a call is timed with CUDA events after warm-up, each repetition its own pair of
events (so the fastest runs can be kept, as the NeuSight labels keep the 5 fastest of 25); with
``flush_l2`` a buffer twice the L2's size is overwritten before each repetition, so the kernel
starts from a cold cache. On the CPU the same loop uses the wall clock: the harness and its
sweeps are the same, only the clock differs (which is what the tests run).

:func:`launches` asks the PyTorch profiler which kernels one call launches, with their launch
grid and block, as the NeuSight kernel CSVs record them.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """Where and how calls are timed: ``device`` (``cuda``, ``cuda:1``, ``cpu``), warm-up calls,
    and whether the L2 is flushed before each timed call."""
    device: str = "cuda"
    warmup: int = 2
    flush_l2: bool = False

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _flusher(clock: Clock):
    """A function that evicts the L2 (CUDA, ``flush_l2``), else one that does nothing."""
    import torch

    if not (clock.cuda and clock.flush_l2):
        return lambda: None
    size = torch.cuda.get_device_properties(clock.device).L2_cache_size
    buf = torch.empty(max(2 * size, 1 << 20) // 4, dtype=torch.float32, device=clock.device)
    return lambda: buf.fill_(0.0)


def time_calls(fn, clock: Clock, reps: int) -> list[float]:
    """``reps`` timings (ms) of ``fn()`` after ``clock.warmup`` untimed calls."""
    import torch

    flush = _flusher(clock)
    for _ in range(clock.warmup):
        fn()
    if not clock.cuda:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize(clock.device)
    pairs = []
    for _ in range(reps):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(clock.device)
    return [s.elapsed_time(e) for s, e in pairs]


def time_graph(fn, clock: Clock, reps: int, inner: int) -> list[float]:
    """``reps`` timings (ms per call) of ``fn()`` captured ``inner`` times in one CUDA graph and
    replayed: the GPU's time for the kernels alone, without the host's launch between calls
    (how aiconfigurator's 16-bit tables were timed). CUDA only."""
    import torch

    side = torch.cuda.Stream(clock.device)
    side.wait_stream(torch.cuda.current_stream(clock.device))
    with torch.cuda.stream(side):  # warm-up off the capture, as graph capture requires
        for _ in range(clock.warmup):
            fn()
    torch.cuda.current_stream(clock.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize(clock.device)
    pairs = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(clock.device)
    return [s.elapsed_time(e) / inner for s, e in pairs]


def fastest_mean(times: list[float], keep: int) -> float:
    """Mean (ms) of the ``keep`` fastest of ``times`` (all of them when fewer)."""
    best = sorted(times)[:max(1, keep)]
    return sum(best) / len(best)


@dataclass(frozen=True)
class Launch:
    """One kernel a call launched: its name, grid and block (x, y, z), and the profiler's
    occupancy figures (warps and blocks per SM; 0 where it reports none)."""
    name: str
    grid: tuple = (1, 1, 1)
    block: tuple = (1, 1, 1)
    warps_per_sm: float = 0.0
    blocks_per_sm: float = 0.0
    dur_us: float = 0.0


def launches(fn, clock: Clock) -> list[Launch]:
    """The kernels one call of ``fn`` launches, in order. On the CPU, where nothing is launched,
    the top-level operators the call ran, each with a 1 x 1 x 1 grid."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # the first call may pick algorithms; profile a settled one
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if clock.cuda else [])
    with native_stderr_silenced(), profile(activities=activities) as prof:
        fn()
        if clock.cuda:
            import torch
            torch.cuda.synchronize(clock.device)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return _parse_events(events, clock.cuda)


@contextlib.contextmanager
def native_stderr_silenced():
    """File descriptor 2 sent to /dev/null for a moment: the profiler's C++ side writes a line
    at every start and stop (``USDT ... profiler_start``) that no Python setting turns off;
    over thousands of shapes they would bury the collector's own output. Python errors still
    raise."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _parse_events(events: list, cuda: bool) -> list[Launch]:
    """:class:`Launch` records from a chrome trace's events (kernels, or top CPU operators)."""
    if cuda:
        kern = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
        return [Launch(e["name"], tuple(e.get("args", {}).get("grid", (1, 1, 1))),
                       tuple(e.get("args", {}).get("block", (1, 1, 1))),
                       float(e.get("args", {}).get("warps per SM", 0) or 0),
                       float(e.get("args", {}).get("blocks per SM", 0) or 0),
                       float(e.get("dur", 0) or 0)) for e in kern]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"),
                 key=lambda e: e["ts"])
    top, end = [], -1.0
    for e in ops:  # keep operators not nested inside an earlier one
        if e["ts"] >= end:
            top.append(Launch(e["name"], dur_us=float(e.get("dur", 0) or 0)))
            end = e["ts"] + e.get("dur", 0)
    return top


def main_launch(found: list[Launch]) -> Launch:
    """The launch a row is named after: the longest (a GEMM's main kernel beside its split-K
    reduction or a layout copy); a no-launch call gives an ``unknown`` record."""
    return max(found, key=lambda x: x.dur_us) if found else Launch("unknown")
