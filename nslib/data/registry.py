"""One GPU registry over every data folder: the NeuSight data's datasheets, the 16-bit data's
(with ``Bf16FLOPs``) and KernelBench's, so any GPU ``nslib gpus`` lists is found by name.

A file stem found in several folders is one GPU: the first folder's figures, with the optional
figures it lacks (``Bf16FLOPs``, ``TDP``, ``Link_Bw``) filled from the others.
"""
from __future__ import annotations

import os
from dataclasses import replace

from nslib.data.gpus import (OPTIONAL_FIELDS, GPU, find_gpu, gpu_matches, load_gpu_file,
                             load_gpus, load_mixed_gpus_if_present)
from nslib.data.kernelbench import kernelbench_root
from nslib.data.paths import DataNotFoundError

__all__ = ["SOURCES", "load_kernelbench_gpus_if_present", "sources", "all_gpus", "find_any",
           "variant_of"]

# the data folders, in the order their datasheets are looked at (first wins for a stem)
SOURCES = ("neusight", "mixed", "kernelbench")


def load_kernelbench_gpus_if_present(root: str | os.PathLike | None = None) -> dict[str, GPU]:
    """The KernelBench data's datasheets keyed by file stem, or ``{}`` when it is absent."""
    try:
        folder = kernelbench_root(root) / "device_configs"
    except DataNotFoundError:
        return {}
    return {p.stem: load_gpu_file(p) for p in sorted(folder.glob("*.json"))}


def variant_of(gpus: dict[str, GPU]) -> dict[str, str]:
    """``{file stem: canonical stem}`` of each datasheet of one folder that shares its
    ``Device`` string with the canonical file without being it: a variant kept for one
    experiment (the NeuSight data's ``..._TP`` file: two GPUs as one). The canonical file is
    the one its Device string resolves to (:func:`nslib.data.gpus.gpu_matches`, the one rule),
    so a GPU name never resolves to a variant."""
    out = {}
    for k, g in gpus.items():
        hits = gpu_matches(g.name, gpus)
        if len(hits) == 1 and hits[0].key != k:
            out[k] = hits[0].key
    return out


def sources(data=None, require_neusight: bool = True) -> dict[str, dict[str, GPU]]:
    """``{folder: {file stem: GPU}}`` for :data:`SOURCES`; the 16-bit and KernelBench folders
    only when they are there. The NeuSight folder's absence raises its
    :class:`DataNotFoundError` (how to get it) unless ``require_neusight`` is False."""
    try:
        neusight = load_gpus(data)
    except DataNotFoundError:
        if require_neusight:
            raise
        neusight = {}
    return {"neusight": neusight, "mixed": load_mixed_gpus_if_present(),
            "kernelbench": load_kernelbench_gpus_if_present()}


def all_gpus(data=None) -> dict[str, GPU]:
    """Every datasheet of :func:`sources` as one dict keyed by file stem (see module doc).
    With no datasheet anywhere, the NeuSight folder's error says how to get the data."""
    return _merged(sources(data, require_neusight=False), data)


def _merged(found: dict[str, dict[str, GPU]], data=None) -> dict[str, GPU]:
    """The folders' datasheets of ``found`` (:func:`sources`) as one dict (see module doc)."""
    merged: dict[str, GPU] = {}
    for sheets in found.values():
        for stem, gpu in sheets.items():
            merged[stem] = _fill(merged[stem], gpu) if stem in merged else gpu
    if not merged:
        load_gpus(data)
    return merged


def _fill(first: GPU, other: GPU) -> GPU:
    """``first`` with the optional figures it lacks taken from ``other`` (the same GPU)."""
    return replace(first, **{f: getattr(other, f) for f, _ in OPTIONAL_FIELDS.values()
                             if getattr(first, f) is None and getattr(other, f) is not None})


def find_any(query: str, data=None) -> GPU:
    """The GPU ``query`` names (file stem, ``Device`` string or short alias, as
    :func:`nslib.data.gpus.find_gpu`) in :func:`all_gpus`. The folders are asked in the order
    of :data:`SOURCES`: an alias one folder resolves to one GPU is that GPU (``A100 80GB`` is
    the NeuSight data's, though KernelBench has an A100 80GB too); a KeyError lists the
    candidates when none does, or when the first folder that knows the name knows several
    GPUs by it (``A100``: a later folder's single match would be a guess)."""
    found = sources(data, require_neusight=False)   # every folder read once
    merged = _merged(found, data)
    for sheets in found.values():
        hits = gpu_matches(query, sheets)
        if len(hits) == 1:
            return merged[hits[0].key]
        if hits:
            break
    return find_gpu(query, merged)
