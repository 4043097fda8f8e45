"""nslib's own bounded design (``nslib``): NeuSight's machinery with physical kernel laws.

It keeps NeuSight's idea (a per-class MLP whose learned efficiency is bounded by the hardware)
and changes what the MLP sees and how its outputs make a time, chosen on leave-one-GPU-out
error over the training GPUs (docs/decisions.md):

- kernel laws (:mod:`nslib.predictors.wave_laws`): ``series`` for GEMMs over the tile shape,
  the reduction per slice and the SM count (clipped to the training range); ``stream`` for
  memory-bound classes over the bytes a block moves, the blocks and the SM count, so peak and
  bandwidth act only through physical terms;
- GEMMs sized as the library runs them: split-K, and a matrix-vector product priced as the
  stream over the matrix it is (:func:`nslib.kernels.sizes.gemv_as_stream`);
- a GEMM's FP32 rate at most what its SMs issue as FFMAs (:mod:`nslib.kernels.issue_rate`:
  128 lanes per SM do not double SGEMM) and what its board's power pays for
  (:mod:`nslib.kernels.power`, FLOP per joule learned from the training GPUs);
- long training GEMMs of a campaign that throttled left out of training
  (:mod:`nslib.predictors.throttle`);
- optionally (a GEMM class's ``tiles="fastest"``; not the default, docs/decisions.md
  section 3), on a GPU never profiled, each GEMM at the fastest of the tiles the training
  GPUs' libraries chose for its dims, priced on its datasheet (else the nearest GPU's tile);
- softmax rows packed into blocks as PyTorch launches them, the row length an input (PyTorch
  picks the kernel by it) and a long row's repeated reads from DRAM where the rows in flight
  overflow the L2 (:mod:`nslib.kernels.row_cache`); ensembles and epochs of
  :data:`nslib.predictors.training.DEFAULTS`;
- at model level, each kernel's microbenchmark dispatch floor off and a phase no faster than
  its host dispatches (:mod:`nslib.model.stream`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nslib.kernels import issue_rate, power, row_cache, sizes
from nslib.kernels.tiles import TILE_NAMES
from nslib.predictors import throttle
from nslib.predictors.neusight import NeuSight

GEMM_DEFAULTS = {"features": ("tile_m", "tile_k", "reduction", "num_sm"), "form": "series",
                 "clip": True}
VECTOR_DEFAULTS = {"features": ("tile_kb", "blocks", "num_sm"), "form": "stream"}
# softmax: the row length tells PyTorch's warp kernel (a row in registers) from its block kernel
# (three sweeps of a row), which move the same bytes per block at different rates
CLASS_DEFAULTS = {"elementwise": dict(VECTOR_DEFAULTS),
                  "softmax": {**VECTOR_DEFAULTS,
                              "features": VECTOR_DEFAULTS["features"] + ("row",)},
                  "layernorm": dict(VECTOR_DEFAULTS), "bmm": dict(GEMM_DEFAULTS),
                  "linear": dict(GEMM_DEFAULTS)}


class NslibDesign(NeuSight):
    """nslib's bounded design (module docstring); ``nslib predict``'s default predictor."""

    name = "nslib"
    description = ("nslib's design: per-class MLP efficiencies of physical kernel laws "
                   "(series, stream), split-K, dispatch floors")
    plain_sum = False
    library_sizing = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.power_eta: float | None = None  # GFLOP/s per W of TDP (power.learned_eta)

    @classmethod
    def class_defaults(cls) -> dict:
        """The kernel laws per class (:data:`CLASS_DEFAULTS`) over TrainConfig's network."""
        return {c: dict(v) for c, v in CLASS_DEFAULTS.items()}

    @classmethod
    def data_params(cls, data=None) -> dict:
        """Nothing comes from the data's published configs."""
        return {}

    @classmethod
    def tile_modes(cls, kernel_class: str) -> tuple[str, ...]:
        """NeuSight's tile settings, and ``fastest`` for GEMMs (:meth:`_fastest_tiles`)."""
        fastest = ("fastest",) if kernel_class in sizes.GEMM_CLASSES else ()
        return super().tile_modes(kernel_class) + fastest

    def _filled(self, frame: pd.DataFrame, lookup: bool = False) -> pd.DataFrame:
        """NeuSight's filled frame with each FP32 GEMM's peak at most what its SMs issue
        (:func:`issue_rate.bounded`), after the tile lookup: the tile a library picks does not
        change with the issue rate."""
        return issue_rate.bounded(super()._filled(frame, lookup))

    def _pack(self, frame: pd.DataFrame) -> pd.DataFrame:
        """NeuSight's packed frame with a long softmax row's repeated reads in its bytes where
        the rows in flight overflow the L2 (:func:`row_cache.with_rereads`), in training and
        in prediction alike."""
        return row_cache.with_rereads(super()._pack(frame))

    def priced_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` as this predictor prices it: matrix-vector GEMMs as the stream they are
        (:func:`sizes.gemv_as_stream`), so callers take the floor of the class that priced it."""
        return sizes.gemv_as_stream(frame)

    def fit(self, frame: pd.DataFrame, progress: bool = True) -> "NslibDesign":
        """NeuSight's fit on the training kernels less a throttled campaign's long GEMMs
        (:func:`throttle.throttled`), then the power bound's FLOP per joule from them
        (:func:`power.learned_eta`; off when the frame has no ``tdp_w``)."""
        frame = frame[~throttle.throttled(frame)]
        super().fit(frame, progress)
        self.power_eta = power.learned_eta(frame)
        return self

    def predict(self, frame: pd.DataFrame, lookup: bool = False) -> np.ndarray:
        """NeuSight's latency (ms per row), each GEMM no faster than its board's power allows
        (:func:`power.bounded`, on the frame as priced: a matrix-vector product is a stream).
        With ``tiles="fastest"``, a GEMM on a GPU whose library was never profiled runs the
        fastest, as priced on its datasheet, of the tiles the training GPUs' libraries chose
        for its dims (:meth:`_fastest_tiles`)."""
        out = self._bounded(frame, lookup)
        for cls in sizes.GEMM_CLASSES:
            if self.configs[cls].get("tiles") != "fastest":
                continue
            rows = self._unprofiled(frame, cls, lookup)
            if rows.any():
                out[rows] = self._fastest_tiles(frame[rows], cls)
        return out

    def _bounded(self, frame: pd.DataFrame, lookup: bool = False) -> np.ndarray:
        """NeuSight's latency with its tiles as given or looked up (the nearest GPU's), each
        GEMM no slower than its board's power allows."""
        return power.bounded(super().predict(frame, lookup), self.priced_frame(frame),
                             self.power_eta)

    def _unprofiled(self, frame: pd.DataFrame, cls: str, lookup: bool) -> np.ndarray:
        """Rows of GEMM class ``cls`` whose tile is looked up (none parsed, or ``lookup``) on a
        GPU none of whose kernels are in the tile table."""
        rows = (frame["cls"] == cls).to_numpy().copy()
        if not rows.any() or cls not in self.tiles.tables:
            return np.zeros(len(frame), bool)
        cols = self.tiles.tables[cls]["cols"]
        if not lookup and all(c in frame for c in cols):
            rows &= ~np.isfinite(frame[cols].to_numpy(float)).all(axis=1)
        rows[rows] = ~self.tiles.known(frame[rows], cls)
        return rows

    def _fastest_tiles(self, frame: pd.DataFrame, cls: str) -> np.ndarray:
        """Latency (ms) of each GEMM row at the fastest of the training GPUs' tile choices
        for its dims (:meth:`TileLookup.choices`), each priced on the row's own datasheet.

        Why: a library runs the kernel its heuristics or autotuning find fastest on the GPU
        at hand; which one that is on a new GPU is unknown, but it is one of the tiles some
        GPU's library runs for those dims. The nearest GPU's choice suits its own SM count
        and memory, not the new GPU's, and switches as a datasheet figure crosses another
        GPU's, which made a GEMM slower on a GPU with more bandwidth. The fastest of a fixed
        set of choices, each no slower with more of any resource, is no slower either."""
        cols = self.tiles.tables[cls]["cols"]
        # every tile column present (NaN where none): the lookup keeps the given tiles
        base = frame.assign(**{c: np.nan for c in TILE_NAMES if c not in frame})
        best = np.full(len(frame), np.inf)
        for tiles in self.tiles.choices(frame, cls):
            best = np.minimum(best, self._bounded(base.assign(**dict(zip(cols, tiles.T)))))
        return best

    def get_state(self) -> dict:
        return {**super().get_state(), "power_eta": self.power_eta}

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.power_eta = state.get("power_eta")
