"""Tidy kernel tables built from the NeuSight measurements, cached by content.

``kernel_table(cls, split)`` returns one row per measured kernel with dims, op name, measured
latency (``latency_ms``), kernel name, launch grid, the GPU's datasheet columns, the tile parsed
from the kernel name (GEMMs) or launch grid (elementwise), and the derived columns of
:func:`nslib.kernels.add_features`. Splits are by GPU and come from the data itself:
the training split is ``train/collect/<op>/<version>/<GPU>.csv``, the test split
``test/<class>.csv``.
"""
from __future__ import annotations

import io
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from . import kernels
from .gpus import GPU, find_gpu, load_gpus
from .paths import DataNotFoundError, cache_dir, data_root, hash_files, require, atomic_write_bytes

SCHEMA_VERSION = 4  # bump when the built tables change shape or meaning
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
    if cls not in kernels.CLASSES:
        raise ValueError(f"unknown kernel class {cls!r}; known: {kernels.CLASSES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {SPLITS}")
    root = _dataset(data)
    if split == "test":
        return [require(root / "test" / TEST_FILES[cls], f"{cls} test kernels")]
    ops = [op for op, (c, _, _) in kernels.OPS.items() if c == cls]
    files = sorted(f for op in ops for f in (root / "train" / "collect" / op).glob("*/*.csv"))
    if not files:
        raise DataNotFoundError(f"No {cls} training kernels under {root / 'train' / 'collect'} "
                                f"(expected <op>/<version>/<GPU>.csv for ops {ops}). Get the data "
                                "with `nslib fetch`, or point NSLIB_DATA at a copy.")
    return files


def _read(path: Path, cls: str) -> pd.DataFrame:
    df = pd.read_csv(path)
    need = list(RENAME) + (GEMM_DIMS if cls in kernels.GEMM_CLASSES else VEC_DIMS)
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: expected columns {missing} are missing (found "
                         f"{list(df.columns)}); is this a NeuSight kernel file?")
    return df[need].rename(columns=RENAME)


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
    df = df[df["op"].isin([op for op, v in kernels.OPS.items() if v[0] == cls])]
    df = df[np.isfinite(df["latency_ms"]) & (df["latency_ms"] > 0)]
    df = df.assign(cls=cls, split=split)
    for c in kernels.DIM_COLS:
        df[c] = df[c].astype(float) if c in df else np.nan
    df = attach_gpus(df, load_gpus(data))
    if cls in kernels.GEMM_CLASSES:
        df["tile_m"], df["tile_k"] = parse_gemm_tile(df["kernel_name"], df["M"], df["K"],
                                                     df["grid_x"], df["grid_y"])
        df = df[np.isfinite(df["tile_m"]) & np.isfinite(df["tile_k"])]
    elif cls == "elementwise":
        grid = df["grid_x"] * df["grid_y"] * df["grid_z"]
        df["tile"] = kernels.vector_tile((df["B"] * df["H"]).to_numpy(float), grid.to_numpy(float))
    df = df[(df[GEMM_DIMS if cls in kernels.GEMM_CLASSES else VEC_DIMS] > 0).all(axis=1)]
    return kernels.add_features(df.reset_index(drop=True))


def table_key(cls: str, split: str, data=None) -> str:
    """Content hash of a table's inputs (CSV files, GPU configs, schema version)."""
    root = data_root(data)
    configs = sorted((root / "data" / "device_configs").glob("*.json"))
    return hash_files(source_files(cls, split, data) + configs, extra=[SCHEMA_VERSION, cls, split])


def kernel_table(cls: str, split: str, data=None) -> pd.DataFrame:
    """The tidy kernel table of ``cls`` and ``split``, from the cache when its inputs match."""
    key = table_key(cls, split, data)
    return _cached_table(cls, split, key, str(data_root(data))).copy()


@lru_cache(maxsize=32)
def _cached_table(cls: str, split: str, key: str, root: str) -> pd.DataFrame:
    path = cache_dir("tables") / f"{cls}-{split}-{key}.parquet"
    if path.exists():
        return pd.read_parquet(path)
    df = build_table(cls, split, root)
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())
    return df


def kernel_tables(split: str, data=None, classes=kernels.CLASSES) -> dict[str, pd.DataFrame]:
    """``{cls: kernel_table(cls, split)}`` for each class."""
    return {c: kernel_table(c, split, data) for c in classes}


def gpu_splits(data=None) -> dict[str, list[str]]:
    """Which GPUs each split covers, from the data: ``train_gpus``, ``test_gpus``, ``new_gpus``.

    ``new_gpus`` are test GPUs with no training kernels of any class (the out-of-distribution
    GPUs). Values are Device strings, sorted.
    """
    train = set().union(*(kernel_table(c, "train", data)["gpu"] for c in kernels.CLASSES))
    test = set().union(*(kernel_table(c, "test", data)["gpu"] for c in kernels.CLASSES))
    return {"train_gpus": sorted(train), "test_gpus": sorted(test),
            "new_gpus": sorted(test - train)}


def data_hash(data=None) -> str:
    """One content hash over every table's inputs: names the data a result came from."""
    keys = [table_key(c, s, data) for c in kernels.CLASSES for s in SPLITS]
    return hash_files([], extra=keys)
