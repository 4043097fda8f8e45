"""nslib: forecast deep-learning kernel and model latency on GPUs nobody has measured.

Subpackages are the pipeline's stages; each imports only from itself and earlier ones
(``tests/test_layout.py`` checks it): ``data`` (files, datasheets, labels) -> ``kernels``
(sizes, roofline, tiles, measured tables) -> ``predictors`` (and their training) -> ``model``
(trace, fuse, predict, parallel, memory, sweeps) -> ``evaluation`` -> ``explore`` (the GPU
explorer); ``viz`` draws for notebooks, ``reproduce`` runs them and ``cli`` is the command line.
"""
__version__ = "0.1.0"
