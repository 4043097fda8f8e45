"""Whole-model steps as labels: one inference (forward under ``no_grad``, eval mode) or training
step (forward, the summed logits as the loss, backward into gradients that already exist) of a
model built from its config on the device, as nslib's tracer builds and runs it
(:func:`nslib.model.config.build_model`, :func:`nslib.model.trace.logits_loss`).

Protocol, as the NeuSight labels record theirs: warm-up steps, then up to ``runs`` timed steps
(fewer when the part's time runs out), and the mean of the ``keep`` fastest, forward and
backward timed apart. Weights are random (timing does not depend on their values).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from nslib.data.paths import atomic_write_text
from nslib.data.serving_sample import model_configs
from nslib.evaluation.collect import layout
from nslib.evaluation.collect.timing import fastest_mean
from nslib.model.config import MEASURED_ARCHITECTURE, build_model, hf_config, load_model_config
from nslib.model.trace import logits_loss

# (model, mode, seq, batch, dtype): configurations the paper measured on its GPUs (their labels
# name them), and one modern 16-bit model
DEFAULT_STEPS = ("bert_large:inf:512:8", "bert_large:train:512:2", "gpt2_large:inf:1024:4",
                 "gpt2_large:train:1024:1", "opt_13:inf:2048:2", "gpt3_xl:train:2048:1",
                 "gpt3_27:inf:2048:2", "llama3.1_8b:inf:2048:1:bf16")


@dataclass(frozen=True)
class Step:
    """One model step to measure; ``model`` a config name or JSON path."""
    model: str
    mode: str
    seq: int
    batch: int
    dtype: str = "fp32"

    @property
    def tag(self) -> str:
        """The label name: ``<model>-<mode>-<seq>-<batch>``, ``-bf16`` for 16-bit steps."""
        name = self.model.rsplit("/", 1)[-1].removesuffix(".json")
        return f"{name}-{self.mode}-{self.seq}-{self.batch}" + (
            "" if self.dtype == "fp32" else f"-{self.dtype}")


def parse_step(spec: str) -> Step:
    """``name:mode:seq:batch[:dtype]`` -> :class:`Step`; ValueError naming the format."""
    parts = spec.split(":")
    try:
        if len(parts) not in (4, 5) or parts[1] not in ("inf", "train"):
            raise ValueError
        return Step(parts[0], parts[1], int(parts[2]), int(parts[3]),
                    parts[4] if len(parts) == 5 else "fp32")
    except ValueError:
        raise ValueError(f"model step {spec!r} is not name:inf|train:seq:batch[:bf16|fp16], "
                         "e.g. gpt2_large:inf:1024:4") from None


def config_source(model: str) -> str:
    """What :func:`nslib.model.config.load_model_config` should read for ``model``: the config
    that ships with nslib when it names one (by HuggingFace id or file stem), else ``model``."""
    known = {k: p for p in model_configs().values() for k in (p.stem, str(p))}
    known.update(model_configs())
    return str(known.get(model, model))


def _build(step: Step, device: str, data):
    """(model on ``device`` with random weights, its inputs, layer count)."""
    import torch

    config = load_model_config(config_source(step.model), data)
    arch = MEASURED_ARCHITECTURE.get((config.get("model_type"), step.mode))
    hf, meta = build_model(config, arch, step.dtype)  # the class the tracer runs
    dtype = next(p.dtype for p in meta.parameters())
    attn = "eager" if step.dtype == "fp32" else "sdpa"
    with torch.device(device):
        model = type(meta)._from_config(hf_config(config), attn_implementation=attn, dtype=dtype)
    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        raise ValueError(f"{step.tag}: only token models are measured here")
    ids = torch.zeros(step.batch, step.seq, dtype=torch.long, device=device)
    inputs = {"input_ids": ids}
    if getattr(hf, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    layers = next((getattr(hf, k) for k in ("num_hidden_layers", "n_layer", "num_layers")
                   if isinstance(getattr(hf, k, None), int)), 0)
    return model, inputs, layers


def _stamp(clock):
    """A function recording a point in time on the device (an event), and one reading two
    points' distance in ms."""
    import torch

    if clock.cuda:
        def mark():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return mark, lambda a, b: a.elapsed_time(b)
    return time.perf_counter, lambda a, b: (b - a) * 1e3


class OverBudget(Exception):
    """A step whose first run says its runs would outlast the time left to the part."""


def measure_step(step: Step, clock, deadline: float, data=None, runs: int = 10,
                 keep: int = 5) -> dict:
    """The label dict of one step (``e2e_latency``, ``fw_latency``, ``bwall_latency`` in ms,
    ``num_layer``, and the runs timed). :class:`OverBudget` when the first run shows that the
    warm-up and two timed runs, the least a label needs, would end past ``deadline``."""
    import torch

    model, inputs, layers = _build(step, clock.device, data)
    train = step.mode == "train"
    model.train(train)
    if train:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    mark, ms = _stamp(clock)
    fw, bw = [], []
    start = time.monotonic()
    for i in range(clock.warmup + runs):
        if i >= clock.warmup + 2 and time.monotonic() > deadline:
            break
        if i == 1:
            now = time.monotonic()
            if now + (now - start) * (clock.warmup + 1) > deadline:
                raise OverBudget(f"one run took {now - start:.1f} s: its "
                                 f"{clock.warmup + 2} runs would outlast the time budget")
        a = mark()
        if train:
            loss = logits_loss(model(**inputs))
            b = mark()
            loss.backward()
        else:
            with torch.no_grad():
                model(**inputs)
            b = mark()
        c = mark()
        if clock.cuda:
            torch.cuda.synchronize(clock.device)
        if i >= clock.warmup:
            fw.append(ms(a, b))
            bw.append(ms(b, c) if train else 0.0)
    e2e = [f + b for f, b in zip(fw, bw)]
    best = sorted(range(len(e2e)), key=e2e.__getitem__)[:keep]
    del model, inputs
    if clock.cuda:
        torch.cuda.empty_cache()
    return {"num_layer": layers, "e2e_latency": fastest_mean(e2e, keep),
            "fw_latency": sum(fw[i] for i in best) / len(best),
            "bwall_latency": sum(bw[i] for i in best) / len(best), "runs_timed": len(e2e),
            "kept_fastest": len(best), "dtype": step.dtype}


def measure_steps(steps: list[Step], clock, out, device_name: str, deadline: float,
                  data=None, progress: bool = True) -> dict:
    """Measure each step not yet labelled in ``out``, writing its label as it finishes;
    returns ``{"rows": n, "skipped": {tag: reason}, "seconds": s}``."""
    from tqdm.auto import tqdm

    t0, done, skipped = time.monotonic(), 0, {}
    for step in tqdm(steps, desc="model steps", disable=not progress):
        path = layout.label_json(out, device_name, step.tag)
        if path.is_file():
            continue
        if time.monotonic() >= deadline:
            skipped[step.tag] = "time budget spent"
            continue
        try:
            label = measure_step(step, clock, deadline, data)
        except OverBudget as e:
            skipped[step.tag] = str(e)
            continue
        except Exception as e:  # noqa: BLE001 - one model's failure must not stop the others
            import torch
            if clock.cuda:
                torch.cuda.empty_cache()
            skipped[step.tag] = f"{type(e).__name__}: {e}"[:300]
            continue
        atomic_write_text(path, json.dumps(label, indent=2))
        done += 1
    return {"rows": done, "skipped": skipped, "seconds": round(time.monotonic() - t0, 1)}
