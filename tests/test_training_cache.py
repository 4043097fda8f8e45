"""Training in the open: --epochs per class, announced training, damaged weights rebuilt,
unfinished fits never saved, and training keys that depend only on the training data."""
from __future__ import annotations

import json
import shutil

import pytest

from nslib.data.settings import Settings
from nslib.kernels import measured
from nslib.predictors import trained, training

QUIET = Settings(progress=False)


@pytest.mark.parametrize("name,quick", [("nslib", False), ("nslib", True),
                                        ("mlp", False), ("habitat", True)])
def test_epochs_reach_every_class(name, quick):
    from nslib.predictors import get
    params = training.params_for(name, quick, epochs=7)
    pred = get(name, **params)
    if name == "habitat":
        assert pred.params["epochs"] == 7
    else:
        assert {c: cfg["epochs"] for c, cfg in pred.configs.items()} == \
            {c: 7 for c in pred.configs}


def test_defaults_keep_their_per_class_epochs():
    params = training.params_for("nslib")
    assert params["configs"]["linear"]["epochs"] == 15  # only an explicit --epochs overrides


@pytest.mark.parametrize("name,epochs,words", [
    ("li", 3, "not trained in epochs"), ("xgboost", 3, "not trained in epochs"),
    ("linreg", 3, "not trained in epochs"), ("roofline", 3, "not trained in epochs"),
    ("habitat", 0, "epochs must be positive"), ("nslib", -1, "epochs must be positive"),
    ("mlp", 2.5, "epochs must be an integer"), ("nslib", True, "epochs must be a number"),
])
def test_bad_epochs(name, epochs, words):
    with pytest.raises(ValueError, match=words):
        training.params_for(name, epochs=epochs)


@pytest.fixture
def tiny_training(data_dir, tmp_path, monkeypatch):
    """trained() on the small layernorm test table, under a fixed key, in a private folder."""
    frame = measured.kernel_table("layernorm", "test")
    monkeypatch.setattr(training, "train_frame", lambda data=None, exclude_gpus=(): frame)
    monkeypatch.setattr(training, "cache_key", lambda name, params, data=None: "k1")
    monkeypatch.setattr(measured, "train_hash", lambda data=None: "h1")
    return tmp_path / "weights"


def test_training_is_announced_and_cached(tiny_training, capsys):
    trained("linreg", QUIET, out=tiny_training)
    err = capsys.readouterr().err
    assert "training the linreg predictor (full profile, key k1)" in err
    assert "no cached weights for this training data" in err and "Roughly" in err
    assert (tiny_training / "linreg-k1.npz").is_file()
    meta = json.loads((tiny_training / "linreg-k1.json").read_text())
    assert meta["profile"] == "full" and meta["train_hash"] == "h1"
    trained("linreg", QUIET, out=tiny_training)
    assert capsys.readouterr().err == ""  # cached: silent
    assert training._rough_time("linreg", False, tiny_training).endswith(" s")


def test_damaged_weights_are_retrained_with_a_note(tiny_training, capsys):
    trained("linreg", QUIET, out=tiny_training)
    path = tiny_training / "linreg-k1.npz"
    path.write_bytes(path.read_bytes()[:40])
    capsys.readouterr()
    pred = trained("linreg", QUIET, out=tiny_training)
    err = capsys.readouterr().err
    assert "cached linreg predictor linreg-k1.npz is damaged" in err and "training" in err
    assert pred.predict(measured.kernel_table("layernorm", "test")).shape[0] > 0
    assert path.stat().st_size > 40


def test_unfinished_fit_is_never_saved(tiny_training, monkeypatch):
    from nslib.predictors.regression import LinearRegression

    def interrupted(self, frame, progress=True):
        raise KeyboardInterrupt
    monkeypatch.setattr(LinearRegression, "fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trained("linreg", QUIET, out=tiny_training)
    assert not tiny_training.exists() or not any(tiny_training.iterdir())
    with pytest.raises(ValueError, match="epochs must be positive"):
        trained("habitat", out=tiny_training, epochs=0)
    assert not tiny_training.exists() or not any(tiny_training.iterdir())


def test_a_datasheet_only_gpu_changes_no_table_key(data_dir, tmp_path, monkeypatch):
    root = tmp_path / "d"
    (root / "data" / "dataset").mkdir(parents=True)
    (root / "data" / "dataset" / "test").symlink_to(data_dir / "data" / "dataset" / "test")
    shutil.copytree(data_dir / "data" / "device_configs", root / "data" / "device_configs")
    monkeypatch.setenv("NSLIB_DATA", str(root))
    before = measured.table_key("layernorm", "test")
    spec = {"Device": "Datasheet Only GPU", "Dev_Mem": 24, "Mem_Bw": 300, "Num_Sm": 58,
            "Core_Per_SM": 128, "Freq": 2040, "SingleFLOPs": 30300, "L2Cache": 48}
    (root / "data" / "device_configs" / "Datasheet_Only_GPU.json").write_text(json.dumps(spec))
    assert measured.table_key("layernorm", "test") == before
    # a datasheet of a GPU measured in the table does change it
    devices = measured.measured_devices(measured.source_files("layernorm", "test"))
    from nslib.data.gpus import find_gpu, load_gpus
    key = find_gpu(devices[0], load_gpus()).key
    cfg = root / "data" / "device_configs" / f"{key}.json"
    raw = json.loads(cfg.read_text())
    cfg.write_text(json.dumps({**raw, "Mem_Bw": raw["Mem_Bw"] * 2}))
    assert measured.table_key("layernorm", "test") != before


def test_training_key_ignores_the_test_split(monkeypatch, data_dir):
    calls = []
    real = measured.table_key

    def spy(cls, split, data=None):
        calls.append(split)
        return real(cls, split, data)
    monkeypatch.setattr(measured, "table_key", spy)
    measured.train_hash()
    assert set(calls) == {"train"}


def test_train_all_trains_every_learning_predictor(monkeypatch):
    from nslib.predictors import available
    seen = []
    monkeypatch.setattr(training, "cached_fit",
                        lambda name, settings=None, **kw: seen.append((name, settings)))
    names = training.train_all(Settings(quick=True))
    assert [n for n, _ in seen] == names
    assert set(names) == set(available()) - {"roofline"}
    assert all(s.quick for _, s in seen)


def test_damaged_trace_is_rebuilt_with_a_note(monkeypatch, tmp_path, capsys):
    import pandas as pd

    from nslib.model import inputs
    monkeypatch.setenv("NSLIB_CACHE", str(tmp_path))
    frame = pd.DataFrame({"op": ["addu"], "inputs": [(1, 2)], "B": [1.0]})
    for c in inputs.TUPLE_COLUMNS:  # a trace's tuple columns (inputs, memory events)
        if c != "inputs":
            frame[c] = [(3,)]
    monkeypatch.setattr(inputs, "trace", lambda config, step, **kw: frame.copy())
    inputs._traced.cache_clear()
    first = inputs._traced("k", "{}", 1, 8, "inf")
    entry = tmp_path / "traces" / "k.parquet"
    entry.write_bytes(entry.read_bytes()[:30])
    inputs._traced.cache_clear()
    again = inputs._traced("k", "{}", 1, 8, "inf")
    inputs._traced.cache_clear()
    assert "cached model trace k.parquet is damaged" in capsys.readouterr().err
    assert again["inputs"].tolist() == first["inputs"].tolist() == [(1, 2)]
