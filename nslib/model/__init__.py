"""Stage 4, the model: trace a HuggingFace config into kernels, fuse them, predict every kernel
and aggregate the stream (:mod:`~nslib.model.predict`); several GPUs
(:mod:`~nslib.model.parallel`), peak memory and fast scenario sweeps."""
