"""nslib: forecast deep-learning kernel and model latency on GPUs nobody has measured.

Layers, each depending only on those before it: ``paths`` / ``gpus`` / ``data`` (the
measurements) -> ``kernels`` / ``tiles`` (sizes, tiles, waves) -> ``predictors`` ->
``training`` / ``evaluate`` -> model-level prediction -> notebooks.
"""
__version__ = "0.1.0"
