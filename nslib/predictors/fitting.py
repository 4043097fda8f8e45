"""One fit loop for the small MLPs of the 16-bit predictors and baselines.

``fit_mlp`` trains :func:`nslib.predictors.neusight.make_mlp` with AdamW and returns its
weights as numpy arrays (so a trained predictor predicts, saves and loads without torch). A
``head`` turns the network's raw outputs into the prediction (a bounded efficiency times a
physical law, say); without one the raw output is the prediction. Losses return one value per
row; rows may carry weights (every GPU weighing the same, say).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from nslib.predictors.neusight import make_mlp, mlp_weights


def mse(pred, target):
    """Squared error per row (torch tensors; summed over output columns)."""
    err = (pred - target) ** 2
    return err.sum(-1) if err.ndim > 1 else err


def log_error(pred, target):
    """|log(pred / target)| per row of positive predictions and targets (torch tensors): close
    to the relative error when small, and symmetric in over- and under-prediction."""
    return (pred.log() - target.log()).abs()


def _scheduler(opt, schedule: str, lr: float, epochs: int, steps_per_epoch: int):
    """(scheduler, steps per epoch it is stepped): cosine per epoch, or one-cycle per batch."""
    import torch
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs), False
    if schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs *
                                                   steps_per_epoch), True
    raise ValueError(f"schedule must be 'cosine' or 'onecycle', got {schedule!r}")


def fit_mlp(x: np.ndarray, target: np.ndarray, *, hidden: int = 64, layers: int = 3,
            epochs: int = 40, batch: int = 512, lr: float = 2e-3, n_out: int | None = None,
            head: Callable | None = None, ctx: np.ndarray | None = None,
            loss: Callable = mse, weights: np.ndarray | None = None, val_frac: float = 0.1,
            weight_decay: float = 1e-4, schedule: str = "cosine", seed: int = 0,
            progress: bool = True, desc: str = "mlp") -> list[np.ndarray]:
    """Train an MLP on inputs ``x`` (n, d) for ``target`` (n, ...); return its weights.

    ``head(raw, ctx_batch)`` maps raw outputs (``n_out`` columns; default the target's width)
    and the rows' context ``ctx`` (float64) to predictions; the ``weights``-weighted mean of
    ``loss(pred, target)`` is minimised. With ``val_frac`` > 0 the epoch with the best loss on
    that random share of rows is kept; with 0 every row trains and the last epoch is kept.
    Deterministic for a given ``seed``.
    """
    import torch
    from tqdm.auto import tqdm
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    xt = torch.from_numpy(np.array(x, np.float32))  # copies: the caller's arrays stay theirs
    yt = torch.from_numpy(np.array(target, np.float64 if head else np.float32))
    ct = None if ctx is None else torch.from_numpy(np.array(ctx, np.float64))
    wt = torch.ones(len(xt), dtype=yt.dtype) if weights is None else torch.from_numpy(
        np.array(weights, yt.numpy().dtype))
    model = make_mlp(xt.shape[1], layers, hidden, n_out or (1 if yt.ndim == 1 else yt.shape[1]))
    perm = rng.permutation(len(xt))
    n_val = int(round(val_frac * len(xt)))
    val, tr = perm[:n_val], perm[n_val:]

    def run(idx):
        raw = model(xt[idx])
        return head(raw.double(), None if ct is None else ct[idx]) if head else raw

    def cost(idx):
        return (wt[idx] * loss(run(idx), yt[idx])).mean()

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched, per_batch = _scheduler(opt, schedule, lr, epochs, int(np.ceil(len(tr) / batch)))
    best, best_state = np.inf, None
    bar = tqdm(range(epochs), desc=desc, disable=not progress, leave=False)
    for _ in bar:
        for b in torch.from_numpy(tr[rng.permutation(len(tr))]).split(batch):
            err = cost(b)
            opt.zero_grad()
            err.backward()
            opt.step()
            if per_batch:
                sched.step()
        if not per_batch:
            sched.step()
        if n_val:
            with torch.no_grad():
                err = float(cost(torch.from_numpy(val)))  # no dropout or batch norm: no eval()
            if err < best:
                best, best_state = err, {k: t.clone() for k, t in model.state_dict().items()}
            bar.set_postfix(val=f"{err:.4f}")
    if best_state is not None:
        model.load_state_dict(best_state)
    return mlp_weights(model)
