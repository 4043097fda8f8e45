"""NeuSight as published, and the per-class bounded MLP machinery nslib's own design builds on.

For each kernel class an MLP maps log2 features of the kernel and of the GPU
(:mod:`nslib.predictors.features`) to a few raw outputs that a *law*
(:mod:`nslib.predictors.wave_laws`) turns into time. :class:`NeuSight` is the paper's method
(Lee, Phanishayee, Mahajan, ASPLOS 2025; method.md sections 3-5) as published:

- features: the four per-SM-normalised tile features (:data:`FEATURES`);
- the wave law ``u = gamma - alpha / waves`` (form ``paper``), ``t = num_waves * (num_sm *
  tile_FLOPs) / (roofline * u)``, so no kernel beats its roofline;
- training on the symmetric percentage error of the per-wave latency, an 80/20 random
  train/validation split, the published network and optimiser settings read from the data's
  ``data/predictor/configs/MLP_WAVE_*.json`` (8 layers of 512, per-class learning rate and
  batch) and 100 epochs;
- GEMMs sized as method.md section 3 states (every block reads the whole reduction: no
  split-K, no matrix-vector tiling), softmax one row per block, tiles parsed from the kernel
  names and looked up on a GPU never profiled;
- kernels summed as they are at model level (the original tool's plain-sum aggregation).

:class:`nslib.predictors.nslib_design.NslibDesign` (``nslib``) is nslib's own redesign on
the same machinery (kernel laws, other features, row packing, split-K, dispatch floors); why it
differs: docs/decisions.md. A class may train an ensemble of MLPs from different
seeds; their utilisations are averaged.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from nslib.data.paths import data_root
from nslib.kernels import sizes
from nslib.kernels.tiles import TileLookup
from nslib.predictors.base import Predictor, by_class
from nslib.predictors.features import FEATURES, RowPacking, tile_features
from nslib.predictors.fitting import (MEMBER_SEED_STRIDE, Fit, random_split, symmetric_error,
                                      train_mlp)
from nslib.predictors.network import mlp_forward, mlp_weights
from nslib.predictors.scaling import fit_scaling, standardise
from nslib.predictors.wave_laws import FORMS, KERNEL_LAWS, OUTPUTS, array_ops, wave_context, wave_ms

DEFAULT_FEATURES = ("compute", "load")
VALIDATIONS = ("random", "gpu")
# NeuSight as published (method.md section 4): the paper's four features and wave law, the
# network of the published configs, 100 epochs, an 80/20 split, one row per softmax block and
# inputs as they are (no clipping). Learning rate and batch per class: PUBLISHED_CONFIG_FILES.
PUBLISHED = {"features": FEATURES, "form": "paper", "pack_rows": False, "layers": 8,
             "hidden": 512, "epochs": 100, "val": "random", "val_frac": 0.2, "clip": False,
             "tiles": "parsed"}
# class -> the published config file's stem under data/predictor/configs
PUBLISHED_CONFIG_FILES = {"bmm": "MLP_WAVE_BMM", "linear": "MLP_WAVE_LINEAR",
                          "elementwise": "MLP_WAVE_VEC", "softmax": "MLP_WAVE_SOFTMAX",
                          "layernorm": "MLP_WAVE_LN"}


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one class's MLP (the paper's: 8 x 512, AdamW, batch 128).

    ``features``: names for :func:`tile_features`; ``form``: the utilisation law of
    :func:`wave_ms`; ``pack_rows``: pack softmax rows into blocks (:class:`RowPacking`).
    ``lr`` per step, cosine-annealed to 0 over ``epochs``; ``batch`` in kernels.
    ``val``: how the epoch to keep is chosen: ``random`` (a random ``val_frac`` of the kernels)
    or ``gpu`` (the training GPU with the highest FP32 peak held out whole). ``ensemble``:
    MLPs trained from different seeds (and validation splits) whose utilisations are averaged
    (damps the seed-to-seed spread). ``clip``: clip the standardised inputs to the training
    range (a GPU with more SMs than any trained on is treated as the largest one seen).
    ``tiles``: ``parsed`` (each training kernel's own tile; looked up on a new GPU) or
    ``nominal`` (trained and predicted with the tile most training GPUs ran for the dims,
    :class:`nslib.kernels.tiles.TileLookup` with ``gpu_free``); nslib's design's GEMMs also
    take ``fastest`` (parsed, and on a new GPU the fastest of the training GPUs' choices).
    """

    layers: int = 4
    hidden: int = 128
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch: int = 256
    epochs: int = 60
    val_frac: float = 0.2
    features: tuple = DEFAULT_FEATURES
    form: str = "overhead"
    pack_rows: bool = True
    val: str = "random"
    ensemble: int = 1
    clip: bool = True
    tiles: str = "parsed"


def paper_config(cls: str, data=None) -> dict:
    """The published hyper-parameters of ``cls`` from ``data/predictor/configs/MLP_WAVE_*``:
    layers, hidden width, learning rate and batch (kernels)."""
    path = data_root(data) / "data" / "predictor" / "configs" / \
        f"{PUBLISHED_CONFIG_FILES[cls]}.json"
    try:
        raw = json.loads(path.read_text())
        return {"layers": int(raw["num_layers"]), "hidden": int(raw["hidden_size"]),
                "lr": float(raw["lr"]), "batch": int(raw["train_batch"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read NeuSight's published {cls} settings from {path} "
                         f"({type(e).__name__}: {e}): restore the file (`nslib fetch`)") from None


def _check_config(cls: str, cfg: dict, bounded: bool, tiles=("parsed", "nominal")) -> None:
    """Clear errors for a class config the predictor cannot train (``tiles``: the tile modes
    the predictor has)."""
    if cfg["form"] not in FORMS:
        raise ValueError(f"{cls}: unknown NeuSight form {cfg['form']!r}; known: {FORMS}")
    if cfg["tiles"] not in tiles:
        raise ValueError(f"{cls}: tiles must be one of {tiles}, got {cfg['tiles']!r}")
    if not bounded and cfg["form"] in KERNEL_LAWS:
        raise ValueError(f"{cls}: the unbounded MLP predicts whole-kernel latency; the kernel "
                         f"laws {KERNEL_LAWS} are for the bounded NeuSight")


class NeuSight(Predictor):
    """NeuSight as published: one tile/wave-bounded MLP per kernel class (module docstring)."""

    name = "neusight"
    description = ("NeuSight as published (Lee et al., ASPLOS 2025): per-class MLP of wave "
                   "utilisation u = gamma - alpha/waves, bounded by the roofline, kernels summed")
    bounded = True
    # the original tool sums kernel latencies as measured alone (nslib.model.stream)
    plain_sum = True
    # GEMMs sized as the library runs them (split-K, matrix-vector), or as method.md states
    library_sizing = False

    def __init__(self, seed: int = 0, configs: dict | None = None,
                 published: dict | None = None, **common):
        """``configs`` maps a class to TrainConfig fields; ``common`` applies to every class;
        ``published`` maps a class to the paper's settings (:meth:`data_params`).

        Precedence: ``configs[cls]`` over ``common`` over ``published[cls]`` over the class
        defaults (:meth:`class_defaults`) over TrainConfig.
        """
        self.seed = seed
        base = self.class_defaults()
        self.configs = {c: asdict(TrainConfig(**{**base.get(c, {}),
                                                  **(published or {}).get(c, {}), **common,
                                                  **(configs or {}).get(c, {})}))
                        for c in sizes.CLASSES}
        for c, cfg in self.configs.items():
            _check_config(c, cfg, self.bounded, self.tile_modes(c))
        # per class, each ensemble member's [W0, b0, W1, b1, ...] (float32 numpy): the
        # forward pass is numpy, so a cached prediction never imports torch
        self.models: dict[str, list[list[np.ndarray]]] = {}
        self.norm: dict[str, tuple[np.ndarray, ...]] = {}  # mean, std, clip lo, clip hi
        self.tiles = TileLookup()
        self.nominal = TileLookup(gpu_free=True)
        self.packing = RowPacking()
        self.history: dict[str, list] = {}

    @classmethod
    def tile_modes(cls, kernel_class: str) -> tuple[str, ...]:
        """The ``tiles`` settings a class of this predictor takes (TrainConfig)."""
        return ("parsed", "nominal")

    @classmethod
    def class_defaults(cls) -> dict:
        """``{class: TrainConfig fields}`` this predictor starts from: the paper's (:data:`PUBLISHED`)."""
        return {c: dict(PUBLISHED) for c in sizes.CLASSES}

    @classmethod
    def data_params(cls, data=None) -> dict:
        """Parameters that come from the data: the published per-class settings
        (:func:`paper_config`), as ``{"published": {class: fields}}``."""
        return {"published": {c: paper_config(c, data) for c in sizes.CLASSES}}

    def _filled(self, frame: pd.DataFrame, lookup: bool = False) -> pd.DataFrame:
        """``frame`` as priced (:meth:`priced_frame`) with its tiles filled (looked up where
        missing; all of them with ``lookup``), sized as this predictor sizes kernels."""
        return self.tiles.fill(self.priced_frame(frame), lookup_all=lookup,
                               library=self.library_sizing)

    def _sized(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` (featured, tiles filled) sized as this predictor's method sizes kernels:
        as method.md section 3 states for NeuSight as published (no split-K); a frame
        featured with the library's sizing (the measured tables) is sized again."""
        return frame if self.library_sizing else sizes.add_features(frame, library=False)

    # ----- the model of one class
    def _outputs(self, cls: str, frame: pd.DataFrame) -> np.ndarray:
        """Raw MLP outputs (n, outputs x members), float64: the members side by side."""
        z = self._inputs(cls, tile_features(frame, self.configs[cls]["features"]))
        return np.concatenate([mlp_forward(w, z) for w in self.models[cls]], axis=1)

    def _inputs(self, cls: str, feats: np.ndarray) -> np.ndarray:
        """Standardised MLP inputs (float64), clipped to the training range.

        Clipping makes a kernel larger than any trained on (more waves, a bigger footprint)
        saturate at the edge of what was learned instead of extrapolating the MLP freely;
        the wave count still enters through ``u`` and the roofline through the bound.
        """
        return standardise(feats, self.norm[cls])

    def _scale(self, frame: pd.DataFrame) -> np.ndarray:
        """What the MLP's time is multiplied by: the waves (bounded) or 1 (plain latency)."""
        return frame["waves"].to_numpy(float) if self.bounded else np.ones(len(frame))

    def _latency(self, cls: str, raw: np.ndarray, frame: pd.DataFrame) -> np.ndarray:
        """Latency in ms (float64) of each kernel from the MLP's raw outputs."""
        wave_ms = self._wave_ms(raw, wave_context(frame), self.configs[cls]["form"])
        return wave_ms * self._scale(frame)

    def utilisation(self, frame: pd.DataFrame) -> np.ndarray:
        """The predicted utilisation u in (0, 1] of each kernel (bounded model only): of one
        wave's roofline under the wave laws, of the kernel's roofline under the kernel laws."""
        frame = self._pack(self._nominal(self._sized(self._filled(frame))))
        out = np.empty(len(frame))
        for cls, idx, sub in by_class(frame):
            raw, ctx = self._outputs(cls, sub), wave_context(sub)
            form = self.configs[cls]["form"]
            # wave laws: of one wave's roofline; kernel laws: of the kernel's roofline
            ref = ctx[:, 5] / ctx[:, 1] if form in KERNEL_LAWS else ctx[:, 0]
            out[idx] = ref / wave_ms(raw, ctx, form)
        return out

    # ----- training (torch)
    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "NeuSight":
        self.tiles.fit(frame)
        self.nominal.fit(frame)
        self.packing.fit(frame)
        frame = self._pack(self._nominal(self._sized(frame)))
        for i, (cls, _, sub) in enumerate(by_class(frame)):
            self._fit_class(cls, sub.reset_index(drop=True), self.seed + i, progress)
        return self

    def _fit_class(self, cls: str, df: pd.DataFrame, seed: int, progress: bool) -> None:
        """Train class ``cls``'s MLPs (an ensemble's members from ``seed``, ``seed`` +
        :data:`MEMBER_SEED_STRIDE`, ...) on its kernels ``df``: the epoch with the best
        validation SMAPE is kept."""
        cfg = TrainConfig(**self.configs[cls])
        feats = tile_features(df, cfg.features)
        self.norm[cls] = fit_scaling(feats, clip=cfg.clip)
        x = self._inputs(cls, feats)
        target = df["latency_ms"].to_numpy(float) / self._scale(df)
        ctx, split = wave_context(df), validation_split(cfg, df)
        members, hists = [], []
        for k in range(cfg.ensemble):
            fit = Fit(hidden=cfg.hidden, layers=cfg.layers, epochs=cfg.epochs, batch=cfg.batch,
                      lr=cfg.lr, weight_decay=cfg.weight_decay, n_out=OUTPUTS.get(cfg.form, 2),
                      loss=symmetric_error, split=split,
                      head=lambda raw, c: self._wave_ms(raw, c, cfg.form),
                      seed=seed + MEMBER_SEED_STRIDE * k)
            model, hist = train_mlp(x, target, fit, ctx=ctx, progress=progress,
                                    desc=f"{self.name} {cls}")
            members.append(mlp_weights(model))
            hists.append(hist)
        self.models[cls] = members
        # per-epoch validation SMAPE (the members' mean for an ensemble)
        self.history[cls] = hists[0] if cfg.ensemble == 1 else [float(v) for v in np.mean(hists, axis=0)]

    def _wave_ms(self, raw, ctx, form="paper"):
        """Per-wave ms (bounded) or whole-kernel ms (unbounded) from raw MLP outputs (numpy
        arrays, or torch tensors in training)."""
        raw = raw.double() if hasattr(raw, "double") else raw
        if not self.bounded:
            return array_ops(raw).exp(raw[:, 0::2]).mean(1)
        return wave_ms(raw, ctx, form)

    # ----- prediction
    def _nominal(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Nominal tiles for the classes configured so (``tiles="nominal"``)."""
        classes = [c for c, cfg in self.configs.items() if cfg.get("tiles") == "nominal"]
        return self.nominal.nominal(frame, classes) if classes else frame

    def _pack(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Pack softmax rows into blocks (:class:`RowPacking`) for classes configured so."""
        classes = [c for c in RowPacking.CLASSES if self.configs[c].get("pack_rows", False)]
        if not classes or not frame["cls"].isin(classes).any():
            return frame
        return self.packing.apply(frame)

    def priced_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` as this predictor prices it (each kernel in its own class, as measured), so
        callers take the floor of the class that priced it."""
        return frame

    def predict(self, frame: pd.DataFrame, lookup: bool = False) -> np.ndarray:
        """Latency in ms per row; ``lookup=True`` ignores parsed tiles and looks all up."""
        frame = self._pack(self._nominal(self._sized(self._filled(frame, lookup))))
        out = np.empty(len(frame))
        for cls, idx, sub in by_class(frame):
            if cls not in self.models:
                raise ValueError(f"{self.name} has no trained {cls} model; train it first")
            out[idx] = self._latency(cls, self._outputs(cls, sub), sub)
        return out

    # ----- persistence
    def get_state(self) -> dict:
        return {"seed": self.seed, "configs": self.configs, "bounded": self.bounded,
                "models": self.models, "norm": self.norm,
                "tiles": self.tiles.get_state(), "nominal": self.nominal.get_state(),
                "packing": self.packing.get_state(), "history": self.history}

    def set_state(self, state: dict) -> None:
        if bool(state["bounded"]) != self.bounded:
            raise ValueError("bounded/unbounded mismatch")
        self.seed, self.configs, self.history = state["seed"], state["configs"], state["history"]
        self.models = {}
        for c, members in state["models"].items():
            cfg = TrainConfig(**self.configs[c])
            self.configs[c] = {**asdict(cfg), "features": tuple(cfg.features)}
            self.models[c] = [[np.asarray(a, np.float32) for a in w] for w in members]
            _check_weights(c, cfg, self.models[c])
        self.norm = {c: tuple(np.asarray(a, float) for a in arrs)
                     for c, arrs in state["norm"].items()}
        self.tiles = TileLookup.from_state(state["tiles"])
        self.nominal = TileLookup.from_state(state.get("nominal", {"_gpu_free": True}))
        self.packing = RowPacking.from_state(state.get("packing"))


def validation_split(cfg: TrainConfig, df: pd.DataFrame):
    """The ``(rng, n) -> (validation, training)`` rows of ``cfg.val`` for the kernels ``df``:
    ``random`` (a random ``val_frac``; none held out: the training rows validate) or ``gpu``
    (the training GPU with the highest FP32 peak held out whole)."""
    if cfg.val not in VALIDATIONS:
        raise ValueError(f"unknown NeuSight validation {cfg.val!r}; known: "
                         f"{', '.join(VALIDATIONS)}")

    def split(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
        if cfg.val == "gpu" and df["gpu"].nunique() > 1:
            perm = rng.permutation(n)
            top = df.groupby("gpu")["peak_gflops"].first().idxmax()
            held = (df["gpu"] == top).to_numpy()[perm]
            return perm[held], perm[~held]
        return random_split(rng, n, cfg.val_frac, validate_on_train=True)
    return split


def _check_weights(cls: str, cfg: TrainConfig, members: list) -> None:
    """ValueError unless ``members`` are the weights
    :func:`nslib.predictors.network.make_mlp` has for ``cfg``."""
    n_out = OUTPUTS.get(cfg.form, 2)
    dims = [len(cfg.features)] + [cfg.hidden] * cfg.layers + [n_out]
    want = [s for a, b in zip(dims, dims[1:]) for s in ((b, a), (b,))]
    if len(members) != cfg.ensemble:
        raise ValueError(f"{cls}: {len(members)} ensemble members, the config has "
                         f"{cfg.ensemble}")
    for w in members:
        got = [a.shape for a in w]
        if got != want:
            raise ValueError(f"{cls}: weight shapes {got} are not the config's {want}")
