"""Stage 6, exploring: what-if questions about GPUs and models as plain functions, and the
ipywidgets explorer over them."""
