"""GPU datasheets: a frozen dataclass, loaded from NeuSight's device JSON files and validated."""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from nslib.data.checks import check_float, check_int
from nslib.data.paths import DataNotFoundError, data_root, mixed_root, require

# NeuSight JSON key -> (dataclass field, description with unit)
FIELDS = {
    "Dev_Mem": ("mem_gb", "device memory, GB"),
    "Mem_Bw": ("mem_bw", "memory bandwidth, GB/s"),
    "Num_Sm": ("num_sm", "streaming multiprocessors"),
    "Core_Per_SM": ("cores_per_sm", "FP32 cores per SM"),
    "Freq": ("clock_mhz", "boost clock, MHz"),
    "SingleFLOPs": ("peak_gflops", "FP32 peak, GFLOP/s"),
    "L2Cache": ("l2_mb", "L2 cache, MB"),
}
# Optional vendor-datasheet figures; datasheets without them load (the field is then None).
# Bf16FLOPs: dense tensor-core BF16 peak (FP16 runs at the same rate on the GPUs in the data);
# a 16-bit prediction asks for it by name (GPU.bf16_peak). TDP: maximum board power. Link_Bw:
# GPU-to-GPU link bandwidth counting both directions (NVLink of SXM parts, else PCIe x16).
OPTIONAL_FIELDS = {
    "Bf16FLOPs": ("bf16_gflops", "dense tensor-core BF16 peak, GFLOP/s"),
    "TDP": ("tdp_w", "maximum board power, W"),
    "Link_Bw": ("link_gbps", "GPU-to-GPU link bandwidth, GB/s both directions"),
}
INT_FIELDS = ("Num_Sm", "Core_Per_SM")  # counts: 0.5 SMs is a typo, not a GPU


@dataclass(frozen=True)
class GPU:
    """One GPU's datasheet. ``name`` is the ``Device`` string profilers report."""

    name: str
    mem_gb: float       # GB
    mem_bw: float       # GB/s
    num_sm: int
    cores_per_sm: int
    clock_mhz: float    # MHz
    peak_gflops: float  # FP32 GFLOP/s
    l2_mb: float        # MB
    key: str = ""       # file stem, e.g. NVIDIA_H100_80GB_HBM3 (also the label folder name)
    bf16_gflops: float | None = None  # dense tensor-core BF16 GFLOP/s; None if not given
    tdp_w: float | None = None        # maximum board power, W; None if not given
    link_gbps: float | None = None    # GPU-to-GPU link, GB/s both directions; None if not given

    def bf16_peak(self) -> float:
        """Dense tensor-core BF16/FP16 peak, GFLOP/s; a clear error when the datasheet lacks it."""
        if self.bf16_gflops is None:
            raise ValueError(f"GPU {self.name!r} has no 'Bf16FLOPs' (dense tensor-core BF16 "
                             "peak, GFLOP/s) in its datasheet; a 16-bit prediction needs it: "
                             "add it to the JSON file, or predict in fp32")
        return self.bf16_gflops

    def columns(self) -> dict:
        """The datasheet as the kernel-frame GPU columns (see nslib.kernels.sizes.GPU_COLS)."""
        return {"gpu": self.name, "num_sm": float(self.num_sm), "peak_gflops": self.peak_gflops,
                "mem_bw": self.mem_bw, "mem_gb": self.mem_gb, "l2_mb": self.l2_mb}

    def to_json(self) -> dict:
        """The datasheet in NeuSight's JSON format, optional keys (``Bf16FLOPs``, ``TDP``,
        ``Link_Bw``) only when given (round-trips through :func:`gpu_from_dict`)."""
        d = asdict(self)
        out = {"Device": self.name, **{k: d[f] for k, (f, _) in FIELDS.items()}}
        out.update({k: d[f] for k, (f, _) in OPTIONAL_FIELDS.items() if d[f] is not None})
        return out


def gpu_from_dict(raw: dict, source: str = "<dict>", key: str = "") -> GPU:
    """Validate a NeuSight-format dict and build a :class:`GPU`.

    The keys of :data:`OPTIONAL_FIELDS` (``Bf16FLOPs``, ``TDP``, ``Link_Bw``) may be absent or
    ``null``. Raises ValueError naming ``source`` and the field when a required key is missing,
    a value is not a finite number (JSON ``NaN``/``Infinity`` included), a count is not a whole
    number, or a value is zero or negative.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a GPU spec must be a JSON object with keys Device, "
                         f"{', '.join(FIELDS)}")
    name = raw.get("Device")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{source}: field 'Device' (the GPU's name) is missing or empty")
    vals = {}
    for k, (field, desc) in FIELDS.items():
        if k not in raw:
            raise ValueError(f"{source}: field '{k}' ({desc}) is missing")
        try:
            if k in INT_FIELDS:
                vals[field] = check_int(f"field '{k}' ({desc})", raw[k], minimum=1)
            else:
                vals[field] = check_float(f"field '{k}' ({desc})", raw[k], positive=True)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
    for k, (field, desc) in OPTIONAL_FIELDS.items():
        if raw.get(k) is not None:
            try:
                vals[field] = check_float(f"field '{k}' ({desc})", raw[k], positive=True)
            except ValueError as e:
                raise ValueError(f"{source}: {e}; fix the value, or drop the key (it is "
                                 "optional)") from None
    return GPU(name=name.strip(), key=key or _stem(name), **vals)


def _stem(name: str) -> str:
    return name.strip().replace(" ", "_")


def load_gpu_file(path: str | os.PathLike) -> GPU:
    """Load one NeuSight device JSON file (errors name the file)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"GPU spec {path} is a directory, not a file: pass a datasheet JSON "
                         "file (see `nslib gpus --json` for the format)")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"GPU spec file not found: {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file; a GPU spec is a JSON file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); fix the file") from None
    return gpu_from_dict(raw, source=str(path), key=path.stem)


def load_gpus(data: str | os.PathLike | None = None) -> dict[str, GPU]:
    """Every GPU in ``data/device_configs``, keyed by file stem, in sorted order."""
    folder = require(data_root(data) / "data" / "device_configs", "GPU configs folder")
    return {p.stem: load_gpu_file(p) for p in sorted(folder.glob("*.json"))}


def load_mixed_gpus_if_present(mixed: str | os.PathLike | None = None) -> dict[str, GPU]:
    """:func:`load_mixed_gpus`, or ``{}`` when the 16-bit data is not there (an FP32-only
    set-up: listings and the explorer then offer the NeuSight datasheets alone)."""
    try:
        return load_mixed_gpus(mixed)
    except DataNotFoundError:
        return {}


def load_mixed_gpus(mixed: str | os.PathLike | None = None) -> dict[str, GPU]:
    """Every datasheet in the 16-bit data's ``device_configs`` (see :func:`paths.mixed_root`),
    keyed by file stem, in sorted order; measured or not (a datasheet alone can be predicted)."""
    folder = mixed_root(mixed) / "device_configs"
    return {p.stem: load_gpu_file(p) for p in sorted(folder.glob("*.json"))}


def listing_table(rows: list[dict]) -> str:
    """The ``nslib gpus`` table: ``rows`` (``key``, ``data`` and the :meth:`GPU.to_json` keys),
    one line per GPU. Every optional figure (``Bf16FLOPs`` GFLOP/s, ``TDP`` W, ``Link_Bw`` GB/s)
    is a column even when no datasheet gives it, ``-`` where a datasheet lacks it."""
    import pandas as pd
    if not rows:
        return "(no GPU datasheets)"
    frame = pd.DataFrame(rows).set_index("key")
    known = [c for c in ("data", "Device", *FIELDS) if c in frame.columns] + list(OPTIONAL_FIELDS)
    frame = frame.reindex(columns=known + [c for c in frame.columns if c not in known])
    return frame.to_string(na_rep="-")


def norm_name(s: str) -> str:
    """A GPU name folded for matching: lower case, runs of spaces, underscores, dashes -> one space."""
    return re.sub(r"[\s_\-]+", " ", s.strip().lower())


def gpu_matches(query: str, gpus: dict[str, GPU]) -> list[GPU]:
    """The GPUs of ``gpus`` that ``query`` names: its file stem, its ``Device`` string, or
    whole words of the Device string (``H100``, ``A100 80GB``). When several files share a
    Device string (variants such as ``..._TP``), only the canonical one (stem = Device string)
    is returned. One GPU is a match, none or several are for the caller to report."""
    if query in gpus:
        return [gpus[query]]
    q = norm_name(query)
    exact = [g for g in gpus.values() if norm_name(g.name) == q or norm_name(g.key) == q]
    if not exact:
        words = q.split()
        exact = [g for g in gpus.values()
                 if all(re.search(rf"(^| ){re.escape(w)}( |$)", norm_name(g.name)) for w in words)]
    canon = [g for g in exact if g.key == _stem(g.name)]
    hits = canon or exact
    return hits[:1] if len({g.key for g in hits}) == 1 else hits


class UnknownGPUError(KeyError):
    """A GPU name no datasheet answers to: the message lists the ``known`` GPUs and ends with
    ``hint``, where else a GPU can come from (a command line names its own option:
    :meth:`hinted`)."""

    def __init__(self, query: str, known: str, hint: str = "pass a GPU datasheet JSON file"):
        self.query, self.known = query, known
        super().__init__(f"unknown GPU {query!r}; known GPUs: {known} (or {hint})")

    def hinted(self, hint: str) -> "UnknownGPUError":
        """The same error, its last words ``hint``."""
        return UnknownGPUError(self.query, self.known, hint)


def find_gpu(query: str, gpus: dict[str, GPU]) -> GPU:
    """Look a GPU up by file stem, ``Device`` string or an unambiguous short alias
    (:func:`gpu_matches`); an unknown or ambiguous name is a KeyError listing the candidates."""
    hits = gpu_matches(query, gpus)
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UnknownGPUError(query, ", ".join(sorted(gpus)))
    raise KeyError(f"GPU {query!r} is ambiguous: {', '.join(sorted(g.key for g in hits))}; "
                   "use a longer name")
