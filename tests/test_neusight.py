"""NeuSight as published (`neusight`) follows method.md sections 3-5: its features, wave law,
published settings, tile sizing without split-K, the roofline bound and the plain sum."""
import json

import numpy as np
import pandas as pd
import pytest

from nslib.data.paths import data_root
from nslib.kernels import sizes
from nslib.model.stream import step_ms
from nslib.predictors import available, get, predictor_class
from nslib.predictors.features import FEATURES, tile_features
from nslib.predictors.neusight import PUBLISHED_CONFIG_FILES, NeuSight
from nslib.data.settings import Settings
from nslib.predictors import trained
from nslib.predictors.training import params_for
from nslib.predictors.wave_laws import wave_context, wave_ms


@pytest.fixture(scope="module")
def small(small_kernels):
    return small_kernels


@pytest.fixture(scope="module")
def fitted(small):
    params = NeuSight.data_params()
    return get("neusight", seed=0, epochs=2, batch=256, layers=2, hidden=32,
               **params).fit(small[0], progress=False)


def test_published_settings_come_from_the_data(data_dir):
    params = {**NeuSight.data_params(), **params_for("neusight")}
    pred = get("neusight", **params)
    folder = data_root() / "data" / "predictor" / "configs"
    for cls, stem in PUBLISHED_CONFIG_FILES.items():
        raw = json.loads((folder / f"{stem}.json").read_text())
        cfg = pred.configs[cls]
        assert (cfg["layers"], cfg["hidden"], cfg["lr"], cfg["batch"]) == (
            raw["num_layers"], raw["hidden_size"], raw["lr"], raw["train_batch"])
        assert raw["loss"] == "SMAPE"  # the fit loop's symmetric_error
        assert tuple(cfg["features"]) == FEATURES and cfg["form"] == "paper"
        assert cfg["val_frac"] == 0.2 and cfg["epochs"] == 100
        assert not cfg["pack_rows"] and cfg["tiles"] == "parsed"


def test_the_four_paper_features_by_hand():
    f = pd.DataFrame({"cls": ["linear"], "op": ["linear"], "B": [1.0], "M": [1000.0],
                      "N": [512.0], "K": [1000.0], "H": [np.nan], "tile_m": [128.0],
                      "tile_k": [64.0], "num_sm": [80.0], "peak_gflops": [16000.0],
                      "mem_bw": [900.0], "mem_gb": [32.0], "l2_mb": [6.0]})
    f = sizes.add_features(f, library=False)
    blocks = 8 * 16  # ceil(1000/128) x ceil(1000/64), no split of the reduction
    assert f["blocks"][0] == blocks and f["waves"][0] == 2 and f["split"][0] == 1
    tile_flops, tile_mb = 2 * 128 * 512 * 64, 4 * (128 * 512 + 512 * 64 + 128 * 64) / 2**20
    want = [tile_flops / (16000 / 1000 / 80), tile_mb / (900 / 80),
            2 * tile_mb / (32 * 1024 / 80), 2 * tile_mb / (6 * 1024 / 80)]
    assert tile_features(f, FEATURES)[0] == pytest.approx(np.log2(want))


def test_wave_law_is_gamma_minus_alpha_over_waves():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(1, 2)).repeat(4, axis=0)
    waves = np.array([1.0, 2.0, 4.0, 64.0])
    ctx = np.zeros((4, 6))
    ctx[:, 0], ctx[:, 1] = 1.0, waves
    u = 1.0 / wave_ms(raw, ctx, "paper")  # base / wave_ms
    g, a = 1 / (1 + np.exp(-raw[0, 1])), 1 / (1 + np.exp(-raw[0, 0]))
    assert u == pytest.approx(g - (a * g) / waves)  # alpha' = alpha * gamma < gamma
    assert (np.diff(u) > 0).all() and (u < g).all() and (u > 0).all()


def test_never_beats_the_roofline_and_sizes_gemms_without_split_k(fitted, small):
    te = small[1]
    assert (fitted.predict(te) >= sizes.roofline_ms(te) * (1 - 1e-9)).all()
    assert (fitted.predict(te, lookup=True) >= sizes.roofline_ms(te) * (1 - 1e-9)).all()
    # a long reduction on few tiles: nslib's design splits it, the paper's method does not
    f = pd.DataFrame({"cls": ["linear"], "op": ["linear"], "B": [1.0], "M": [64.0],
                      "N": [65536.0], "K": [64.0], "H": [np.nan], "num_sm": 108.0,
                      "peak_gflops": 19500.0, "mem_bw": 1555.0, "mem_gb": 40.0, "l2_mb": 40.0})
    sized = fitted._sized(fitted._filled(f))
    assert sized["split"][0] == 1 and sized["blocks"][0] == np.ceil(64 / sized["tile_m"][0]) * \
        np.ceil(64 / sized["tile_k"][0])
    library = sizes.add_features(sized)
    assert library["split"][0] > 1
    # the law's time is the waves of one-wave utilisation-scaled roofline time
    u = fitted.utilisation(f)[0]
    ctx = wave_context(sized)
    assert fitted.predict(f)[0] == pytest.approx(ctx[0, 1] * ctx[0, 0] / u)


def test_model_steps_are_plain_sums_of_kernel_latencies(fitted, small):
    frame = small[1].assign(phase="fw")
    assert np.allclose(step_ms(fitted, frame), fitted.predict(frame))


def test_names_say_which_method_is_the_papers(data_dir):
    desc = available()
    assert desc["neusight"].startswith("NeuSight as published")
    assert "NeuSight" not in desc["nslib"]
    assert predictor_class("neusight").plain_sum and not predictor_class("nslib").plain_sum


def test_trained_takes_the_published_settings_and_round_trips(data_dir, small, tmp_path):
    pred = trained("neusight", Settings(quick=True, progress=False))
    folder = data_root() / "data" / "predictor" / "configs"
    for cls, stem in PUBLISHED_CONFIG_FILES.items():
        raw = json.loads((folder / f"{stem}.json").read_text())
        # the quick profile shrinks the network and the batch, never the published lr
        assert pred.configs[cls]["lr"] == raw["lr"] and pred.configs[cls]["form"] == "paper"
    again = NeuSight.load(pred.save(tmp_path / "neusight.npz"))
    assert np.array_equal(again.predict(small[1]), pred.predict(small[1]))
    assert again.plain_sum and not again.library_sizing
