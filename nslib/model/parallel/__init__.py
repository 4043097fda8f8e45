"""Training on several GPUs of one server: data, tensor and pipeline parallelism (method.md 6).

It lives inside the model stage because a multi-GPU step is one more way to predict a model:
:func:`nslib.model.predict.predict_model` dispatches to it and the memory model shards with it.
"""
from nslib.model.parallel.core import (LinkSpec, check_degrees, default_link, dp_schedule,
                                       gpipe_time, model_info, pipeline_stages, pp_schedule,
                                       predict_parallel, raw_spec, resolve_link,
                                       shard_tensor_parallel, tp_schedule)

__all__ = ["LinkSpec", "check_degrees", "default_link", "dp_schedule", "gpipe_time",
           "model_info", "pipeline_stages", "pp_schedule", "predict_parallel", "raw_spec",
           "resolve_link", "shard_tensor_parallel", "tp_schedule"]
