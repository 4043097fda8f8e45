"""Habitat baseline (Yu et al., ATC 2021), method.md section 7.

Two halves, as in the original tool:

- **GEMMs (bmm, linear)**: one MLP per class from standardised ``log2`` dims ``(B, M, N, K)``
  and ``log2`` GPU datasheet features (``num_sm, peak_gflops, mem_bw, mem_gb, l2_mb``)
  straight to ``ln(latency in ms)``. Nothing bounds its output: on a GPU faster than any in
  training it extrapolates freely (the point of comparing it with NeuSight).
- **Vector ops (elementwise, softmax, layernorm)**: *wave scaling* of a kernel measured on a
  reference GPU (a training GPU; by default the one with the highest memory bandwidth in the
  training frame, or ``reference=<Device string>``). Habitat's wave-scaling rule is

      T_t = ceil(blocks / W_t) / ceil(blocks / W_r) * (D_r * W_t / (D_t * W_r))**g
            * (C_r / C_t)**(1 - g) * T_r

  with ``W`` the wave size (blocks resident at once), ``D`` the memory bandwidth, ``C`` the
  clock and ``g`` the kernel's memory-boundedness. Here ``W = num_sm`` (one block per SM per
  wave, the wave definition of method.md section 3; the data has no occupancy for an unseen
  GPU) and ``g = 1``: these ops do 1/12 to 6/8 FLOP per byte, far below every GPU's ridge
  point, so they are memory bound (the data has no clock column either). So

      T_t = T_r * bw_r / bw_t * [ceil(blocks / sm_t) / ceil(blocks / sm_r)] * (sm_t / sm_r)

  For many waves the bracket times ``sm_t / sm_r`` tends to 1 and only the bandwidth ratio
  remains; for partial waves it charges the tail wave. ``blocks`` is the reference kernel's
  block count (Habitat assumes the same launch on both GPUs): ``B`` for softmax/layernorm (one
  row per block), ``ceil(B*H / tile)`` for elementwise with the reference's tile.

The reference measurements are a lookup table keyed by ``(op, B, H)`` (duplicate measurements
averaged) stored in the state. A kernel whose dims were never measured on the reference takes
the measured kernel of the same op nearest in ``log2(B*H)`` (ties: nearest ``log2 H``), its
latency scaled by the element-count ratio ``B*H / (B_ref*H_ref)`` (and, for elementwise, its
block count by the same ratio through the reference tile). Such rows are counted in
``last_missing`` and each ``predict`` call that had any emits one ``warnings.warn``. Note that
the test split's vector kernels are larger than any training kernel, so none of them has an
exact reference: on that split this half is the element-count extrapolation throughout.
"""
from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pandas as pd
import torch
from scipy.spatial import cKDTree

from nslib.kernels import sizes
from nslib.kernels.measured import GEMM_DIMS
from nslib.predictors.base import Predictor, by_class, with_defaults
from nslib.predictors.fitting import Fit, log_space_ape, mse, random_split, train_mlp
from nslib.predictors.network import make_mlp
from nslib.predictors.scaling import mean_std

_H_TIEBREAK = 1e-3  # weight of log2 H next to log2 element count in the nearest-kernel search


def gemm_inputs(frame: pd.DataFrame) -> np.ndarray:
    """The (n, 9) raw MLP inputs: log2 of B, M, N, K and of the five GPU datasheet columns."""
    cols = [frame[c].to_numpy(float) for c in (*GEMM_DIMS, *sizes.GPU_COLS)]
    return np.log2(np.column_stack(cols))


def wave_scale(blocks, sm_ref, bw_ref, sm_t, bw_t) -> np.ndarray:
    """Habitat's memory-bound wave-scaling factor from the reference GPU to the target.

    ``ceil(blocks/sm_t) / ceil(blocks/sm_ref) * (sm_t/sm_ref) * (bw_ref/bw_t)``; see the
    module docstring for where it comes from.
    """
    blocks = np.maximum(np.asarray(blocks, float), 1.0)
    sm_t, bw_t = np.asarray(sm_t, float), np.asarray(bw_t, float)
    waves = np.ceil(blocks / sm_t) / np.ceil(blocks / sm_ref)
    return waves * (sm_t / sm_ref) * (bw_ref / bw_t)


class Habitat(Predictor):
    name = "habitat"
    description = ("Habitat: MLP on dims + GPU features for GEMMs; wave scaling from a "
                   "reference GPU for vector ops")

    # the fit's settings: ``reference`` GPU of the vector ops (None: the training GPU with the
    # highest memory bandwidth), the GEMM MLP (layers x hidden, AdamW lr / weight decay, batch,
    # epochs, early stop ``patience`` epochs after the best validation MAPE on a ``val_frac``
    # share) and ``threads``: torch CPU threads while training (restored afterwards). One is
    # the default: on a shared 2-core machine two OpenMP threads ran an epoch 10x slower, and
    # one thread also makes the fit independent of the machine's core count.
    DEFAULTS = {"reference": None, "layers": 4, "hidden": 256, "lr": 1e-3,
                "weight_decay": 1e-4, "batch": 512, "epochs": 60, "patience": 8,
                "val_frac": 0.2, "threads": 1}

    def __init__(self, seed: int = 0, **params):
        """``params``: changes to :attr:`DEFAULTS`; an unknown name is a TypeError."""
        self.seed = seed
        self.params = with_defaults("Habitat", self.DEFAULTS, params)
        self.models: dict[str, torch.nn.Module] = {}
        self.norm: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.history: dict[str, list] = {}
        self.reference: str | None = None
        self.ref_gpu: dict[str, float] = {}
        self.ref_table: dict[str, dict[str, np.ndarray]] = {}
        self.last_missing = 0
        self.last_vector = 0

    # ----- training
    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "Habitat":
        before = torch.get_num_threads()
        torch.set_num_threads(int(self.params.get("threads") or before))
        try:
            for i, (cls, _, sub) in enumerate(by_class(frame)):
                if cls in sizes.GEMM_CLASSES:
                    self._fit_mlp(cls, sub.reset_index(drop=True), self.seed + i, progress)
        finally:
            torch.set_num_threads(before)
        vec = frame[frame["cls"].isin(sizes.VECTOR_CLASSES)]
        if len(vec):
            self._fit_reference(vec)
        return self

    def _fit_mlp(self, cls: str, df: pd.DataFrame, seed: int, progress: bool) -> None:
        """Train class ``cls``'s MLP on its kernels ``df``: squared error of ``ln(ms)``,
        stopped early on the validation MAPE (the paper's metric)."""
        p = self.params
        raw = gemm_inputs(df)
        mean, std = mean_std(raw)
        self.norm[cls] = (mean, std)
        fit = Fit(hidden=p["hidden"], layers=p["layers"], epochs=p["epochs"], batch=p["batch"],
                  lr=p["lr"], weight_decay=p["weight_decay"], n_out=1, loss=mse,
                  val_loss=log_space_ape, patience=p["patience"], seed=seed,
                  split=partial(random_split, val_frac=p["val_frac"], validate_on_train=True))
        model, hist = train_mlp((raw - mean) / std,
                                np.log(df["latency_ms"].to_numpy(float))[:, None], fit,
                                progress=progress, desc=f"{self.name} {cls}")
        model.eval()
        self.models[cls] = model
        self.history[cls] = hist

    def _fit_reference(self, vec: pd.DataFrame) -> None:
        ref = self.params["reference"]
        if ref is None:  # the training GPU with the highest memory bandwidth
            by_bw = vec.groupby("gpu")["mem_bw"].first()
            ref = str(by_bw.index[int(np.argmax(by_bw.to_numpy()))])
        sub = vec[vec["gpu"] == ref]
        if not len(sub):
            raise ValueError(f"reference GPU {ref!r} has no vector kernels in the training "
                             f"frame; measured GPUs: {sorted(vec['gpu'].unique())}")
        self.reference = ref
        self.ref_gpu = {"num_sm": float(sub["num_sm"].iloc[0]),
                        "mem_bw": float(sub["mem_bw"].iloc[0])}
        if "blocks" not in sub:
            sub = sizes.add_features(sub)
        grouped = (sub.groupby(["op", "B", "H"], sort=True)
                   .agg(lat=("latency_ms", "mean"), blocks=("blocks", "first")).reset_index())
        self.ref_table = {str(op): {k: g[k].to_numpy(float, copy=True)
                                    for k in ("B", "H", "lat", "blocks")}
                          for op, g in grouped.groupby("op", sort=True)}
        self._trees = {}

    # ----- prediction
    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        sizes.validate_dims(frame)
        out = np.empty(len(frame))
        missing = n_vec = 0
        for cls, idx, sub in by_class(frame):
            if cls in sizes.GEMM_CLASSES:
                if cls not in self.models:
                    raise ValueError(f"habitat has no trained {cls} model; train it first")
                z = (gemm_inputs(sub) - self.norm[cls][0]) / self.norm[cls][1]
                with torch.no_grad():
                    raw = self.models[cls](torch.from_numpy(z.astype(np.float32)))[:, 0]
                out[idx] = np.exp(raw.double().numpy())
            elif cls in sizes.VECTOR_CLASSES:
                out[idx], miss = self._scale_vector(cls, sub)
                missing += miss
                n_vec += len(sub)
            else:
                raise ValueError(f"habitat cannot predict kernel class {cls!r}")
        self.last_missing, self.last_vector = int(missing), int(n_vec)
        if missing:
            warnings.warn(f"habitat: {missing} of {n_vec} vector kernels had no reference "
                          f"measurement on {self.reference} with the same op and dims; they "
                          "were extrapolated from the nearest measured kernel by element count",
                          stacklevel=2)
        return out

    def _tree(self, op: str):
        trees = self.__dict__.setdefault("_trees", {})
        if op not in trees:
            t = self.ref_table[op]
            trees[op] = cKDTree(np.column_stack([np.log2(t["B"] * t["H"]),
                                                 _H_TIEBREAK * np.log2(t["H"])]))
        return trees[op]

    def _scale_vector(self, cls: str, sub: pd.DataFrame) -> tuple[np.ndarray, int]:
        """Latency of each vector kernel on its GPU, and how many had no exact reference."""
        if not self.ref_table:
            raise ValueError("habitat has no reference measurements for vector ops; train it "
                             "on a frame with elementwise/softmax/layernorm kernels")
        B, H = sub["B"].to_numpy(float), sub["H"].to_numpy(float)
        ops = sub["op"].to_numpy()
        lat_r, blocks, exact = np.empty(len(sub)), np.empty(len(sub)), np.zeros(len(sub), bool)
        for name in pd.unique(ops):
            m = np.flatnonzero(ops == name)
            # a backward op (never measured) is its forward op moving more bytes: Habitat's
            # memory-bound scaling, by the bytes ratio
            op, more = sizes.FORWARD_OP.get(name, name), sizes.bytes_ratio_to_forward(name)
            if op not in self.ref_table:
                raise ValueError(f"habitat: op {op!r} was never measured on the reference GPU "
                                 f"{self.reference}; measured ops: {sorted(self.ref_table)}")
            t = self.ref_table[op]
            keys = pd.MultiIndex.from_arrays([t["B"], t["H"]])
            pos = keys.get_indexer(pd.MultiIndex.from_arrays([B[m], H[m]]))
            hit = pos >= 0
            exact[m[hit]] = True
            lat_r[m[hit]], blocks[m[hit]] = t["lat"][pos[hit]], t["blocks"][pos[hit]]
            miss = m[~hit]
            if len(miss):
                n = B[miss] * H[miss]
                _, j = self._tree(op).query(np.column_stack([np.log2(n),
                                                             _H_TIEBREAK * np.log2(H[miss])]))
                ratio = n / (t["B"][j] * t["H"][j])
                lat_r[miss] = t["lat"][j] * ratio
                blocks[miss] = B[miss] if cls != "elementwise" else \
                    np.ceil(t["blocks"][j] * ratio)
            lat_r[m] *= more
        scale = wave_scale(blocks, self.ref_gpu["num_sm"], self.ref_gpu["mem_bw"],
                           sub["num_sm"].to_numpy(float), sub["mem_bw"].to_numpy(float))
        return lat_r * scale, int((~exact).sum())

    # ----- persistence
    def get_state(self) -> dict:
        return {"seed": self.seed, "params": dict(self.params), "reference": self.reference,
                "ref_gpu": dict(self.ref_gpu),
                "ref_table": {op: {k: torch.from_numpy(v) for k, v in t.items()}
                              for op, t in self.ref_table.items()},
                "models": {c: m.state_dict() for c, m in self.models.items()},
                "norm": {c: [torch.from_numpy(a) for a in arrs] for c, arrs in self.norm.items()},
                "history": self.history}

    def set_state(self, state: dict) -> None:
        self.seed, self.params = state["seed"], dict(state["params"])
        self.reference, self.ref_gpu = state["reference"], dict(state["ref_gpu"])
        self.ref_table = {op: {k: v.numpy() for k, v in t.items()}
                          for op, t in state["ref_table"].items()}
        self.norm = {c: tuple(a.numpy() for a in arrs) for c, arrs in state["norm"].items()}
        self.models = {}
        for c, sd in state["models"].items():
            m = make_mlp(len(self.norm[c][0]), self.params["layers"], self.params["hidden"], 1)
            m.load_state_dict(sd)
            m.eval()
            self.models[c] = m
        self.history = state["history"]
        self.last_missing = self.last_vector = 0
        self._trees = {}
