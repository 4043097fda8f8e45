"""Tile lookup for GPUs that were never profiled (method.md section 3).

Without a kernel name there is no tile, so each kernel takes the tile of the nearest measured
training kernel in (log2 dims, log2 GPU features), found with a KD-tree over the whole frame at
once. Softmax and layernorm need no lookup: their tile is always one row (H).
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from nslib.data.cache import NPY, cached
from nslib.kernels import sizes

LOOKUP_GPU_COLS = ("num_sm", "peak_gflops", "mem_bw", "mem_gb", "l2_mb")
TILE_COLS = {"bmm": ("tile_m", "tile_k"), "linear": ("tile_m", "tile_k"), "elementwise": ("tile",)}
# every tile column, once
TILE_NAMES = tuple(dict.fromkeys(c for cols in TILE_COLS.values() for c in cols))


def lookup_keys(frame: pd.DataFrame, cls: str, gpu: bool = True) -> np.ndarray:
    """The (n, d) log2 matrix a tile is looked up by: the class's dims, then (``gpu``) GPU
    features."""
    dims = ["B", "M", "N", "K"] if cls in sizes.GEMM_CLASSES else []
    cols = [frame[d].to_numpy(float) for d in dims]
    if cls == "elementwise":  # elementwise kernels are flat: only the element count matters
        cols = [(frame["B"] * frame["H"]).to_numpy(float)]
    if gpu:
        cols += [frame[g].to_numpy(float) for g in LOOKUP_GPU_COLS]
    return np.log2(np.column_stack(cols))


def _modal_tiles(keys: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct key: the tile most kernels with that key ran (ties: the larger)."""
    df = pd.DataFrame(np.column_stack([keys, tiles]))
    kc, tc = list(df.columns[:keys.shape[1]]), list(df.columns[keys.shape[1]:])
    counts = df.groupby(kc + tc).size().rename("n").reset_index()
    counts["area"] = np.prod(counts[tc].to_numpy(float), axis=1)
    best = counts.sort_values(kc + ["n", "area"]).groupby(kc).tail(1)
    return best[kc].to_numpy(float), best[tc].to_numpy(float)


class TileLookup:
    """Nearest-neighbour tile tables, one per class that has tiles.

    ``gpu_free=True`` builds the *nominal* lookup: keyed on the dims alone, each entry holds
    the tile most training GPUs ran for those dims. It names a kernel's shape the same way on
    every GPU, so a predictor trained and queried with it does not depend on guessing which
    tile a never-profiled GPU's library would pick (the nearest GPU's choice is right for
    under half of a held-out training GPU's GEMMs).
    """

    def __init__(self, gpu_free: bool = False):
        self.tables: dict[str, dict] = {}
        self.gpu_free = gpu_free

    def fit(self, frame: pd.DataFrame) -> "TileLookup":
        """Remember the keys and tiles of measured kernels (rows with parsed tiles)."""
        for cls, cols in TILE_COLS.items():
            sub = frame[frame["cls"] == cls]
            if len(sub):
                keys = lookup_keys(sub, cls, gpu=not self.gpu_free)
                tiles = sub[list(cols)].to_numpy(float)
                if self.gpu_free:
                    k, t = _modal_tiles(keys, tiles)
                else:
                    # dedupe identical keys: keeps the tree small and the answer order-independent
                    both = np.unique(np.column_stack([keys, tiles]), axis=0)
                    k, t = both[:, :keys.shape[1]], both[:, keys.shape[1]:]
                self.tables[cls] = {"keys": k, "tiles": t, "cols": list(cols)}
        self._trees, self._hashes = {}, {}
        return self

    def _tree(self, cls: str):
        if cls not in getattr(self, "_trees", {}):
            from scipy.spatial import cKDTree  # imported when a lookup is not in the cache
            self._trees = getattr(self, "_trees", {})
            t = self.tables[cls]
            scale = t["keys"].std(axis=0)
            scale[scale == 0] = 1.0
            self._trees[cls] = (cKDTree(t["keys"] / scale), scale)
        return self._trees[cls]

    def _table_hash(self, cls: str):
        """SHA-256 state over a class's table (keys and tiles), computed once per object."""
        if cls not in getattr(self, "_hashes", {}):
            self._hashes = getattr(self, "_hashes", {})
            t = self.tables[cls]
            h = hashlib.sha256(np.ascontiguousarray(t["keys"]).tobytes())
            h.update(b"nominal" if self.gpu_free else b"nearest")
            h.update(np.ascontiguousarray(t["tiles"]).tobytes())
            self._hashes[cls] = h
        return self._hashes[cls].copy()

    def _nearest(self, cls: str, keys: np.ndarray) -> np.ndarray:
        """Row index of the nearest table entry for each key row (log2 units, unscaled).

        Answers are kept in the cache folder by the content of the table and of the queries:
        a traced model asks the same questions on every run, and a cached answer needs no
        KD-tree (building one, and importing scipy, is most of a cached prediction's time).
        """
        h = self._table_hash(cls)
        h.update(np.ascontiguousarray(keys, dtype=float).tobytes())
        return cached("tiles", f"{cls}-{h.hexdigest()[:24]}", lambda: self._query(cls, keys),
                      "tile answers", NPY, valid=lambda idx: idx.shape == (len(keys),))

    def _query(self, cls: str, keys: np.ndarray) -> np.ndarray:
        tree, scale = self._tree(cls)
        _, idx = tree.query(keys / scale)
        return np.asarray(idx, np.int64)

    def lookup(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Return a copy of ``frame`` with its tile columns replaced by looked-up tiles."""
        out = frame.copy()
        for cls, cols in TILE_COLS.items():
            mask = (out["cls"] == cls).to_numpy()
            if not mask.any():
                continue
            if cls not in self.tables:
                raise ValueError(f"no measured {cls} kernels to look tiles up from")
            idx = self._nearest(cls, lookup_keys(out[mask], cls, gpu=not self.gpu_free))
            tiles = self.tables[cls]["tiles"][idx]
            for j, c in enumerate(cols):
                if c not in out:
                    out[c] = np.nan
                out.loc[mask, c] = tiles[:, j]
        return out

    def gpus(self, cls: str) -> np.ndarray:
        """The distinct GPUs whose kernels fill class ``cls``'s table: one row of
        :data:`LOOKUP_GPU_COLS` (datasheet units) each."""
        keys = self.tables[cls]["keys"]
        return 2.0 ** np.unique(keys[:, -len(LOOKUP_GPU_COLS):], axis=0)

    def known(self, frame: pd.DataFrame, cls: str) -> np.ndarray:
        """Whether each row's GPU is one whose kernels fill class ``cls``'s table (its own
        library's choices are there)."""
        own = lookup_keys(frame, cls)[:, -len(LOOKUP_GPU_COLS):]
        table = np.log2(self.gpus(cls))
        return (np.abs(own[:, None, :] - table[None, :, :]) < 1e-9).all(axis=2).any(axis=1)

    def choices(self, frame: pd.DataFrame, cls: str) -> list[np.ndarray]:
        """For each GPU of class ``cls``'s table, the tiles its library would run for the
        rows' dims (the nearest of its own kernels): one ``(n, tile columns)`` array each."""
        out = []
        for gpu in self.gpus(cls):
            as_gpu = frame.assign(**dict(zip(LOOKUP_GPU_COLS, gpu)))
            out.append(self.lookup(as_gpu)[self.tables[cls]["cols"]].to_numpy(float))
        return out

    def fill(self, frame: pd.DataFrame, lookup_all: bool = False,
             library: bool = True) -> pd.DataFrame:
        """``frame`` with every GEMM / elementwise tile present and the derived columns of
        :func:`nslib.kernels.sizes.add_features` (``library``: its GEMM sizing).

        Parsed tiles are kept and missing ones (no column, or NaN) are looked up;
        ``lookup_all=True`` looks every tile up, as for a GPU that was never profiled.
        A frame with all its tiles and derived columns is returned as it is.
        """
        if lookup_all or not all(c in frame for c in TILE_NAMES):
            return sizes.add_features(self.lookup(frame), library=library)
        cls = frame["cls"].to_numpy()
        miss = np.zeros(len(frame), bool)
        for c, cols in TILE_COLS.items():
            vals = frame[list(cols)].to_numpy(float)
            miss |= (cls == c) & ~np.isfinite(vals).all(axis=1)
        if not miss.any():
            return frame if "waves" in frame else sizes.add_features(frame, library=library)
        looked = self.lookup(frame)
        filled = frame.copy()
        for c in TILE_NAMES:
            filled[c] = np.where(miss, looked[c].to_numpy(float), frame[c].to_numpy(float))
        return sizes.add_features(filled, library=library)

    def nominal(self, frame: pd.DataFrame, classes) -> pd.DataFrame:
        """``frame`` (featured) with the tiles of ``classes`` looked up and its derived columns
        recomputed; other rows unchanged."""
        mask = frame["cls"].isin(list(classes)).to_numpy()
        if not mask.any():
            return frame
        looked = self.lookup(frame[mask])
        out = frame.copy()
        for c in [c for cls in classes for c in TILE_COLS.get(cls, ())]:
            out.loc[mask, c] = looked[c].to_numpy(float)
        return sizes.add_features(out)

    def get_state(self) -> dict:
        state = {c: {"keys": t["keys"], "tiles": t["tiles"], "cols": t["cols"]}
                 for c, t in self.tables.items()}
        if self.gpu_free:
            state["_gpu_free"] = True
        return state

    @classmethod
    def from_state(cls, state: dict) -> "TileLookup":
        obj = cls(gpu_free=bool(state.get("_gpu_free", False)))
        obj.tables = {c: {"keys": _array(t["keys"]), "tiles": _array(t["tiles"]),
                          "cols": list(t["cols"])} for c, t in state.items() if c != "_gpu_free"}
        return obj


def agreement(true: pd.DataFrame, looked_up: pd.DataFrame) -> pd.DataFrame:
    """Fraction of rows whose looked-up tile equals the parsed tile, per class and GPU."""
    rows = []
    for cls, cols in TILE_COLS.items():
        mask = (true["cls"] == cls).to_numpy()
        if mask.any():
            same = np.all(true.loc[mask, list(cols)].to_numpy() ==
                          looked_up.loc[mask, list(cols)].to_numpy(), axis=1)
            rows.append(pd.DataFrame({"cls": cls, "gpu": true.loc[mask, "gpu"].to_numpy(),
                                      "same": same}))
    if not rows:
        return pd.DataFrame(columns=["cls", "gpu", "match", "n"])
    df = pd.concat(rows)
    return df.groupby(["cls", "gpu"]).agg(match=("same", "mean"), n=("same", "size")).reset_index()


def _array(a) -> np.ndarray:
    """A float64 array from a state value (an array, or a tensor of older states)."""
    return np.asarray(a.numpy() if hasattr(a, "numpy") else a, float)
