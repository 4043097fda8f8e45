"""Leave-one-GPU-out evaluation (nslib eval-kernels --logo) and the host-only operators of the
label CSVs."""
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from nslib.data.settings import Settings
from nslib.evaluation.kernel_level import LOGO_MEAN, logo_json, logo_table, predict_logo
from nslib.kernels import measured
from nslib.predictors import trained, training


def test_roofline_logo_covers_every_gpu_and_matches_by_hand(data_dir):
    frame = predict_logo("roofline", Settings(progress=False))
    splits = measured.gpu_splits()
    held = sorted(frame.loc[frame["held_out"], "gpu"].unique())
    assert held == splits["train_gpus"]
    assert sorted(frame.loc[~frame["held_out"], "gpu"].unique()) == splits["new_gpus"]
    tab = logo_table(frame)
    gpu = held[0]
    sub = frame[(frame["gpu"] == gpu) & (frame["cls"] == "softmax")]
    by_hand = (100 * (sub["pred_ms"] - sub["latency_ms"]).abs() / sub["latency_ms"]).mean()
    assert tab.loc["softmax", gpu] == pytest.approx(by_hand)
    assert tab.loc["softmax", LOGO_MEAN] == pytest.approx(tab.loc["softmax", held].mean())
    out = logo_json(tab)
    assert set(out) == set(tab.index) and set(out["softmax"]) >= set(held)


def test_each_fold_trains_without_its_gpu_and_looks_its_tiles_up(data_dir, monkeypatch):
    seen, calls = [], []

    class Spy:
        tiles = None

        def __init__(self, held):
            self.held = held

        def predict(self, frame, lookup=False):
            calls.append((self.held, tuple(sorted(frame["gpu"].unique())), lookup))
            return np.ones(len(frame))

    def fake_trained(name, settings=None, exclude_gpus=(), **kw):
        seen.append(tuple(exclude_gpus))
        return Spy(tuple(exclude_gpus))

    monkeypatch.setattr("nslib.evaluation.kernel_level.trained", fake_trained)
    monkeypatch.setattr("nslib.predictors.trained", fake_trained)   # what the folds train
    predict_logo("linreg", Settings(progress=False))
    splits = measured.gpu_splits()
    assert sorted(seen) == sorted([(g,) for g in splits["train_gpus"]] + [()])
    for held, gpus, lookup in calls:
        # a fold predicts only its held-out GPU (the all-GPU model: the new GPUs), never
        # with the GPU's own parsed tiles
        assert gpus == (held if held else tuple(splits["new_gpus"])) and lookup


def test_folds_have_their_own_cache_key_and_unknown_gpus_are_refused(data_dir, monkeypatch):
    keys = []
    monkeypatch.setattr(training, "cache_key",
                        lambda name, params, data=None: keys.append(params) or "k")
    monkeypatch.setattr(training, "read_cache_entry", lambda *a, **k: SimpleNamespace())
    gpu = measured.gpu_splits()["train_gpus"][0]
    fold = trained("linreg", exclude_gpus=[gpu])
    whole = trained("linreg")
    assert keys[0]["exclude_gpus"] == [gpu] and "exclude_gpus" not in keys[1]
    # the predictor says what its training left out, wherever it is passed on fitted; the
    # roofline fits nothing, but its dispatch floors read the training kernels too
    assert fold.excluded_gpus == (gpu,) and whole.excluded_gpus == ()
    assert trained("roofline", exclude_gpus=[gpu]).excluded_gpus == (gpu,)
    assert trained("roofline").excluded_gpus == ()
    for name in ("linreg", "roofline"):
        with pytest.raises(ValueError, match="not training GPUs"):
            trained(name, exclude_gpus=["No Such GPU"])


def test_train_frame_excludes_a_gpu(data_dir):
    full = training.train_frame()
    gpu = full["gpu"].iloc[0]
    part = training.train_frame(exclude_gpus=[gpu])
    assert gpu not in set(part["gpu"]) and len(part) == (full["gpu"] != gpu).sum()


def test_cli_logo_json(data_dir, capsys):
    from nslib.cli.commands import main
    assert main(["eval-kernels", "--logo", "--predictor", "roofline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"bmm", "linear", "elementwise", "softmax", "layernorm"}
    assert all(isinstance(v, float) for per in out.values() for v in per.values())


def test_host_nodes_by_hand():
    from nslib.data.reference_graphs import host_nodes
    df = pd.DataFrame({"target": ["size", "<built-in function getitem>", "view", "contiguous",
                                  "transformer.h.0.mlp.c_fc", "<built-in method where of x>"],
                       "dtype": [None, "torch.float32", "torch.float32", "torch.float32",
                                 "torch.float32", "torch.float32"]})
    assert host_nodes(df).tolist() == [True, True, True, False, False, False]


def test_host_only_operators_overlap_gpu_work(data_dir):
    from nslib.evaluation.per_class import host_overlap
    h = host_overlap()
    assert len(h) and (h["host_ms"] > 0).all()
    # end to end, the kernel-launching operators alone account for the measured time better
    # than all timed operators do (median over every label with a CSV)
    assert abs(h["e2e_over_kernels"].median() - 1) < abs(h["e2e_over_all"].median() - 1)


# ---------------------------------------------------------------------------------------------
# Model level: each training GPU's labels priced by the fold that never saw it
# ---------------------------------------------------------------------------------------------

def test_model_level_folds_price_each_training_gpu_without_it(data_dir, monkeypatch):
    from nslib.evaluation import folds as folds_mod
    from nslib.evaluation.model_level import evaluate_models
    from nslib.model.stream import probe_kernels
    asked = []

    def fake_trained(name, settings=None, exclude_gpus=(), **kw):
        asked.append(tuple(exclude_gpus))
        # any fitted predictor, marked by `trained` as a fold's: the wiring is checked
        return trained("roofline", exclude_gpus=exclude_gpus)

    monkeypatch.setattr(folds_mod, "trained", fake_trained)
    import nslib.model.stream as stream
    floors_for = []   # (GPU the frame is on, GPUs the dispatch floor's ratios left out)
    real_probes = stream.probe_kernels

    def spy_probes(data=None, exclude_gpus=()):
        floors_for.append(tuple(exclude_gpus))
        return real_probes(data, exclude_gpus)

    monkeypatch.setattr(stream, "probe_kernels", spy_probes)
    splits = measured.gpu_splits()
    res = evaluate_models("inf", ["linreg"], models=["bert_large"], logo=True,
                          settings=Settings(progress=False))
    held = res[res["held_out"]]
    # the floors of each held-out GPU's labels were built without that GPU, the others' not
    per_label = res.drop_duplicates(["gpu_key", "tag"])
    expect = [(g,) if h else () for g, h in zip(per_label["gpu"], per_label["held_out"])]
    assert sorted(floors_for) == sorted(expect)
    # every training GPU with labels is held out from the predictor pricing it, by itself
    assert set(held["gpu"]) <= set(splits["train_gpus"]) and len(held)
    assert not res.loc[res["gpu"].isin(splits["new_gpus"]), "held_out"].any()
    assert set(asked) == {(g,) for g in held["gpu"].unique()} | (
        {()} if (~res["held_out"]).any() else set())
    # one fit per fold, reused for every label of its GPU
    assert len(asked) == len(set(asked))
    # the dispatch floor's class ratios leave the held-out GPU out too
    gpu = held["gpu"].iloc[0]
    without = probe_kernels(exclude_gpus=[gpu]).set_index("cls")["ratio"]
    lat = {}
    for cls in ("linear", "elementwise"):
        tab = measured.kernel_table(cls, "train")
        probe = probe_kernels().set_index("cls").loc[cls]
        same = np.ones(len(tab), bool)
        for c in ("op", "B", "M", "N", "K", "H"):
            if pd.notna(probe[c]):
                same &= (tab[c] == probe[c]).to_numpy()
        sub = tab[same & (tab["gpu"] != gpu).to_numpy()]
        lat[cls] = sub.groupby("gpu")["latency_ms"].median()
    assert without["linear"] == pytest.approx((lat["linear"] / lat["elementwise"]).median())


def test_model_logo_table_by_hand():
    from nslib.evaluation.kernel_level import WORST
    from nslib.evaluation.model_level import logo_table

    def res(errs, held):
        return pd.DataFrame([{"gpu": g, "predictor": "p", "err": e, "held_out": held}
                             for g, es in errs.items() for e in es])
    paper = res({"A": [2, 4], "B": [10], "N": [7]}, False)
    logo = pd.concat([res({"A": [6, 8], "B": [20]}, True), res({"N": [7]}, False)])
    tab = logo_table(paper, logo)
    assert list(tab.index) == ["p (paper protocol)", "p (leave-one-GPU-out)"]
    assert list(tab.columns[:2]) == ["A", "B"]        # new GPUs (N) are not held out
    assert tab.loc["p (paper protocol)", "A"] == 3 and tab.loc["p (leave-one-GPU-out)", "A"] == 7
    assert tab.loc["p (leave-one-GPU-out)", LOGO_MEAN] == 13.5
    assert tab.loc["p (leave-one-GPU-out)", WORST] == 20


def test_folds_take_fitted_predictors_only_under_the_paper_protocol(data_dir):
    from nslib.evaluation.folds import Folds
    fitted = trained("roofline")
    gpu = measured.gpu_splits()["train_gpus"][0]
    assert Folds(logo=False).predictor(fitted, gpu) is fitted
    with pytest.raises(ValueError, match="name"):
        Folds(logo=True).predictor(fitted, gpu)
