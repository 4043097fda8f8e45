"""What-if of a training step on several GPUs: predicted step time of one model and GPU, at a
fixed global batch, against the parallel degree and the GPU-to-GPU link bandwidth
(:mod:`nslib.model.parallel` through :func:`nslib.model.predict.predict_model`), the
what-if of notebook 07."""
from __future__ import annotations

import pandas as pd

from nslib.data.settings import Settings, settings_of
from nslib.model.inputs import resolve_gpu
from nslib.model.parallel import default_link
from nslib.model.predict import predict_model
from nslib.model.step import Parallel, Step
from nslib.predictors.gpu_range import range_warnings_once

# strategies of the what-if: "pp-m" is a pipeline with one sample per micro-batch (GPipe's
# bubble shrinks to (n - 1) / (M + n - 1)), "pp" one with a single micro-batch (as labelled)
STRATEGIES = ("dp", "tp", "pp", "pp-m")
# the degree of the link-bandwidth sweep when the degrees include it (the labels' 4 GPUs)
LINK_SWEEP_DEGREE = 4


def strategy_args(strategy: str, degree: int, batch: int) -> dict:
    """The :func:`nslib.model.predict.predict_model` arguments of ``strategy`` (one of
    :data:`STRATEGIES`) on ``degree`` GPUs at global batch ``batch``."""
    if strategy == "pp-m":
        return {"pp": degree, "microbatches": batch if degree > 1 else 1}
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: expected one of {STRATEGIES}")
    return {strategy: degree}


def link_sweep_degree(degrees) -> int:
    """The degree at which the link bandwidth is swept: :data:`LINK_SWEEP_DEGREE` when among
    ``degrees``, else the largest."""
    return LINK_SWEEP_DEGREE if LINK_SWEEP_DEGREE in degrees else max(degrees)


def whatif_points(degrees, link_bws) -> list[tuple[str, int, float | None]]:
    """``(strategy, degree, link GB/s or None for the GPU's default)`` of the what-if: every
    strategy at every degree on the default link, then every strategy at
    :func:`link_sweep_degree` over ``link_bws`` (GB/s, datasheet, both directions)."""
    d_ref = link_sweep_degree(degrees)
    return ([(s, d, None) for s in STRATEGIES for d in degrees] +
            [(s, d_ref, bw) for s in STRATEGIES for bw in link_bws])


@range_warnings_once()
def parallel_whatif(gpu, model, step: Step, degrees, link_bws, predictor="nslib", *,
                    settings: Settings | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Predicted steps (``step``, a :class:`nslib.model.step.Step`, its batch the global one;
    a training step as the what-if asks) at every :func:`whatif_points` point.

    Returns the frame (one row per point: ``strategy``, ``degree``, ``link_gbps`` (datasheet
    GB/s; the GPU's default link where none is set), ``step_ms``, ``comm_ms``) and the points
    skipped with the reason (a degree that does not divide the model raises ValueError).
    """
    st = settings_of(settings)
    spec = resolve_gpu(gpu, st.data)
    default_gbps = default_link(spec, st.data).bandwidth_gbps
    rows, skipped = [], []
    for strategy, degree, bw in whatif_points(degrees, link_bws):
        try:
            par = Parallel(link=bw, **strategy_args(strategy, degree, step.batch))
            _, s = predict_model(spec, model, step, predictor, parallel=par, settings=st)
        except ValueError as e:
            skipped.append(f"{strategy}{degree}{'' if bw is None else f' at {bw} GB/s'}: {e}")
            continue
        rows.append({"strategy": strategy, "degree": degree,
                     "link_gbps": float(bw if bw is not None else default_gbps),
                     "step_ms": s["e2e_ms"], "comm_ms": s.get("comm_ms", 0.0)})
    return pd.DataFrame(rows), skipped
