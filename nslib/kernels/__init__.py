"""Stage 2, the kernels: what a kernel is in numbers. Classes and their FLOPs, bytes, waves and
roofline (:mod:`~nslib.kernels.sizes`), number formats, tiles, and the measured kernel tables
in those terms (:mod:`~nslib.kernels.measured`)."""
