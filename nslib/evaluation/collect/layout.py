"""Where a collection's files go: the layouts nslib's readers already read.

An output folder ``OUT`` holds two data roots and a provenance record:

- ``OUT/neusight``: a NeuSight data root (``NSLIB_DATA``) with the GPU's datasheet
  (``data/device_configs/<stem>.json``), its FP32 kernels in the test-split CSVs
  (``data/dataset/test/{bmm,linear,elem,softmax,ln}.csv``, NeuSight's columns) and its model steps
  as labels (``label/<stem>/<model>-<inf|train>-<seq>-<batch>[-bf16].json``);
- ``OUT/mixed``: a 16-bit data root (``NSLIB_MIXED``) with the datasheet and the BF16 GEMM and
  attention tables in aiconfigurator's parquet layout (``aiconfigurator/.../systems/data/<slug>/
  {gemm,attention}/torch/<torch version>/*.parquet``);
- ``OUT/provenance.json``: versions, clocks, protocol, budget and row counts.

Each table is rewritten whole through a temporary file and a rename after every chunk of rows
(:func:`append_rows`), so an interrupted run keeps every chunk it finished, and a rerun into the
same folder skips the rows already there (:func:`done_keys`). :func:`merge_into` drops a
collection into a copy of the data.
"""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import pandas as pd

from nslib.data.mixed_data import AIC_SYSTEMS
from nslib.data.paths import ASPLOS, atomic_write_bytes, atomic_write_text
from nslib.kernels.measured import TEST_FILES

NEUSIGHT, MIXED = "neusight", "mixed"
GEMM_COLUMNS = ["OPName", "Latency", "Device", "Torch Version", "CUDNN Version", "Kernel Name",
                "Warps per SM", "Blocks per SM", "Grid x", "Grid y", "Grid z", "Block x",
                "Block y", "Block z", "CUDA Version", "Kernels", "B", "M", "N", "K"]
VEC_COLUMNS = GEMM_COLUMNS[:15] + ["B", "H", "large"]


def stem(device: str) -> str:
    """The datasheet file stem (and label folder) of a Device name, as in the NeuSight data."""
    return device.strip().replace(" ", "_")


def slug(device: str) -> str:
    """aiconfigurator's per-GPU folder name: lower case, words joined by ``_``."""
    return "_".join("".join(c if c.isalnum() else " " for c in device.lower()).split())


def asplos(out: Path) -> Path:
    return Path(out) / NEUSIGHT / ASPLOS


def kernel_csv(out: Path, cls: str) -> Path:
    """The test-split CSV of FP32 kernel class ``cls``."""
    return asplos(out) / "data" / "dataset" / "test" / TEST_FILES[cls]


def label_json(out: Path, device: str, tag: str) -> Path:
    return asplos(out) / "label" / stem(device) / f"{tag}.json"


def datasheet_paths(out: Path, device: str) -> list[Path]:
    """The datasheet's places: the NeuSight root's device_configs and the 16-bit root's."""
    name = f"{stem(device)}.json"
    return [asplos(out) / "data" / "device_configs" / name,
            Path(out) / MIXED / "device_configs" / name]


def tensor_table(out: Path, device: str, kind: str, torch_version: str) -> Path:
    """The parquet file of a 16-bit table: ``gemm_perf``, ``context_attention_perf`` or
    ``generation_attention_perf``."""
    folder = "gemm" if kind == "gemm_perf" else "attention"
    return (Path(out) / MIXED / AIC_SYSTEMS / "data" / slug(device) / folder / "torch" /
            torch_version / f"{kind}.parquet")


def read_rows(path: Path) -> pd.DataFrame:
    """The rows already written to ``path`` (CSV or parquet), empty when there are none."""
    if not path.is_file():
        return pd.DataFrame()
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def done_keys(path: Path, columns: list[str]) -> set[tuple]:
    """The ``columns`` values of the rows already in ``path`` (what a rerun skips)."""
    old = read_rows(path)
    if old.empty or not set(columns) <= set(old.columns):
        return set()
    return set(old[columns].astype(str).itertuples(index=False, name=None))


def append_rows(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    """Add ``rows`` to the table at ``path``, rewriting it atomically (never half-written)."""
    if not rows:
        return
    new = pd.DataFrame(rows, columns=columns)
    frame = pd.concat([read_rows(path), new], ignore_index=True)
    if path.suffix == ".parquet":
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        atomic_write_bytes(path, buf.getvalue())
    else:
        atomic_write_text(path, frame.to_csv(index=False))


def append_split(rows: list[dict], field: str, targets: dict) -> None:
    """Append each row, ``field`` dropped, to the table of its ``field`` value: ``targets`` maps
    a value to ``(path, columns or None)``."""
    for value, (path, columns) in targets.items():
        mine = [{k: v for k, v in r.items() if k != field} for r in rows if r[field] == value]
        append_rows(path, mine, columns)


def merge_into(collected: Path, copy: Path) -> list[Path]:
    """Drop a collection into a copy of the data (``copy`` holds ``neusight/`` and ``mixed/``
    roots, or is passed as one of them with the other beside it). Test-split CSVs are joined
    (rows of the collected GPUs replace any the copy had for them); every other file is new to
    the copy (its own GPU's folder or datasheet) and is copied. Returns the files written."""
    written = []
    for src in sorted(p for p in Path(collected).rglob("*") if p.is_file()):
        rel = src.relative_to(collected)
        if rel.parts[0] not in (NEUSIGHT, MIXED):
            continue  # provenance stays with the collection
        dst = Path(copy) / rel
        if src.suffix == ".csv" and "test" in rel.parts and dst.is_file():
            new = pd.read_csv(src)
            old = pd.read_csv(dst)
            old = old[~old["Device"].isin(set(new["Device"]))]
            atomic_write_text(dst, pd.concat([old, new], ignore_index=True).to_csv(index=False))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        written.append(dst)
    return written
