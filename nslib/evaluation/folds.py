"""Which trained predictor prices a label: the paper's protocol or leave-one-GPU-out.

Under the paper's protocol every label is priced by the predictor trained on every training
GPU. Under leave-one-GPU-out a training GPU's labels are priced by the predictor of the fold
that held that GPU out (its kernels never seen, its tiles looked up), so the GPU is as new to
the forecast as a GPU nobody measured; GPUs without training kernels (the new GPUs) keep the
predictor trained on every training GPU, as in :func:`nslib.evaluation.kernel_level.predict_logo`.
"""
from __future__ import annotations

from nslib.data.settings import Settings, settings_of
from nslib.kernels import measured
from nslib.predictors import trained

PAPER, LOGO = "paper protocol", "leave-one-GPU-out"


class Folds:
    """Trained predictors per (name, fold), each trained or read from the cache once.

    ``logo``: hold each training GPU out of the predictor that prices it (see module doc).
    ``settings``: the data, training profile and seed (:class:`nslib.data.settings.Settings`).
    """

    def __init__(self, logo: bool = False, settings: Settings | None = None):
        self.logo, self.settings = bool(logo), settings_of(settings)
        s = self.settings
        self._train = set(measured.gpu_splits(s.data)["train_gpus"]) if logo else set()
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
            s = self.settings
            self._memo[key] = trained(name, s.but(progress=not held and s.progress),
                                      exclude_gpus=held)
        return self._memo[key]
