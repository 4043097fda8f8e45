"""Peak memory of a step: will it fit on the GPU?

:mod:`.step` sizes one GPU's peak from a traced step (the live set of storages over the launch
order, weights, gradients, optimizer states, framework); :mod:`.scenario` a model's step on one
or several GPUs (:func:`memory_of`: data, tensor and pipeline parallelism); :mod:`.laws` many
scenarios at once from storage laws of batch and sequence length (sweeps, the largest batch
that fits) and the published per-layer formula, for comparison.
"""
from nslib.model.memory.laws import (korthikanti_bytes, largest_batch, law_memory,
                                     layer_saved_bytes, storage_law, sweep_memory)
from nslib.model.memory.scenario import memory_of, pipeline_memory, tp_scales, trace_memory
from nslib.model.memory.step import (CONTEXT_BASE_GB, CONTEXT_STACK_BYTES, CONTEXT_THREADS_PER_SM,
                                     CUBLAS_WORKSPACE_BYTES, FP32_BYTES, GIB, OPTIMIZERS, Held, Memory,
                                     Share, framework_bytes, kv_cache_bytes, live_bytes,
                                     step_memory)

__all__ = ["CONTEXT_BASE_GB", "CONTEXT_STACK_BYTES", "CONTEXT_THREADS_PER_SM",
           "CUBLAS_WORKSPACE_BYTES", "FP32_BYTES", "GIB", "Held", "OPTIMIZERS", "Memory", "Share",
           "framework_bytes", "korthikanti_bytes", "kv_cache_bytes", "largest_batch",
           "law_memory", "layer_saved_bytes", "live_bytes", "memory_of", "pipeline_memory",
           "step_memory", "storage_law", "sweep_memory", "tp_scales", "trace_memory"]
