"""Training on several GPUs of one server: data, tensor and pipeline parallelism (method.md 6).

It lives inside the model stage because a multi-GPU step is one more way to predict a model:
:func:`nslib.model.predict.predict_model` dispatches to it and the memory model shards with it.
Modules: :mod:`.links` (what a transfer costs), :mod:`.tensor` (a tensor-parallel GPU's
trace), :mod:`.pipeline` (stages, GPipe), :mod:`.schedules` (communication rows, the DP/TP/PP
step schedules), :mod:`.strategies` (each strategy's step, :func:`predict_parallel`).
"""
from nslib.model.parallel.links import (FALLBACK_LINK_GBPS, LINK_LATENCY_US, LINK_UTILISATION,
                                        LinkSpec, default_link, raw_spec, resolve_link)
from nslib.model.parallel.pipeline import gpipe_time, pipeline_stages
from nslib.model.parallel.strategies import check_degrees, model_info, predict_parallel
from nslib.model.parallel.schedules import dp_schedule, pp_schedule, tp_schedule
from nslib.model.parallel.tensor import shard_tensor_parallel

__all__ = ["FALLBACK_LINK_GBPS", "LINK_LATENCY_US", "LINK_UTILISATION", "LinkSpec",
           "check_degrees", "default_link", "dp_schedule", "gpipe_time", "model_info",
           "pipeline_stages", "pp_schedule", "predict_parallel", "raw_spec", "resolve_link",
           "shard_tensor_parallel", "tp_schedule"]
