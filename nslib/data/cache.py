"""The one content-keyed disk cache: ``cached(folder, key, build)`` returns what ``build()``
returned, from ``<NSLIB_CACHE>/<folder>/<key>.<ext>`` while that entry is there and readable.

Keys come from content (:func:`nslib.data.paths.hash_files`), so an entry is never stale: a
changed input is a new key. Entries are written atomically; a damaged one (truncated, or half
written on a file system without atomic rename) is deleted with a one-line note and rebuilt.
Callers that ask again within a process keep an ``functools.lru_cache`` in front.
"""
from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from nslib.data.paths import atomic_write_bytes, cache_dir, cache_unwritable


@dataclass(frozen=True)
class Format:
    """How one kind of value goes to bytes and back: file suffix, writer, reader."""
    suffix: str
    to_bytes: Callable[[Any], bytes]
    read: Callable[[Path], Any]


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _npy_bytes(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr))
    return buf.getvalue()


PARQUET = Format(".parquet", _parquet_bytes, pd.read_parquet)
JSON = Format(".json", lambda v: json.dumps(v).encode(), lambda p: json.loads(p.read_text()))
NPY = Format(".npy", _npy_bytes, lambda p: np.load(p, allow_pickle=False))


def read_cache_entry(path: Path, reader, what: str):
    """``reader(path)``, or None when the entry is missing or unreadable.

    A damaged entry (a truncated file, a crash mid-write on a file system without atomic
    rename) is deleted with a one-line note on stderr, so the caller rebuilds it.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        return reader(path)
    except Exception as e:  # noqa: BLE001 - any reader error means a damaged entry
        print(f"nslib: note: cached {what} {path.name} is damaged ({type(e).__name__}); "
              "rebuilding it", file=sys.stderr)
        try:
            path.unlink()
        except OSError:
            pass  # read-only cache: the rebuild's write says so
        return None


def write_cache_entry(path: Path, data: bytes) -> Path:
    """Atomically write a cache entry; a cache folder that cannot be written is a CacheError
    naming NSLIB_CACHE / --cache."""
    try:
        return atomic_write_bytes(path, data)
    except OSError as e:
        raise cache_unwritable(Path(path).parent, e) from None


def cached(folder: str, key: str, build: Callable[[], Any], what: str,
           fmt: Format = PARQUET, valid: Callable[[Any], bool] | None = None):
    """``build()``'s value under ``key`` in the cache folder ``folder`` (one of
    :func:`nslib.data.paths.cache_dir`'s), read back when present; ``what`` names it in notes.

    ``valid(value)`` (optional) rejects a readable entry that does not fit the question (it is
    then rebuilt and overwritten).
    """
    path = cache_dir(folder) / f"{key}{fmt.suffix}"
    value = read_cache_entry(path, fmt.read, what)
    if value is not None and (valid is None or valid(value)):
        return value
    value = build()
    write_cache_entry(path, fmt.to_bytes(value))
    return value
