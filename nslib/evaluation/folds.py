"""Which trained predictor prices a label: the paper's protocol or leave-one-GPU-out.

Under the paper's protocol every label is priced by the predictor trained on every training
GPU. Under leave-one-GPU-out a training GPU's labels are priced by the predictor of the fold
that held that GPU out (its kernels never seen, its tiles looked up), so the GPU is as new to
the forecast as a GPU nobody measured; GPUs without training kernels (the new GPUs) keep the
predictor trained on every training GPU, as in :func:`nslib.evaluation.kernel_level.predict_logo`.
"""
from __future__ import annotations

from nslib.kernels import measured
from nslib.predictors.training import trained

PAPER, LOGO = "paper protocol", "leave-one-GPU-out"


class Folds:
    """Trained predictors per (name, fold), each trained or read from the cache once.

    ``logo``: hold each training GPU out of the predictor that prices it (see module doc).
    ``data``, ``quick``, ``seed``: as :func:`nslib.predictors.training.trained`.
    """

    def __init__(self, logo: bool = False, data=None, quick: bool = False, seed: int = 0):
        self.logo, self.data, self.quick, self.seed = bool(logo), data, quick, seed
        self._train = set(measured.gpu_splits(data)["train_gpus"]) if logo else set()
        self._memo: dict = {}

    def held_out(self, gpu: str) -> bool:
        """Whether ``gpu`` (a Device name) is priced by a fold that never saw it."""
        return gpu in self._train

    def predictor(self, name, gpu: str):
        """The fitted predictor ``name`` that prices labels of ``gpu`` (a Device name). A
        predictor passed already fitted prices every GPU as it is (it cannot be refitted per
        fold, so leave-one-GPU-out needs a name)."""
        held = (gpu,) if self.held_out(gpu) else ()
        if not isinstance(name, str):
            if held:
                raise ValueError("leave-one-GPU-out trains one predictor per held-out GPU: "
                                 "give the predictor's name, not a fitted predictor")
            return name
        key = (name, held)
        if key not in self._memo:
            # the paper-protocol predictor shows its bars (its first training is long); a
            # fold's training is announced on stderr by `trained` either way. A fold's predictor
            # records its held-out GPU (`excluded_gpus`): the dispatch floors leave it out too
            self._memo[key] = trained(name, data=self.data, quick=self.quick, seed=self.seed,
                                      exclude_gpus=held, progress=not held)
        return self._memo[key]
