"""LLM serving forecasts: engine iterations priced from the trace (:mod:`.steps`), the
scheduling of continuous batching (:mod:`.schedule`) and the one-call forecast
(:mod:`.forecast`)."""
from nslib.model.serving.forecast import (Workload, part_factors, resolve_model,
                                          serving_forecast, step_cost)
from nslib.model.serving.schedule import (FRAMEWORKS, Framework, framework, kv_capacity,
                                          no_fit, serve, waiting_note)
from nslib.model.serving.steps import (ScaledCost, ServingSetup, StepCost, engine_kernels,
                                       token_law)

__all__ = ["FRAMEWORKS", "Framework", "ScaledCost", "ServingSetup", "StepCost",
           "engine_kernels", "framework", "kv_capacity", "no_fit", "part_factors", "resolve_model",
           "serve", "serving_forecast", "step_cost", "token_law", "waiting_note", "Workload"]
