"""LLM serving forecasts: engine iterations priced from the trace (:mod:`.steps`) and the
scheduling of continuous batching (:mod:`.schedule`)."""
from nslib.model.serving.schedule import FRAMEWORKS, Framework, framework, kv_capacity, serve
from nslib.model.serving.steps import ServingSetup, StepCost, engine_kernels, token_law

__all__ = ["FRAMEWORKS", "Framework", "ServingSetup", "StepCost", "engine_kernels",
           "framework", "kv_capacity", "serve", "token_law"]
