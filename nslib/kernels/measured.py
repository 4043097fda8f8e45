"""Tidy kernel tables built from the NeuSight measurements, cached by content.

``kernel_table(cls, split)`` returns one row per measured kernel with dims, op name, measured
latency (``latency_ms``), kernel name, launch grid, the GPU's datasheet columns, the tile parsed
from the kernel name (GEMMs) or launch grid (elementwise), and the derived columns of
:func:`nslib.kernels.sizes.add_features`. Splits are by GPU and come from the data itself:
the training split is ``train/collect/<op>/<version>/<GPU>.csv``, the test split
``test/<class>.csv``.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from nslib.data.cache import JSON, cached
from nslib.data.gpus import GPU, find_gpu, load_gpus
from nslib.data.paths import DataNotFoundError, data_root, hash_files, require
from nslib.kernels import sizes

SCHEMA_VERSION = 5  # bump when the built tables change shape or meaning
TEST_FILES = {"bmm": "bmm.csv", "linear": "linear.csv", "elementwise": "elem.csv",
              "softmax": "softmax.csv", "layernorm": "ln.csv"}
SPLITS = ("train", "test")
GEMM_DIMS, VEC_DIMS = ["B", "M", "N", "K"], ["B", "H"]
RENAME = {"OPName": "op", "Latency": "latency_ms", "Device": "gpu", "Kernel Name": "kernel_name",
          "Grid x": "grid_x", "Grid y": "grid_y", "Grid z": "grid_z"}


def _dataset(data) -> Path:
    return require(data_root(data) / "data" / "dataset", "kernel dataset folder")


def source_files(cls: str, split: str, data=None) -> list[Path]:
    """The CSV files a table is built from (sorted), raising a clear error when none exist."""
    if cls not in sizes.CLASSES:
        raise ValueError(f"unknown kernel class {cls!r}; known: {sizes.CLASSES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {SPLITS}")
    root = _dataset(data)
    if split == "test":
        return [require(root / "test" / TEST_FILES[cls], f"{cls} test kernels")]
    ops = [op for op, (c, _, _) in sizes.OPS.items() if c == cls]
    files = sorted(f for op in ops for f in (root / "train" / "collect" / op).glob("*/*.csv"))
    if not files:
        raise DataNotFoundError(f"No {cls} training kernels under {root / 'train' / 'collect'} "
                                f"(expected <op>/<version>/<GPU>.csv for ops {ops}). Get the data "
                                "with `nslib fetch`, or point NSLIB_DATA at a copy.")
    return files


NUMERIC = ["Latency", "Grid x", "Grid y", "Grid z"]


def _ends_mid_line(path: Path) -> bool:
    """True when a non-empty file's last byte is not a line end (a cut-off download or copy:
    its last row would otherwise be read with its tail missing, or with a shortened number)."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _read(path: Path, cls: str) -> pd.DataFrame:
    """One kernel CSV's needed columns, renamed; ValueError naming the file (and line) when a
    column is missing, a cell is empty or not a number, or the file ends mid-line."""
    if _ends_mid_line(path):
        raise ValueError(f"{path}: the last line is cut off (no line end): the file is "
                             "truncated; restore it (`nslib fetch --force`)")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable CSV ({e}); restore the file") from None
    dims = GEMM_DIMS if cls in sizes.GEMM_CLASSES else VEC_DIMS
    need = list(RENAME) + dims
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: expected columns {missing} are missing (found "
                         f"{list(df.columns)}); is this a NeuSight kernel file?")
    df = df[need]
    for col in need:
        empty = df[col].isna().to_numpy()
        if col in NUMERIC + dims:
            num = pd.to_numeric(df[col], errors="coerce")
            bad = np.flatnonzero(num.isna().to_numpy() & ~empty)
            if len(bad):
                raise ValueError(f"{path}, line {bad[0] + 2}: column {col!r} holds "
                                 f"{df[col].iloc[bad[0]]!r}, not a number; fix or restore "
                                 "the file")
            df = df.assign(**{col: num})
        if empty.any():
            raise ValueError(f"{path}, line {np.flatnonzero(empty)[0] + 2}: column {col!r} is "
                             "empty (a cut-off or malformed row); fix or restore the file")
    return df.rename(columns=RENAME)


def parse_gemm_tile(names: pd.Series, M, K, grid_x, grid_y) -> tuple[np.ndarray, np.ndarray]:
    """Output tile (rows along M, columns along K) of each GEMM kernel, from its name.

    Names carry two tile numbers: ``maxwell_sgemm_128x64_nn``, ``volta_sgemm_32x128_tn``,
    ``ampere_sgemm_64x32_sliced1x4_tn``, ``sgemm_128x128x8_NT``,
    ``cutlass_80_simt_sgemm_256x128_8x4_nn``, ``sm80_xmma_gemm_..._tilesize64x128x8_...``.
    cuBLAS sees PyTorch's row-major product transposed, so in the sgemm names the first
    number is the K-side and the second the M-side; in the xmma (``tilesize``) names it is
    the other way round. The launch grid decides: the order whose ``ceil(K/tk), ceil(M/tm)``
    matches (grid x, grid y) wins; if neither or both match (split-K, swizzled grids, M = K)
    the family's usual order is used. Unparseable names give NaN.
    """
    ab = names.str.extract(r"(?:tilesize|sgemm_)(\d+)x(\d+)").astype(float).to_numpy()
    a, b = ab[:, 0], ab[:, 1]
    M, K = np.asarray(M, float), np.asarray(K, float)
    gx, gy = np.asarray(grid_x, float), np.asarray(grid_y, float)
    k_first = (np.ceil(K / a) == gx) & (np.ceil(M / b) == gy)
    m_first = (np.ceil(M / a) == gx) & (np.ceil(K / b) == gy)
    xmma = names.str.contains("tilesize", regex=False).to_numpy()
    use_m_first = (m_first & ~k_first) | ((m_first == k_first) & xmma)
    return np.where(use_m_first, a, b), np.where(use_m_first, b, a)


def attach_gpus(df: pd.DataFrame, gpus: dict[str, GPU]) -> pd.DataFrame:
    """Add the datasheet columns for each row's ``gpu`` (a Device string)."""
    specs = {}
    for name in df["gpu"].unique():
        try:
            specs[name] = find_gpu(name, gpus)
        except KeyError:
            raise ValueError(f"kernels were measured on {name!r} but data/device_configs has no "
                             f"spec for it: add a JSON file for it there (see README, "
                             f"'Adding a GPU')") from None
    cols = pd.DataFrame([{**g.columns(), "gpu_key": g.key} for g in specs.values()])
    cols["gpu"] = list(specs)
    return df.merge(cols, on="gpu", how="left", validate="many_to_one")


def build_table(cls: str, split: str, data=None) -> pd.DataFrame:
    """Build (without caching) the tidy table of one kernel class and split."""
    files = source_files(cls, split, data)
    df = pd.concat([_read(f, cls) for f in files], ignore_index=True)
    df = df[df["op"].isin([op for op, v in sizes.OPS.items() if v[0] == cls])]
    df = df[np.isfinite(df["latency_ms"]) & (df["latency_ms"] > 0)]
    df = df.assign(cls=cls, split=split)
    for c in sizes.DIM_COLS:
        df[c] = df[c].astype(float) if c in df else np.nan
    df = attach_gpus(df, load_gpus(data))
    if cls in sizes.GEMM_CLASSES:
        df["tile_m"], df["tile_k"] = parse_gemm_tile(df["kernel_name"], df["M"], df["K"],
                                                     df["grid_x"], df["grid_y"])
        df = df[np.isfinite(df["tile_m"]) & np.isfinite(df["tile_k"])]
    elif cls == "elementwise":
        grid = df["grid_x"] * df["grid_y"] * df["grid_z"]
        df["tile"] = sizes.vector_tile((df["B"] * df["H"]).to_numpy(float), grid.to_numpy(float))
    df = df[(df[GEMM_DIMS if cls in sizes.GEMM_CLASSES else VEC_DIMS] > 0).all(axis=1)]
    return sizes.add_features(df.reset_index(drop=True))


def table_key(cls: str, split: str, data=None) -> str:
    """Content hash of a table's inputs: its CSV files, the datasheets of the GPUs measured in
    them (only those: a datasheet-only GPU added to the data changes no table) and the schema
    version. Remembered per process while no file of the table or of the datasheet folder
    changes its size, time stamp or inode (a command asks for the same keys tens of times)."""
    files = source_files(cls, split, data)
    root = data_root(data)
    sheets = sorted((root / "data" / "device_configs").glob("*.json"))
    return _table_key(cls, split, str(root), _stat_signature(files), _stat_signature(sheets))


def _stat_signature(paths) -> tuple:
    """(path, size, time stamp, inode) of each file: what identifies its content within a
    process (:func:`nslib.data.paths.hash_files` keys its own memo the same way)."""
    return tuple((str(p), st.st_size, st.st_mtime_ns, st.st_ino)
                 for p, st in ((p, os.stat(p)) for p in paths))


@lru_cache(maxsize=256)
def _table_key(cls: str, split: str, data: str, files: tuple, sheets: tuple) -> str:
    """:func:`table_key` of the CSV files and datasheet folder whose stat signatures are
    ``files`` and ``sheets`` (the memo's key)."""
    files = [Path(p) for p, *_ in files]
    devices = measured_devices(files)
    gpus = load_gpus(data)
    folder = data_root(data) / "data" / "device_configs"
    configs, unknown = set(), []
    for d in devices:
        try:
            configs.add(folder / f"{find_gpu(d, gpus).key}.json")
        except KeyError:
            unknown.append(d)  # build_table names it; adding its spec later changes the key
    return hash_files(files + sorted(configs), extra=[SCHEMA_VERSION, cls, split, unknown])


def measured_devices(files: list[Path]) -> list[str]:
    """The sorted ``Device`` strings found in kernel CSVs, remembered in the cache by the
    files' content hash (reading the column of every CSV on each command would be slow)."""
    key = hash_files(files, extra=["devices-1"])
    return cached("tables", f"devices-{key}", lambda: _read_devices(files), "device list",
                  JSON, valid=lambda v: isinstance(v, list))


def _read_devices(files: list[Path]) -> list[str]:
    names = set()
    for f in files:
        try:
            names.update(pd.read_csv(f, usecols=["Device"])["Device"].dropna().astype(str))
        except (ValueError, pd.errors.ParserError):
            pass  # a broken file: build_table's reader names the problem
    return sorted(names)


def kernel_table(cls: str, split: str, data=None) -> pd.DataFrame:
    """The tidy kernel table of ``cls`` and ``split``, from the cache when its inputs match."""
    key = table_key(cls, split, data)
    return _cached_table(cls, split, key, str(data_root(data))).copy()


@lru_cache(maxsize=32)
def _cached_table(cls: str, split: str, key: str, root: str) -> pd.DataFrame:
    return cached("tables", f"{cls}-{split}-{key}", lambda: build_table(cls, split, root),
                  "kernel table")


def kernel_tables(split: str, data=None, classes=sizes.CLASSES) -> dict[str, pd.DataFrame]:
    """``{cls: kernel_table(cls, split)}`` for each class."""
    return {c: kernel_table(c, split, data) for c in classes}


def gpu_splits(data=None) -> dict[str, list[str]]:
    """Which GPUs each split covers, from the data: ``train_gpus``, ``test_gpus``, ``new_gpus``.

    ``new_gpus`` are test GPUs with no training kernels of any class (the out-of-distribution
    GPUs). Values are Device strings, sorted.
    """
    train = set().union(*(kernel_table(c, "train", data)["gpu"] for c in sizes.CLASSES))
    test = set().union(*(kernel_table(c, "test", data)["gpu"] for c in sizes.CLASSES))
    return {"train_gpus": sorted(train), "test_gpus": sorted(test),
            "new_gpus": sorted(test - train)}


def train_hash(data=None) -> str:
    """Content hash of the training tables' inputs: what a predictor is trained on."""
    return hash_files([], extra=[table_key(c, "train", data) for c in sizes.CLASSES])


def data_hash(data=None) -> str:
    """One content hash over every table's inputs: names the data a result came from."""
    keys = [table_key(c, s, data) for c in sizes.CLASSES for s in SPLITS]
    return hash_files([], extra=keys)
