"""Tests of the baselines (Habitat, Li et al., linear regression, XGBoost) on small real subsets."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nslib.kernels import sizes
from nslib.predictors import get, predictor_class
from nslib.predictors.base import by_class
from nslib.predictors.li import clamp_coefficients, fit_per_gpu

DATA = Path(os.environ.get("NSLIB_DATA")
            or Path(__file__).resolve().parents[1].parent / "shared" / "neusight")
N_TRAIN = 2000  # training kernels per class
N_TEST = 150    # test kernels per class
BARE = ["cls", "op", "gpu", "B", "M", "N", "K", "H", *sizes.GPU_COLS]

# small, fast settings; the algorithms are the defaults'
PARAMS = {"habitat": {"epochs": 4, "hidden": 64, "layers": 3},
          "li": {},
          "linreg": {},
          "xgboost": {"rounds": 40, "max_depth": 6, "n_jobs": 1}}


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """(train, test) frames: N_TRAIN / N_TEST sampled kernels of every class; tmp cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSLIB_CACHE", str(tmp_path_factory.mktemp("cache")))
        mp.setenv("NSLIB_DATA", str(DATA))
        from nslib.data import paths
        from nslib.kernels import measured
        try:
            paths.data_root()
        except paths.DataNotFoundError:
            pytest.skip(f"nslib data not here: NeuSight (none at {DATA})")
        train = pd.concat([measured.kernel_table(c, "train").sample(N_TRAIN, random_state=0)
                           for c in sizes.CLASSES], ignore_index=True)
        test = pd.concat([(t := measured.kernel_table(c, "test")).sample(min(N_TEST, len(t)),
                                                                     random_state=0)
                          for c in sizes.CLASSES], ignore_index=True)
    return train, test


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def fitted(frames):
    train, _ = frames
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {n: get(n, **p).fit(train, progress=False) for n, p in PARAMS.items()}


def _predict(pred, frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Habitat's missing-reference warning, tested below
        return pred.predict(frame)


@pytest.mark.parametrize("name", list(PARAMS))
def test_registered(name):
    cls = predictor_class(name)
    assert cls.name == name and cls.description


@pytest.mark.parametrize("name", list(PARAMS))
def test_predictions_positive_finite_without_tiles(name, fitted, frames):
    """Mixed-class frames of dims + GPU columns only (no tiles, no waves) are enough."""
    _, test = frames
    pred = _predict(fitted[name], test[BARE])
    assert pred.shape == (len(test),)
    assert np.isfinite(pred).all() and (pred > 0).all()
    # row order is kept when the classes are interleaved
    perm = np.random.default_rng(0).permutation(len(test))
    np.testing.assert_allclose(_predict(fitted[name], test[BARE].iloc[perm]), pred[perm])


@pytest.mark.parametrize("name", ["linreg", "xgboost"])
def test_regressors_use_parsed_tiles_and_lookup(name, fitted, frames):
    train, _ = frames
    sub = train.groupby("cls").head(50)
    full = fitted[name].predict(sub)
    looked = fitted[name].predict(sub, lookup=True)
    assert np.isfinite(full).all() and np.isfinite(looked).all()
    # a sensible fit on its own training kernels: median error well under 100 %
    err = np.abs(full - sub["latency_ms"]) / sub["latency_ms"]
    assert np.median(err) < 0.5


@pytest.mark.parametrize("name", list(PARAMS))
def test_save_load_round_trip(name, fitted, frames, tmp_path):
    _, test = frames
    pred = fitted[name]
    path = pred.save(tmp_path / f"{name}.npz")
    back = predictor_class(name).load(path)
    np.testing.assert_array_equal(_predict(back, test[BARE]), _predict(pred, test[BARE]))


@pytest.mark.parametrize("name", ["habitat", "xgboost"])
def test_same_seed_same_predictions(name, frames):
    train, test = frames
    small = train.groupby("cls").head(400)
    a = _predict(get(name, seed=3, **PARAMS[name]).fit(small, progress=False), test[BARE])
    b = _predict(get(name, seed=3, **PARAMS[name]).fit(small, progress=False), test[BARE])
    np.testing.assert_array_equal(a, b)


def test_fit_per_gpu_recovers_exact_coefficients():
    x = np.logspace(6, 13, 200)
    y = 0.01 + 2e-9 * x
    for weighted in (True, False):
        a, b = fit_per_gpu(x, y, weighted=weighted)
        assert a == pytest.approx(0.01, rel=1e-6)
        assert b == pytest.approx(2e-9, rel=1e-6)


def test_fit_per_gpu_recovers_coefficients_with_noise():
    rng = np.random.default_rng(0)
    x = np.logspace(6, 13, 2000)
    y = (0.01 + 2e-9 * x) * (1 + 0.05 * rng.standard_normal(len(x)))  # 5 % relative noise
    a, b = fit_per_gpu(x, y)
    assert a == pytest.approx(0.01, rel=0.05)
    assert b == pytest.approx(2e-9, rel=0.05)


def test_clamp_keeps_coefficients_positive():
    x = np.array([1.0, 2.0, 3.0])
    y = np.array([0.5, 0.3, 0.1])  # latency falling with work: nonsense slope
    a, b = fit_per_gpu(x, y)
    assert b < 0
    a2, b2, clamped = clamp_coefficients(-1.0, b, x, y)
    assert clamped and a2 > 0 and b2 > 0


def test_li_forecasts_positive_coefficients_for_unseen_gpu(fitted, frames):
    _, test = frames
    li = fitted["li"]
    new = test[BARE].assign(peak_gflops=test["peak_gflops"] * 5, mem_bw=test["mem_bw"] * 5,
                            num_sm=test["num_sm"] + 1)
    for cls, _, sub in by_class(new):
        a, b = li.coefficients(cls, sub)
        assert (a > 0).all() and (b > 0).all()
    # a faster GPU is forecast faster
    assert np.median(_predict(li, new) / _predict(li, test[BARE])) < 1


def test_habitat_missing_reference_warns_and_counts(fitted, frames):
    train, test = frames
    hab = fitted["habitat"]
    vec = test[test["cls"].isin(sizes.VECTOR_CLASSES)][BARE]
    with pytest.warns(UserWarning, match="no reference measurement"):
        hab.predict(vec)
    assert hab.last_missing == len(vec)  # test kernels are larger than any training kernel


def test_habitat_exact_reference_is_wave_scaled(fitted, frames):
    train, _ = frames
    hab = fitted["habitat"]
    ref = train[(train["gpu"] == hab.reference) & train["cls"].isin(sizes.VECTOR_CLASSES)]
    ref = ref.drop_duplicates(["op", "B", "H"], keep=False).head(40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every row has its exact reference: no warning
        same = hab.predict(ref[BARE])
    assert hab.last_missing == 0
    np.testing.assert_allclose(same, ref["latency_ms"].to_numpy(), rtol=1e-12)
    # a GPU with half the bandwidth and the same SMs takes twice as long
    slow = hab.predict(ref[BARE].assign(mem_bw=ref["mem_bw"] / 2))
    np.testing.assert_allclose(slow, 2 * same, rtol=1e-12)
    # the reference is the highest-bandwidth training GPU
    assert hab.reference == train.loc[train["mem_bw"].idxmax(), "gpu"]


def test_habitat_wave_scale_partial_waves():
    from nslib.predictors.habitat import wave_scale

    # one block: the target's one wave is charged at its per-SM bandwidth share
    assert wave_scale(1, 100, 1000.0, 50, 1000.0) == pytest.approx(0.5)
    # many blocks, same GPU: 1; many blocks: tends to the bandwidth ratio
    assert wave_scale(1e6, 100, 1000.0, 100, 1000.0) == pytest.approx(1.0)
    assert wave_scale(1e6, 100, 1000.0, 40, 250.0) == pytest.approx(4.0, rel=1e-3)
    # 150 blocks: 2 waves on 100 SMs, 4 waves on 40 SMs
    assert wave_scale(150, 100, 1000.0, 40, 1000.0) == pytest.approx(4 / 2 * 0.4)
