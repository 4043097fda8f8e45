"""The one place that decides where data, caches and figures live.

Settings (environment variables, each overridable by a CLI option):

- ``NSLIB_DATA``: root of the NeuSight data, either the repository root (it holds
  ``scripts/asplos``) or the ``scripts/asplos`` folder itself. Default ``datasets/neusight``.
- ``NSLIB_MIXED``: root of the 16-bit measurements (aiconfigurator and vidur tables plus
  ``device_configs/`` datasheets with ``Bf16FLOPs``). Default ``datasets/mixed``.
- ``NSLIB_CACHE``: the user cache folder for built tables, traces and trained weights.
  Default ``~/.cache/nslib``. The data folder may be read-only, so nothing is written beside it.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = PROJECT_ROOT / "datasets" / "neusight"
ASPLOS = Path("scripts") / "asplos"
DEFAULT_MIXED = PROJECT_ROOT / "datasets" / "mixed"


class DataNotFoundError(FileNotFoundError):
    """The NeuSight data (or a file inside it) is missing; the message says how to get it."""


def _how_to_get() -> str:
    return (
        "Get the data with `nslib fetch` (downloads the pinned NeuSight repository into "
        f"{DEFAULT_DATA}), or point NSLIB_DATA (or --data) at an existing copy, "
        "e.g. NSLIB_DATA=../shared/neusight."
    )


def data_root(data: str | os.PathLike | None = None) -> Path:
    """The ``scripts/asplos`` folder of the NeuSight data.

    ``data`` (or ``NSLIB_DATA``, or the default) may name the repository root or the
    ``scripts/asplos`` folder itself. Raises :class:`DataNotFoundError` when neither is there.
    """
    raw = data if data is not None else os.environ.get("NSLIB_DATA") or DEFAULT_DATA
    root = Path(raw).expanduser()
    for cand in (root / ASPLOS, root):
        if (cand / "data" / "device_configs").is_dir():
            return cand.resolve()
    raise DataNotFoundError(f"No NeuSight data at {root} (looked for data/device_configs there "
                            f"and under {ASPLOS}). {_how_to_get()}")


def mixed_root(mixed: str | os.PathLike | None = None) -> Path:
    """The folder of 16-bit measurements (``mixed``, else ``NSLIB_MIXED``, else the default).

    It holds ``device_configs/`` (datasheets with ``Bf16FLOPs``) and the ``aiconfigurator/``
    and ``vidur/`` tables. Raises :class:`DataNotFoundError` saying how to get it.
    """
    return datasheet_folder(mixed, "NSLIB_MIXED", DEFAULT_MIXED, "16-bit measurements",
                            "mixed")


def datasheet_folder(path, env: str, default: Path, what: str, flag: str) -> Path:
    """The data folder ``path``, else ``$env``, else ``default``, when it holds
    ``device_configs/``; else :class:`DataNotFoundError` saying how to get ``what``
    (``nslib fetch --flag``, or the setting pointed at ``../shared/<flag>``)."""
    raw = path if path is not None else os.environ.get(env) or default
    root = Path(raw).expanduser()
    if (root / "device_configs").is_dir():
        return root.resolve()
    raise DataNotFoundError(
        f"No {what} at {root} (looked for device_configs/ there). Get them with "
        f"`nslib fetch --{flag}` (into {default}), or point {env} (or --{flag}) at "
        f"an existing copy, e.g. {env}=../shared/{flag}.")


def require(path: Path, what: str) -> Path:
    """Return ``path`` if it exists, else raise :class:`DataNotFoundError` naming ``what``."""
    if not path.exists():
        raise DataNotFoundError(f"Missing {what}: {path}. {_how_to_get()}")
    return path


class CacheError(RuntimeError):
    """The cache folder cannot be written; the message names it and how to choose another."""


def cache_unwritable(path: Path, e: OSError) -> CacheError:
    """The :class:`CacheError` for a cache folder ``path`` that could not be written."""
    return CacheError(f"cannot write to the cache at {path} ({e.strerror or e}): make it "
                      "writable, or point NSLIB_CACHE (or --cache) at a writable folder")


def cache_dir(sub: str | None = None) -> Path:
    """The user cache folder (``NSLIB_CACHE`` or ``~/.cache/nslib``), or a sub-folder of it."""
    base = Path(os.environ.get("NSLIB_CACHE") or Path.home() / ".cache" / "nslib").expanduser()
    path = base / sub if sub else base
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise cache_unwritable(path, e) from None
    return path


def figures_dir(out: str | os.PathLike | None = None) -> Path:
    """Where figures go: ``out`` if given, else the project's ``figures/`` folder."""
    path = Path(out) if out is not None else PROJECT_ROOT / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


class StatMemo:
    """Values computed from a file's content, remembered across processes while the file's
    path, size, time stamp and inode stay the same (a changed file gets a new entry).

    Every command hashes the same data and code files for its cache keys; reading and hashing
    them again in each process was a third of a cached ``nslib predict``. The entries live in
    ``<cache>/memo/<kind>.json``, loaded on first use and written once at exit (atomically;
    a cache that cannot be written keeps them for this process only). Only the newest
    :attr:`KEEP` entries are kept. Values must be JSON (strings, lists)."""

    KEEP = 20000

    def __init__(self, kind: str):
        self.kind = kind
        self._data: dict | None = None
        self._new = False

    def _path(self) -> Path:
        base = Path(os.environ.get("NSLIB_CACHE") or Path.home() / ".cache" / "nslib")
        return base.expanduser() / "memo" / f"{self.kind}.json"

    def _load(self) -> dict:
        if self._data is None:
            try:
                data = json.loads(self._path().read_text())
            except (OSError, ValueError):
                data = {}
            self._data = data if isinstance(data, dict) else {}
        return self._data

    def get(self, path, compute):
        """The memo of ``compute()`` for the file ``path`` as it is now."""
        st = os.stat(path)
        key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        data = self._load()
        if key not in data:
            data[key] = compute()
            if not self._new:
                self._new = True
                atexit.register(self.flush)
        return data[key]

    def flush(self) -> None:
        """Write the entries to the cache (no error when it cannot be written)."""
        if not self._new or self._data is None:
            return
        keep = dict(list(self._data.items())[-self.KEEP:])
        try:
            atomic_write_text(self._path(), json.dumps(keep))
            self._new = False
        except OSError:
            pass


_FILE_DIGESTS = StatMemo("file-sha256")


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int, inode: int) -> bytes:
    """SHA-256 of a file's bytes, remembered while its size, time stamp and inode stay the
    same (:class:`StatMemo`: a command hashes the same data files for several cache keys,
    and every command the same ones)."""
    return bytes.fromhex(_FILE_DIGESTS.get(
        path, lambda: hashlib.sha256(Path(path).read_bytes()).hexdigest()))


def hash_files(paths, extra: object = None) -> str:
    """SHA-256 (hex, first 16 chars) over the contents of ``paths`` in order, plus ``extra``.

    Cache keys come from content, never from paths or time stamps, so a moved or re-downloaded
    copy of the same data hits the same cache entry.
    """
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).name.encode())
        st = os.stat(p)
        h.update(_file_digest(os.path.abspath(p), st.st_size, st.st_mtime_ns, st.st_ino))
    if extra is not None:
        h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        # mkstemp makes the file private (0600); give it the umask's usual mode, as open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))
