"""Stage 1, the data: where files live and caches go (:mod:`~nslib.data.paths`), fetching the
pinned measurements, GPU datasheets, measured end-to-end labels, the original tool's reference
operator graphs, and the 16-bit tables. Nothing here knows about kernels or predictors."""
