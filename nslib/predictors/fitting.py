"""One fit loop for the small MLPs of the 16-bit predictors and baselines.

``fit_mlp`` trains :func:`nslib.predictors.neusight.make_mlp` with AdamW and a cosine schedule,
keeps the epoch with the best validation loss, and returns the weights as numpy arrays (so a
trained predictor predicts, saves and loads without torch). A ``head`` turns the network's raw
outputs into the prediction (a bounded utilisation times a physical law, say); without one the
raw output is the prediction.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def mse(pred, target):
    """Mean squared error (torch tensors)."""
    return ((pred - target) ** 2).mean()


def log_error(pred, target):
    """Mean absolute log ratio of positive predictions and targets (torch tensors); close to
    MAPE for small errors and symmetric in over- and under-prediction."""
    return (pred.log() - target.log()).abs().mean()


def fit_mlp(x: np.ndarray, target: np.ndarray, *, hidden: int = 64, layers: int = 3,
            epochs: int = 40, batch: int = 512, lr: float = 2e-3, n_out: int | None = None,
            head: Callable | None = None, ctx: np.ndarray | None = None,
            loss: Callable = mse, val_frac: float = 0.1, weight_decay: float = 1e-4,
            seed: int = 0, progress: bool = True, desc: str = "mlp") -> list[np.ndarray]:
    """Train an MLP on inputs ``x`` (n, d) for ``target`` (n, ...); return its weights.

    ``head(raw, ctx_batch)`` maps raw outputs (n_out columns; default target's width) and the
    rows' context ``ctx`` to predictions; ``loss(pred, target)`` is minimised. The best epoch
    on a random ``val_frac`` of the rows (all rows if that is empty) is kept. Deterministic
    for a given ``seed``.
    """
    import torch
    from tqdm.auto import tqdm
    from .neusight import make_mlp, mlp_weights
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    xt = torch.as_tensor(np.asarray(x, np.float32))
    yt = torch.as_tensor(np.asarray(target, np.float32))
    ct = None if ctx is None else torch.as_tensor(np.asarray(ctx, np.float32))
    width = n_out or (1 if yt.ndim == 1 else yt.shape[1])
    model = make_mlp(xt.shape[1], layers, hidden, width)
    perm = rng.permutation(len(xt))
    n_val = int(round(val_frac * len(xt)))
    val, tr = (perm[:n_val], perm[n_val:]) if n_val else (perm, perm)

    def run(idx):
        raw = model(xt[idx])
        return head(raw, None if ct is None else ct[idx]) if head else raw

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    best, best_state = np.inf, None
    bar = tqdm(range(epochs), desc=desc, disable=not progress, leave=False)
    for _ in bar:
        model.train()
        order = tr[rng.permutation(len(tr))]
        for s in range(0, len(order), batch):
            b = torch.from_numpy(order[s:s + batch])
            err = loss(run(b), yt[b])
            opt.zero_grad()
            err.backward()
            opt.step()
        sched.step()
        model.eval()
        with torch.no_grad():
            v = torch.from_numpy(val)
            err = float(loss(run(v), yt[v]))
        if err < best:
            best, best_state = err, {k: t.clone() for k, t in model.state_dict().items()}
        bar.set_postfix(val=f"{err:.4f}")
    model.load_state_dict(best_state)
    return mlp_weights(model)
