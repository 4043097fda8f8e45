"""Stage 5, evaluation: error metrics with the paper's protocol, kernel-level (FP32 and 16-bit),
per-class and end-to-end model-level results, the layer check, the extrapolation properties and
the memory model's check against real allocations."""
