"""One call from a question to a table: ``serving_forecast(model, gpu, concurrency,
Workload(isl, osl))``.

Resolves the model (a config name or path, or a HuggingFace id the project keeps a config for:
:func:`nslib.data.serving_sample.model_configs`), builds the :class:`StepCost` once per model,
GPU, tensor-parallel degree and predictors (kept for the process), and forecasts every
scenario in one vectorised :func:`nslib.model.serving.serve` call.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nslib.data.checks import check_int
from nslib.data.settings import Settings, settings_of
from nslib.model.config import check_seq, load_model_config
from nslib.model.inputs import resolve_gpu
from nslib.model.serving.schedule import framework, kv_capacity, serve
from nslib.model.serving.steps import (ScaledCost, ServingSetup, StepCost,
                                       check_servable, model_sizes)
from nslib.predictors.intervals import calibration, tensor_calibration

_COSTS: dict = {}


@dataclass(frozen=True)
class Workload:
    """What a server is asked: requests of ``isl`` prompt tokens and ``osl`` output tokens,
    served by the engine ``framework`` (:data:`nslib.model.serving.FRAMEWORKS`) on ``tp``
    tensor-parallel GPUs over ``link`` (GB/s; None: the datasheet's ``Link_Bw``)."""
    isl: int = 1024
    osl: int = 128
    framework: str = "vllm"
    tp: int = 1
    link: float | None = None

    def __post_init__(self):
        for k in ("isl", "osl", "tp"):
            object.__setattr__(self, k, check_int(k, getattr(self, k)))


def resolve_model(model, data=None) -> dict:
    """A config dict from a dict, a config name or path, or a HuggingFace id of
    :func:`nslib.data.serving_sample.model_configs`: :func:`nslib.model.config.load_model_config`,
    the resolver every command uses."""
    return load_model_config(model, data)


def check_workload(model, workload: Workload, data=None) -> None:
    """ValueError, before any trace, unless ``model`` can serve ``workload``: a causal
    language model (:func:`nslib.model.serving.steps.check_servable`) whose context holds a
    request's ``isl + osl`` tokens (:func:`nslib.model.config.check_seq`, the check
    ``predict`` makes of ``seq``)."""
    info = model_sizes(resolve_model(model, data), data)
    check_servable(info)
    check_seq(info["positions"], workload.isl + workload.osl, what="isl + osl =",
              fix="shorten the prompt or the output (isl, osl)")


def step_cost(model, gpu, tp: int = 1, predictor: str = "nslib",
              tensor_predictor: str = "nslib", quick: bool = False, data=None,
              link=None) -> StepCost:
    """The :class:`StepCost` of a model on ``tp`` GPUs, built once per process; building it
    issues a :class:`nslib.predictors.gpu_range.DatasheetRangeWarning` for each datasheet
    figure outside the training GPUs' range (the tensor-core predictors', then the vector
    kernels'), as ``predict`` does for a 16-bit step."""
    config = resolve_model(model, data)
    tp = check_int("tp", tp)
    sheet = json.dumps(gpu.to_json(), sort_keys=True) if hasattr(gpu, "to_json") else str(gpu)
    key = (json.dumps(config, sort_keys=True), sheet, tp, predictor, tensor_predictor, quick,
           str(data), repr(link))
    if key not in _COSTS:
        _range_warnings(gpu, data)
        _COSTS[key] = StepCost(ServingSetup(config, gpu, tp=tp, predictor=predictor,
                                            tensor_predictor=tensor_predictor, link=link,
                                            quick=quick, data=data))
    return _COSTS[key]


def _range_warnings(gpu, data=None) -> None:
    """Warn of the datasheet figures outside the 16-bit predictors' training range, one line
    each, and outside the vector kernels' (FP32) one, all in one line
    (:mod:`nslib.predictors.gpu_range`)."""
    from nslib.predictors.gpu_range import (DatasheetRangeWarning, out_of_range,
                                            warn_out_of_tensor_range)
    spec = resolve_gpu(gpu, data)
    warn_out_of_tensor_range(spec)
    # the FP32 predictors price only the vector kernels here: one line for that part
    figs = [o.detail() for o in out_of_range(spec, data)]
    if figs:
        warnings.warn(f"{spec.name}: for its vector kernels (norms, activations: the FP32 "
                      f"predictors' share of an iteration), {'; '.join(figs)}: that part "
                      "extrapolates beyond the training GPUs", DatasheetRangeWarning,
                      stacklevel=3)


def part_factors(predictor, tensor_predictor, quick: bool = False, data=None):
    """(lower factors, upper factors, coverage) of an iteration's parts (``gemm`` and
    ``attention`` from the 16-bit predictors' calibration, ``vector`` from the FP32 one's
    elementwise class) when the calibrations are cached, else None (``nslib calibrate``
    builds them; a forecast never trains folds)."""
    if not (isinstance(predictor, str) and isinstance(tensor_predictor, str)):
        return None
    tensor = tensor_calibration(tensor_predictor, quick, build=False)
    if tensor is None:
        return None
    vector = calibration(predictor, data, quick, build=False)
    if vector is None:   # a part without bounds would make the interval narrower than said
        return None
    lo, hi = {}, {}
    for part, cal, cls in (("gemm", tensor, "gemm"), ("attention", tensor, "attention"),
                           ("vector", vector, "elementwise")):
        (lo[part],), (hi[part],) = cal.factors([cls])
    return lo, hi, tensor.coverage


def serving_forecast(model, gpu, concurrency, workload: Workload = Workload(),
                     predictor: str = "nslib", *, tensor_predictor: str = "nslib",
                     settings: Settings | None = None) -> pd.DataFrame:
    """``workload`` (a :class:`Workload`) at each ``concurrency`` (requests in flight), one row
    per concurrency: ``concurrency, isl, osl, tp, framework, ttft_ms, tpot_ms,
    latency_ms, running, queue_ms, tokens_per_s, tokens_per_s_gpu, fits, kv_tokens``, and
    ``ttft_lone_ms, ttft_burst_ms`` (TTFT if requests arrived one at a time or all at once)
    (:func:`nslib.model.serving.serve`); with cached calibrations (:func:`part_factors`),
    the bounds ``ttft_lo_ms, ttft_hi_ms, tpot_lo_ms, ...``, ``tokens_per_s_lo/_hi``: the
    schedule rerun with every part at its bound (``attrs["interval_coverage"]``)."""
    conc = np.atleast_1d(np.asarray(concurrency))
    for v in conc:
        check_int("concurrency", v)
    st, w = settings_of(settings), workload
    isl, osl, quick, data = w.isl, w.osl, st.quick, st.data
    fw = framework(w.framework)
    config, spec = resolve_model(model, data), resolve_gpu(gpu, data)  # read once
    check_workload(config, w, data)
    cost = step_cost(config, spec, w.tp, predictor, tensor_predictor, quick, data, w.link)
    if cost.setup.tp > 1 and "no Link_Bw" in cost.link.source:
        warnings.warn(f"{cost.spec.name}: {cost.link.source}", stacklevel=2)
    out = serve(cost, conc.astype(float), isl, osl, fw)
    frame = pd.DataFrame({"concurrency": conc.astype(int), "isl": isl, "osl": osl,
                          "tp": cost.setup.tp, "framework": fw.name, **out})
    bounds = part_factors(predictor, tensor_predictor, quick, data)
    if bounds is not None:
        lo, hi = (serve(ScaledCost(cost, f), conc.astype(float), isl, osl, fw)
                  for f in bounds[:2])
        for k in ("ttft_ms", "tpot_ms", "latency_ms"):
            frame[f"{k[:-3]}_lo_ms"], frame[f"{k[:-3]}_hi_ms"] = lo[k], hi[k]
        frame["tokens_per_s_lo"], frame["tokens_per_s_hi"] = hi["tokens_per_s"], \
            lo["tokens_per_s"]
        frame.attrs["interval_coverage"] = bounds[2]
    frame.attrs["memory"] = kv_capacity(cost, fw)
    frame.attrs["gpu"] = cost.spec.name
    return frame
