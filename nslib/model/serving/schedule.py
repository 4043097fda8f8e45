"""Aggregated continuous batching: TTFT, TPOT and throughput from the cost of iterations.

``concurrency`` clients each keep one request in flight (``isl`` prompt tokens, ``osl``
output tokens), as a benchmark run at fixed concurrency does. The engine holds at most as many
requests as its KV cache has room for (:func:`kv_capacity`); the others wait for a slot.
Two ways to schedule prompts beside decodes cover the three engines of the silicon sample
(:data:`FRAMEWORKS`, their documented defaults):

- **mixed** (vLLM V1, TensorRT-LLM in-flight batching): every iteration carries one token of
  each decoding request and as many prompt tokens as fit in the token budget. The schedule
  below sets TPOT and the cycle (throughput); TTFT comes from the range further down. Requests
  admitted together finish together and come back together (every request has the same
  lengths), so the ``running`` requests move in ``n = running / g`` groups of the ``g``
  prompts the room holds (``room`` = budget - decode tokens; a longer prompt is one group
  chunked over ``k = isl / room`` iterations). An engine that chunks prompts (vLLM) fills the
  room, ``g = room / isl`` (two 4k-token prompts share an 8k budget beside a few decodes, the
  second's last tokens riding in the next iteration); one that takes whole prompts only
  (TensorRT-LLM's default) admits ``floor(room / isl)``. A group's cycle is its ``k`` prompt
  iterations and ``osl - 1`` decode iterations, or ``n k`` iterations when the groups'
  prompts fill every iteration (prefill-bound: a group then waits for its turn). TPOT is a
  request's decode iterations: plain ones, and the share ``(n - 1) k / (osl - 1)`` that
  carries another group's prompts. A group's TTFT is the wait for its turn (its requests
  return at the end of an iteration and the next ones join the next, so nothing more), and
  its ``k`` prompt iterations.
- **prefill-first** (SGLang's default: no mixed chunks, prompts before decodes): requests
  that finish together come back together, so the running set moves in waves: its prompts run
  as budget-sized prefill batches back to back (``budget / isl`` prompts a batch when the
  engine chunks them, whole prompts only otherwise), then all decode together. A request's
  TTFT is the end of its prefill batch; the prefill batches after its own stall its decode, so
  ``TPOT = decode iteration + (later prefill batches) / (osl - 1)``, on average over the wave.

How the benchmark's requests arrive is not known to the forecast (clients in step, spread
out, or between), and TTFT moves with it; TPOT and throughput barely do. :func:`serve` gives
the two extremes: a request arriving alone into the steady decode load (half an iteration,
then its prompt beside the decodes, or as a batch of its own; still waiting its turn when
the prompts fill every iteration) and every running request arriving at once (their prompts
back to back in budget batches, the waves above). A prefill-first engine merges whatever
arrives into its waves, so its TTFT is the waves'. A mixed engine's TTFT lies between the
extremes by the arrival pattern; its forecast is their geometric mean, the point whose worst
log error over the range is least. Throughput is the schedule's cycle: the arrival pattern
moves how a request's time splits between TTFT and decode, not the GPU's work per request.

When the KV cache holds ``running < concurrency`` requests, a request waits for a slot: with
``R`` the time a running request takes, a closed loop of ``concurrency`` clients served
``running`` at a time waits ``R (concurrency / running - 1)`` on average (Little's law); that
wait is part of TTFT. Throughput: ``running / R`` requests per second on the ``tp`` GPUs.

An engine may also keep requests waiting when its KV cache has room (``Framework.waiting``).
TensorRT-LLM 1.0 does, as the silicon sample measured it: at a fixed concurrency (8-32),
prompt length and tensor-parallel degree, its mean TTFT grows with the output length by one
interval between completions, ``osl x TPOT / concurrency`` (the slope of TTFT against that
interval: median 0.97 over the sample's 36 such groups, 10-90% 0.84-1.18; vLLM's -0.02, its
TTFT flat in the output length). By Little's law a mean wait of one such interval is one
request always waiting, so the engine serves ``concurrency - 1`` at once and the same
queue term prices the wait. Why it waits (the engine's slot bookkeeping, the harness's
batch limit) the sample does not say; at concurrency 1 nothing waits.

Not modelled: prefix caching (the benchmark prompts are random), speculative decoding,
chunked-prefill attention over a prompt's earlier chunks (a prompt's attention is priced once,
over its whole length), preemption, request-rate (open-loop) arrivals, the HTTP front end.
Units: ms, tokens, bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nslib.data.units import GIB
from nslib.model.memory.step import framework_bytes
from nslib.model.serving.steps import PRICED_KEPT, StepCost


@dataclass(frozen=True)
class Framework:
    """A serving engine's scheduling defaults.

    ``token_budget``: most tokens one iteration carries (vLLM ``max_num_batched_tokens``,
    SGLang ``chunked_prefill_size``, TensorRT-LLM ``max_num_tokens``); ``mixed``: prompts share
    iterations with decodes; ``memory_fraction``: share of the GPU's memory the engine takes
    for weights and KV cache (``free_only``: of the memory left after the weights, as
    TensorRT-LLM's ``free_gpu_memory_fraction``); ``chunked``: prompts are cut to fill an
    iteration's budget (vLLM V1, SGLang), else an iteration takes whole prompts only
    (TensorRT-LLM without ``enable_chunked_prefill``); ``waiting``: requests of a closed
    loop that wait at the engine's door whatever its room (it serves at most
    ``concurrency - waiting`` at once, never fewer than one; module doc)."""

    name: str
    token_budget: int
    mixed: bool
    memory_fraction: float
    free_only: bool = False
    chunked: bool = True
    waiting: int = 0


# Documented defaults of the engine versions in the silicon sample (vLLM 0.12 online serving
# on GPUs of 70 GiB or more; SGLang 0.5 on 80-160 GB GPUs; TensorRT-LLM 1.0 trtllm-serve).
# TensorRT-LLM's one waiting request is measured, not documented (module doc).
FRAMEWORKS = {
    "vllm": Framework("vllm", 8192, True, 0.90),
    "sglang": Framework("sglang", 8192, False, 0.88),
    "trtllm": Framework("trtllm", 8192, True, 0.90, free_only=True, chunked=False,
                        waiting=1),
}


def framework(name) -> Framework:
    """A :class:`Framework` by name (``vllm``, ``sglang``, ``trtllm``) or as given."""
    if isinstance(name, Framework):
        return name
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    key = {"tensorrtllm": "trtllm"}.get(key, key)
    if key not in FRAMEWORKS:
        raise ValueError(f"unknown serving framework {name!r}; use one of "
                         f"{', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[key]


def waiting_note(fw) -> str:
    """What the engine's ``waiting`` requests mean for a forecast, in one line ("" when it
    keeps none)."""
    fw = framework(fw)
    if not fw.waiting:
        return ""
    return (f"{fw.name} serves all but {fw.waiting} of the requests in flight at once, the "
            "rest wait (their wait is in TTFT): measured at concurrency 8-32 on the silicon "
            "sample, extrapolated elsewhere")


def kv_capacity(cost: StepCost, fw: Framework) -> dict:
    """KV-cache room on one GPU: ``{kv_bytes, kv_tokens, weight_bytes, reserved_bytes,
    memory_bytes}`` (tokens over every layer; 0 when the weights do not fit)."""
    memory = float(cost.spec.mem_gb) * GIB
    weights = cost.weight_bytes()
    reserved, _ = framework_bytes(cost.spec, cost.setup.data)
    room = (memory - weights - reserved) * fw.memory_fraction if fw.free_only \
        else memory * fw.memory_fraction - weights - reserved
    room = max(room, 0.0)
    return {"kv_bytes": room, "kv_tokens": float(np.floor(room / cost.kv_bytes_per_token())),
            "weight_bytes": weights, "reserved_bytes": reserved, "memory_bytes": memory}


def no_fit(memory: dict, tokens: int) -> tuple[str, bool]:
    """(what does not fit, whether the weights alone are the problem) on one GPU whose
    :func:`kv_capacity` is ``memory``, for requests of ``tokens`` tokens (prompt and output):
    the weights and the framework's reserve fill the GPU, or the KV cache left beside them
    cannot hold one request. Sizes in GiB per GPU."""
    gib = 2 ** 30
    weights, total = memory["weight_bytes"] / gib, memory["memory_bytes"] / gib
    reserved = memory["reserved_bytes"] / gib
    if weights + reserved >= total:
        return (f"the weights take {weights:.1f} GiB per GPU and the framework "
                f"{reserved:.1f} GiB, on a {total:.0f} GiB GPU"), True
    return (f"beside {weights:.1f} GiB of weights per GPU, the KV cache "
            f"({int(round(memory['kv_tokens'])):,} tokens) cannot hold one request of "
            f"{int(tokens):,} tokens"), False


def serve(cost: StepCost, concurrency, isl, osl, fw="vllm") -> dict:
    """Forecast aggregated serving at each (``concurrency``, ``isl``, ``osl``) (arrays
    broadcast together): a dict of arrays ``ttft_ms``, ``tpot_ms``, ``latency_ms`` (a request
    from arrival to last token), ``running`` (requests served at once: what the KV cache
    holds, less the engine's ``waiting``), ``kv_bound`` (the KV cache sets ``running``),
    ``queue_ms`` (the wait for a slot, inside TTFT), ``tokens_per_s`` (output tokens per
    second, all GPUs), ``tokens_per_s_gpu`` (per GPU), ``fits`` (at least one request fits);
    ``ttft_lone_ms`` and ``ttft_burst_ms``: TTFT if a request arrived alone into the steady
    decode load, and if all running requests arrived at once (their prompts back to back,
    :func:`_waves`), with ``lone <= schedule's own TTFT <= burst`` (the range a benchmark's
    arrival pattern, which the schedule does not know, moves TTFT over; alone still waits its
    turn when the prompts fill every iteration). A mixed engine's ``ttft_ms`` is the geometric
    mean of the two, a prefill-first engine's its waves' (module doc). ``tokens_per_s`` and
    ``queue_ms`` come from the schedule's cycle (its own TTFT plus ``osl - 1`` TPOTs), the
    GPU's work per request, which the arrival pattern does not change; ``latency_ms`` is
    ``ttft_ms + (osl - 1) tpot_ms``.
    """
    fw = framework(fw)
    c, isl, osl = (np.asarray(v, float) for v in np.broadcast_arrays(concurrency, isl, osl))
    if (c < 1).any() or (isl < 1).any() or (osl < 1).any():
        raise ValueError("concurrency, isl and osl must be at least 1")
    # what the schedule prices never depends on the prices: collect it first, price it in
    # one call per kind, then run the schedule on the priced figures
    wanted = _Wanted(cost)
    with np.errstate(all="ignore"):
        _serve(wanted, fw, c, isl, osl)
    wanted.price()
    return _serve(cost, fw, c, isl, osl)


def _serve(cost, fw: Framework, c, isl, osl) -> dict:
    """:func:`serve` on validated arrays."""
    cap = kv_capacity(cost, fw)
    fits_one = np.floor(cap["kv_tokens"] / (isl + osl))
    # the clients the engine serves at once: what the KV cache holds, less the requests
    # the engine keeps waiting (one client is always served)
    served = np.maximum(c - fw.waiting, 1.0)
    running = np.clip(fits_one, 1.0, served)
    out = (_mixed if fw.mixed else _waves)(cost, fw, running, isl, osl)
    # the arrival patterns the schedule assumes nothing about: one request alone into the
    # steady decode load, and every running request at once (their prompts back to back)
    burst = _waves(cost, fw, running, isl, osl)["ttft_ms"] if fw.mixed else out["ttft_ms"]
    # alone still waits its turn when the prompts fill every iteration (prefill-bound: that
    # wait is the GPU's capacity, whatever the arrivals)
    lone = np.minimum(_lone(cost, fw, running, isl, osl) + out.get("turn_ms", 0.0),
                      out["ttft_ms"])
    burst = np.maximum(burst, out["ttft_ms"])
    # one request at a time: arriving alone and all at once are the same arrival
    single = running <= 1.0
    lone, burst = (np.where(single, out["ttft_ms"], v) for v in (lone, burst))
    # a prefill-first engine merges whatever arrives into its waves, so its schedule is its
    # TTFT; a mixed engine's TTFT lies in [lone, burst] by an arrival pattern nobody
    # recorded: the log-midpoint is the point of least worst-case log error over that range
    ttft = np.sqrt(lone * burst) if fw.mixed else out["ttft_ms"]
    # throughput is the GPU's work per cycle, which the arrival pattern does not change: the
    # schedule's cycle sets it and the wait for a KV slot, whatever the TTFT's share of it
    cycle = out["ttft_ms"] + (osl - 1) * out["tpot_ms"]
    queue = cycle * (c / running - 1.0)
    rate = running / cycle * 1000.0        # requests per second
    return {"ttft_ms": ttft + queue, "tpot_ms": out["tpot_ms"],
            "ttft_lone_ms": lone + queue, "ttft_burst_ms": burst + queue,
            "latency_ms": ttft + queue + (osl - 1) * out["tpot_ms"], "running": running,
            "queue_ms": queue,
            "tokens_per_s": rate * osl, "tokens_per_s_gpu": rate * osl / cost.setup.tp,
            "fits": fits_one >= 1, "kv_bound": fits_one < served,
            "kv_tokens": np.full(c.shape, cap["kv_tokens"])}


class _Wanted:
    """Stands in for a cost to collect every iteration and attention group a schedule asks
    for (zeros returned), so that :meth:`price` prices them in one predictor call each."""

    def __init__(self, cost):
        self.cost, self.tokens, self.groups = cost, [], []

    def __getattr__(self, name):
        return getattr(self.cost, name)

    def tokens_ms(self, tokens, logits) -> np.ndarray:
        t, n = np.broadcast_arrays(np.asarray(tokens, float), np.asarray(logits, float))
        self.tokens.append((t.ravel(), n.ravel()))
        return np.zeros(t.shape)

    def attention_ms(self, phase, batch, q_len, kv_len) -> np.ndarray:
        arrays = np.broadcast_arrays(np.asarray(phase),
                                     *(np.asarray(v, float) for v in (batch, q_len, kv_len)))
        self.groups.append([a.ravel() for a in arrays])
        return np.zeros(arrays[1].shape)

    def price(self) -> None:
        """Price what was asked on the cost that keeps its prices (a scaled cost's base)."""
        base = getattr(self.cost, "cost", self.cost)
        # a cost without memos, or a sweep larger than they keep, is priced call by call
        if self.tokens and hasattr(base, "_priced"):
            tokens = [np.concatenate(col) for col in zip(*self.tokens)]
            if len(tokens[0]) <= PRICED_KEPT:
                base.token_parts(*tokens)
        if self.groups and hasattr(base, "_attended"):
            groups = [np.concatenate(col) for col in zip(*self.groups)]
            if len(groups[0]) <= PRICED_KEPT:
                base.attention_ms(*groups)


def _mixed(cost: StepCost, fw: Framework, running, isl, osl) -> dict:
    budget, d = float(fw.token_budget), osl - 1.0      # d: a request's decode iterations
    cycle = d + 1.0
    for _ in range(4):  # the decode load, the room and the cycle depend on each other
        decode = running * d / cycle                    # decode tokens per iteration
        room = np.maximum(budget - decode, 1.0)
        k = np.maximum(1.0, isl / room)                 # iterations of one group's prompts
        group = np.clip(_prompts_in(fw, room, isl), 1.0, running)
        groups = running / group
        # a group's cycle: its prompts, its decodes, and, when the groups' prompts fill
        # every iteration (prefill-bound), its wait for its turn
        cycle = np.maximum(d + k, groups * k)
    carrying = np.minimum(1.0, groups * k / cycle)     # iterations carrying some prompts
    seen = np.minimum(1.0, (groups - 1.0) * k / np.maximum(d, 1.0))   # of one's decodes
    others = decode * (groups - 1.0) / groups           # decodes beside a group's prompts
    ctx = isl + osl / 2.0
    plain = (cost.tokens_ms(np.ceil(decode), np.ceil(decode)) +
             cost.attention_ms("decode", np.ceil(decode), 1, ctx))
    carry = (cost.tokens_ms(np.ceil(others + group * isl / k), np.ceil(others + group)) +
             cost.attention_ms("decode", np.ceil(others), 1, ctx) +
             _prompts_attention(cost, group, isl) / k)
    mean = (1.0 - carrying) * plain + carrying * carry
    # a group's requests return at the end of the iteration that gave their last tokens, and
    # the closed loop sends the next ones at once: they join the next iteration, or wait for
    # their prompts' turn when prefill-bound (the cycle is then the GPU's work)
    turn = (cycle - d - k) * mean
    return {"ttft_ms": turn + k * carry, "tpot_ms": (1.0 - seen) * plain + seen * carry,
            "turn_ms": turn}


def _waves(cost: StepCost, fw: Framework, running, isl, osl) -> dict:
    budget = float(fw.token_budget)
    # prompts per prefill batch (chunked: the batch fills the budget, a prompt's first token
    # coming with its last chunk)
    per = np.maximum(_prompts_in(fw, budget, isl), 1.0)
    n_batches = np.ceil(running / per)
    full = (cost.tokens_ms(np.minimum(per * isl, np.maximum(budget, isl)), per) +
            _prompts_attention(cost, per, isl))
    last_n = running - per * (n_batches - 1)
    last = (cost.tokens_ms(last_n * isl, last_n) + _prompts_attention(cost, last_n, isl))
    # request i of batch b gets its first token when batch b ends
    ends_full = full * (n_batches - 1) * n_batches / 2.0   # sum of full batches' end times
    ttft = (per * ends_full + last_n * (full * (n_batches - 1) + last)) / running
    wave_prefill = full * (n_batches - 1) + last
    dec = (cost.tokens_ms(running, running) +
           cost.attention_ms("decode", running, 1, isl + osl / 2.0))
    stall = np.where(osl > 1, (wave_prefill - ttft) / np.maximum(osl - 1.0, 1.0), 0.0)
    return {"ttft_ms": ttft, "tpot_ms": dec + stall}


def _lone(cost: StepCost, fw: Framework, running, isl, osl) -> np.ndarray:
    """TTFT (ms) of a request arriving alone while the other ``running - 1`` decode: half an
    iteration (it arrives mid-way; none when nothing else runs), then its prompt: beside the
    decodes in a mixed engine (chunked over ``isl / room`` iterations), as a prefill batch of
    its own otherwise."""
    others = np.maximum(running - 1.0, 0.0)
    ctx, one = isl + osl / 2.0, np.ones_like(isl)
    plain = np.where(others > 0, cost.tokens_ms(np.maximum(others, 1.0),
                                                np.maximum(others, 1.0)) +
                     cost.attention_ms("decode", others, 1, ctx), 0.0)
    if not fw.mixed:
        return 0.5 * plain + cost.tokens_ms(isl, one) + _prompts_attention(cost, one, isl)
    k = np.maximum(1.0, isl / np.maximum(float(fw.token_budget) - others, 1.0))
    carry = (cost.tokens_ms(np.ceil(others + isl / k), others + 1.0) +
             cost.attention_ms("decode", others, 1, ctx) + _prompts_attention(cost, one, isl) / k)
    return 0.5 * plain + k * carry


def _prompts_in(fw: Framework, tokens, isl):
    """Prompts of ``isl`` tokens that ``tokens`` of an iteration hold: a fraction when the
    engine chunks prompts (the last one's rest rides in the next iteration), whole ones
    otherwise."""
    return tokens / isl if fw.chunked else np.floor(tokens / isl)


def _prompts_attention(cost: StepCost, prompts, isl) -> np.ndarray:
    """Prefill attention (ms) of ``prompts`` prompts of ``isl`` tokens, a fraction of a prompt
    (its chunk) at its share of a whole prompt's: the attention kernel is priced per whole
    request, so ``1.4`` prompts are ``1.4 / 2`` of two."""
    prompts = np.asarray(prompts, float)
    whole = np.maximum(np.ceil(prompts), 1.0)
    return cost.attention_ms("prefill", whole, isl, isl) * prompts / whole
