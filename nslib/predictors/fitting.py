"""One fit loop for every small MLP of the predictors (NeuSight, Habitat, the 16-bit ones).

:func:`train_mlp` trains :func:`nslib.predictors.network.make_mlp` with AdamW and returns the
torch network and its validation loss per epoch; :func:`fit_mlp` returns the weights as numpy
arrays (so a trained predictor predicts, saves and loads without torch). A ``head`` turns the
network's raw outputs into the prediction (a bounded efficiency times a physical law, say);
without one the raw output is the prediction. Losses return one value per row; rows may carry
weights (every GPU weighing the same, say). Which rows validate (``split``), the loss they are
scored on (``val_loss``) and when training stops early (``patience``) are the caller's.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from nslib.predictors.network import make_mlp, mlp_weights

MEMBER_SEED_STRIDE = 1000  # ensemble member k trains from seed + k * this


def mse(pred, target):
    """Squared error per row (torch tensors; summed over output columns)."""
    err = (pred - target) ** 2
    return err.sum(-1) if err.ndim > 1 else err


def log_error(pred, target):
    """|log(pred / target)| per row of positive predictions and targets (torch tensors): close
    to the relative error when small, and symmetric in over- and under-prediction."""
    return (pred.log() - target.log()).abs()


def symmetric_error(pred, target):
    """``2 |pred - target| / (|pred| + |target|)`` per row (torch tensors): its mean is the
    symmetric absolute percentage error (SMAPE, a fraction)."""
    return 2 * (pred - target).abs() / (pred.abs() + target.abs())


def log_space_ape(pred, target):
    """``|exp(pred - target) - 1|`` per row of log predictions and log targets (torch), in
    float64: the absolute percentage error of ``exp(pred)`` (summed over output columns)."""
    err = (pred.double() - target.double()).expm1().abs()
    return err.sum(-1) if err.ndim > 1 else err


def random_split(rng, n: int, val_frac: float, validate_on_train: bool = False):
    """(validation, training) row indices: a random ``val_frac`` share of ``n`` rows held out.

    With none held out the validation rows are none (the last epoch is kept) or, with
    ``validate_on_train``, the training rows (the epoch best on them is kept).
    """
    perm = rng.permutation(n)
    n_val = int(round(val_frac * n))
    if n_val or not validate_on_train:
        return perm[:n_val], perm[n_val:]
    return perm, perm


def _scheduler(opt, schedule: str, lr: float, epochs: int, steps_per_epoch: int):
    """(scheduler, whether it steps per batch): cosine per epoch, or one-cycle per batch."""
    import torch
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1)), False
    if schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs *
                                                   steps_per_epoch), True
    raise ValueError(f"schedule must be 'cosine' or 'onecycle', got {schedule!r}")


def _tensors(x, target, ctx, weights, head):
    """Copies of the inputs as tensors (the caller's arrays stay theirs): inputs float32,
    targets and row weights float64 under a head (float32 without), context float64."""
    import torch
    xt = torch.from_numpy(np.array(x, np.float32))
    yt = torch.from_numpy(np.array(target, np.float64 if head else np.float32))
    ct = None if ctx is None else torch.from_numpy(np.array(ctx, np.float64))
    wt = torch.ones(len(xt), dtype=yt.dtype) if weights is None else torch.from_numpy(
        np.array(weights, yt.numpy().dtype))
    return xt, yt, ct, wt


class _BestEpoch:
    """The epoch with the lowest validation loss so far; stops ``patience`` epochs after it."""

    def __init__(self, patience: int | None):
        self.patience, self.best, self.state, self.stale = patience, np.inf, None, 0
        self.history: list[float] = []

    def stop_after(self, err: float, model) -> bool:
        """Record one epoch's validation loss ``err``; True when training should stop."""
        self.history.append(err)
        if err < self.best:
            self.best, self.stale = err, 0
            self.state = {k: t.clone() for k, t in model.state_dict().items()}
        else:
            self.stale += 1
        return self.patience is not None and self.stale >= self.patience

    def restore(self, model) -> None:
        """Load the best epoch's weights into ``model`` (no validation: keep the last)."""
        if self.state is not None:
            model.load_state_dict(self.state)


@dataclass(frozen=True)
class Fit:
    """How one MLP is trained (:func:`train_mlp`): the network (``layers`` of ``hidden`` units,
    ``n_out`` raw outputs, default the target's width), AdamW (``lr`` per step, ``batch`` rows,
    ``weight_decay``, ``epochs``, a ``cosine`` or ``onecycle`` schedule), the objective (the
    per-row ``loss`` of ``head(raw, ctx)``'s prediction, or of the raw outputs without a head)
    and the validation: ``split(rng, n)`` gives the (validation, training) rows (default
    :func:`random_split` with ``val_frac``); with validation rows the epoch with the best
    weighted mean ``val_loss`` (default ``loss``) is kept, training stopping ``patience`` epochs
    after it; without, every epoch runs and the last is kept. ``seed``: same seed, same
    weights."""

    hidden: int = 64
    layers: int = 3
    n_out: int | None = None
    epochs: int = 40
    batch: int = 512
    lr: float = 2e-3
    weight_decay: float = 1e-4
    schedule: str = "cosine"
    loss: Callable = mse
    val_loss: Callable | None = None
    val_frac: float = 0.1
    split: Callable | None = None
    patience: int | None = None
    head: Callable | None = None
    seed: int = 0


def train_mlp(x: np.ndarray, target: np.ndarray, fit: Fit = Fit(), *,
              ctx: np.ndarray | None = None, weights: np.ndarray | None = None,
              progress: bool = True, desc: str = "mlp"):
    """Train an MLP on inputs ``x`` (n, d) for ``target`` (n, ...) as ``fit`` says; return
    ``(torch network, validation loss per epoch)``.

    ``ctx``: per-row context the head reads (float64); ``weights``: per-row weights of the
    loss (default all 1). Deterministic for a given ``fit.seed``.
    """
    import torch
    from tqdm.auto import tqdm
    rng = np.random.default_rng(fit.seed)
    torch.manual_seed(fit.seed)
    head = fit.head
    xt, yt, ct, wt = _tensors(x, target, ctx, weights, head)
    model = make_mlp(xt.shape[1], fit.layers, fit.hidden,
                     fit.n_out or (1 if yt.ndim == 1 else yt.shape[1]))
    val, tr = (fit.split or partial(random_split, val_frac=fit.val_frac))(rng, len(xt))

    def cost(idx, per_row):
        raw = model(xt[idx])
        pred = head(raw.double(), None if ct is None else ct[idx]) if head else raw
        return (wt[idx] * per_row(pred, yt[idx])).mean()

    # fused: one kernel for the whole update (2.3x faster per step for an 8 x 512 network on
    # 2 CPU cores, where the per-tensor update dominated)
    opt = torch.optim.AdamW(model.parameters(), lr=fit.lr, weight_decay=fit.weight_decay,
                            fused=True)
    sched, per_batch = _scheduler(opt, fit.schedule, fit.lr, fit.epochs,
                                  int(np.ceil(len(tr) / fit.batch)))
    kept = _BestEpoch(fit.patience)
    bar = tqdm(range(fit.epochs), desc=desc, disable=not progress, leave=False)
    for _ in bar:
        for b in torch.from_numpy(tr[rng.permutation(len(tr))]).split(fit.batch):
            err = cost(b, fit.loss)
            opt.zero_grad()
            err.backward()
            opt.step()
            if per_batch:
                sched.step()
        if not per_batch:
            sched.step()
        if len(val):
            with torch.no_grad():  # no dropout or batch norm: no eval()
                err = float(cost(torch.from_numpy(val), fit.val_loss or fit.loss))
            bar.set_postfix(val=f"{err:.4f}")
            if kept.stop_after(err, model):
                break
    kept.restore(model)
    return model, kept.history


def fit_mlp(x: np.ndarray, target: np.ndarray, fit: Fit = Fit(), **rows) -> list[np.ndarray]:
    """:func:`train_mlp`'s network (``rows``: its keywords ``ctx``, ``weights``, ``progress``,
    ``desc``) as numpy weights (:func:`nslib.predictors.network.mlp_weights`)."""
    return mlp_weights(train_mlp(x, target, fit, **rows)[0])
