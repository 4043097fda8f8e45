"""What ``nslib predict`` and ``nslib serve`` share: help texts with their defaults, the GPU a
command line names (its errors naming the command's own options) and numbers for people."""
from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
import warnings
from pathlib import Path


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option's text with ``(default: X)`` where the option has a default
    worth saying (not None, False or suppressed) and its text does not say one already."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or re.search(r"\bdefault\b", text)):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def cli_gpu(value, file_option: str):
    """The GPU ``value`` names (a name, an alias or a datasheet JSON path:
    :func:`nslib.model.inputs.resolve_gpu`); an unknown name is a KeyError listing the known
    GPUs and saying that a datasheet file goes to ``file_option`` (e.g. ``--gpu-spec FILE``)."""
    from nslib.data.gpus import UnknownGPUError
    from nslib.model.inputs import resolve_gpu
    try:
        return resolve_gpu(value)
    except UnknownGPUError as e:
        raise e.hinted(f"pass a datasheet JSON file with {file_option}") from None


def tensor_sheets() -> dict:
    """``{file stem: GPU}`` of every datasheet in the data that gives ``Bf16FLOPs``, the
    tensor-core peak a 16-bit forecast needs."""
    from nslib.data.registry import all_gpus

    return {k: g for k, g in all_gpus().items() if g.bf16_gflops}


def print_warnings(lines) -> None:
    """Each distinct line once, in order, on stderr as ``warning: ...``."""
    for line in dict.fromkeys(lines):
        print(f"warning: {line}", file=sys.stderr)


def check_tensor_peak(spec, query, file_option: str, why: str) -> None:
    """ValueError unless datasheet ``spec`` (what ``query`` resolved to) has ``Bf16FLOPs``,
    which a 16-bit forecast needs (``why`` says which). The message names the datasheets that
    have it and answer to the same name words (``A100 80GB``: the NeuSight data's PCIe board
    has none, the 16-bit data's SXM4 board has one), else every one that has it."""
    from nslib.data.gpus import gpu_matches

    if spec.bf16_gflops is not None:
        return
    tensor = tensor_sheets()
    words = str(query) if not isinstance(query, Path) else ""
    near = sorted(g.key for g in gpu_matches(words, tensor)) if words else []
    named = (f"{' or '.join(near)} {'has' if len(near) == 1 else 'have'} it" if near else
             f"these have it: {', '.join(sorted(tensor))}")
    raise ValueError(f"GPU {spec.name!r} has no 'Bf16FLOPs' (dense tensor-core BF16 peak, "
                     f"GFLOP/s) in its datasheet, and {why}: {named} (--gpu NAME), or add it to "
                     f"a copy of the datasheet and pass that with {file_option}")


@contextlib.contextmanager
def warnings_as_lines():
    """Record every warning raised inside; at the end print each distinct one once on
    stderr as ``warning: ...``, without the library file and line (which tell a command-line
    user nothing): an evaluation over many GPUs repeats each datasheet-range note."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    print_warnings(str(w.message) for w in caught)


def fmt_fixed(v, decimals: int = 2) -> str:
    """A latency (ms) or rate for people: fixed notation with thousands separators, scientific
    only from ten million on (a figure that large is a scenario gone wrong, and its digits
    would not be read); ``n/a`` for a missing value (None or NaN)."""
    if v is None or math.isnan(float(v)):
        return "n/a"
    return f"{v:,.{decimals}f}" if abs(v) < 1e7 else f"{v:.3e}"


def fmt_count(v) -> str:
    """A count (kernels, tokens, requests) for people: a whole number, thousands separated."""
    return f"{int(round(float(v))):,}"


def power_hint(summary: dict) -> None:
    """On stderr, how much of the step the board's power bound sets, where it sets some
    (:func:`nslib.model.stream.power_bound`): the bound is the training GPUs' best FLOP per
    joule, so a board on a newer process may run those GEMMs faster."""
    from nslib.model.stream import power_note
    if summary.get("power_bound"):
        print(f"note: {power_note(summary['power_bound'])}", file=sys.stderr)


__all__ = ["DefaultsFormatter", "check_generates", "check_tensor_peak", "cli_gpu", "fmt_count",
           "fmt_fixed", "power_hint", "print_warnings", "tensor_sheets", "warnings_as_lines"]


def check_generates(model) -> None:
    """ValueError unless ``model`` is a causal LM: only generation keeps a KV cache."""
    from nslib.model.serving.steps import model_sizes
    info = model_sizes(model)
    if not info["causal_lm"]:
        raise ValueError(f"--kv-cache keeps the keys and values of token-by-token generation; "
                         f"this config builds {info['architecture']}, which does not generate "
                         f"so: drop --kv-cache")
