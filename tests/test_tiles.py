"""nslib.kernels.tiles: nearest-neighbour tile lookup, and its cache of answers."""
import numpy as np
import pandas as pd

from nslib.data.paths import cache_dir
from nslib.kernels.tiles import TileLookup


def table():
    """Three measured linear kernels on one GPU, with their tiles."""
    gpu = dict(num_sm=80.0, peak_gflops=14000.0, mem_bw=900.0, mem_gb=32.0, l2_mb=6.0)
    return pd.DataFrame([{"cls": "linear", "op": "linear", "B": 1.0, "M": m, "N": 1024.0,
                          "K": k, "H": np.nan, "tile_m": tm, "tile_k": tk, **gpu}
                         for m, k, tm, tk in ((64, 64, 32.0, 32.0), (1024, 1024, 64.0, 64.0),
                                              (8192, 8192, 128.0, 128.0))])


def test_lookup_takes_the_nearest_tile_and_caches_the_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path))
    lk = TileLookup().fit(table())
    query = table().drop(columns=["tile_m", "tile_k"])
    query[["M", "K"]] = [[70.0, 60.0], [900.0, 1200.0], [9000.0, 7000.0]]
    got = lk.lookup(query)
    assert got["tile_m"].tolist() == [32.0, 64.0, 128.0]
    files = list((cache_dir("tiles")).glob("linear-*.npy"))
    assert len(files) == 1
    # a fresh lookup object answers from the cache, without a KD-tree
    again = TileLookup.from_state(lk.get_state())
    assert again.lookup(query)["tile_k"].tolist() == [32.0, 64.0, 128.0]
    assert not getattr(again, "_trees", {})
    # an unreadable cache entry is answered again and replaced
    files[0].write_bytes(b"garbage")
    assert TileLookup.from_state(lk.get_state()).lookup(query)["tile_m"].tolist() == \
        [32.0, 64.0, 128.0]
    assert np.load(files[0]).tolist() == [0, 1, 2]
