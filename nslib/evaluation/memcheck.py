"""The check of :mod:`nslib.model.memory` against real allocations: the peak memory of a real step
of a small model on the CPU, read from PyTorch's allocator (the profiler's allocation events
with ``profile_memory=True``, whose running total is the allocator's), independent of the
trace's bookkeeping. Used by the tests and notebook 10."""
from __future__ import annotations

import pandas as pd

from nslib.evaluation.collect.timing import native_stderr_silenced
from nslib.model.config import MEASURED_ARCHITECTURE, build_model, hf_config
from nslib.model.memory import step_memory
from nslib.model.recorder import make_modes
from nslib.model.step import Step
from nslib.model.trace import logits_loss, trace

__all__ = ["SMALL_CONFIGS", "real_peak", "compare"]


# Small configurations of four families (2-4 layers) that a CPU runs in seconds: the check
# of the trace-based peak against real allocations (tests and notebook 10).
SMALL_CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_embd": 128, "n_head": 4, "n_layer": 2,
             "n_positions": 128, "vocab_size": 1000},
    "bert": {"model_type": "bert", "hidden_size": 128, "num_attention_heads": 4,
             "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000,
             "max_position_embeddings": 128},
    "opt": {"model_type": "opt", "hidden_size": 128, "num_attention_heads": 4,
            "num_hidden_layers": 3, "ffn_dim": 512, "vocab_size": 1000,
            "max_position_embeddings": 128, "word_embed_proj_dim": 128},
    "llama": {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 4, "intermediate_size": 344,
              "vocab_size": 1000, "max_position_embeddings": 128},
}


def _max_allocated(fn) -> float:
    """Largest net bytes allocated while ``fn`` runs (the allocator's running total)."""
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with native_stderr_silenced():   # only around start and stop: fn's warnings still show
        prof.__enter__()
    try:
        fn()
    finally:
        with native_stderr_silenced():
            prof.__exit__(None, None, None)
    peak = [0]

    def walk(node):
        f = node.extra_fields
        if type(f).__name__ == "_ExtraFields_Allocation":
            peak[0] = max(peak[0], int(f.total_allocated))
        for c in node.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return float(peak[0])


def _resident(tensors) -> float:
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return float(total)


def real_peak(config: dict, batch: int, seq: int, mode: str) -> float:
    """Peak bytes of one real step: a forward under ``no_grad`` (``"inf"``), or forward +
    backward of the summed logits + a multi-tensor Adam step with gradients kept between steps
    (``"train"``; measured on the second step, when Adam's states exist). Dropout runs as on
    CUDA (fused ``native_dropout`` with a bool mask), as the trace assumes. Seconds for the
    2-4 layer configurations this is meant for."""
    import torch

    torch.manual_seed(0)
    arch = MEASURED_ARCHITECTURE.get((config.get("model_type"), mode))
    _, meta = build_model(config, arch)   # the class nslib traces, built for real on the CPU
    model = type(meta)._from_config(hf_config(config), attn_implementation="eager",
                                    dtype=torch.float32)
    ids = torch.zeros(batch, seq, dtype=torch.long)
    _, cuda_dropout = make_modes(None, redirect_dropout=True)
    model.train(mode == "train")
    if mode == "inf":
        def step():
            with torch.no_grad():
                model(input_ids=ids)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)

        def step():
            with cuda_dropout:
                out = model(input_ids=ids)
                logits_loss(out).backward()
                opt.step()
    step()                       # first step: Adam's states, lazy caches
    _max_allocated(lambda: None)  # the profiler's own first-use allocations
    state = [t for s in getattr(locals().get("opt"), "state", {}).values() for t in s.values()
             if isinstance(t, torch.Tensor)] if mode == "train" else []
    grads = [p.grad for p in model.parameters() if p.grad is not None] if mode == "train" else []
    base = _resident(list(model.parameters()) + list(model.buffers()) + grads + state + [ids])
    return base + _max_allocated(step)


def compare(configs: dict, batch: int, seq: int, modes=("inf", "train"),
            optimizer: str = "adam") -> pd.DataFrame:
    """nslib's peak (:func:`nslib.model.memory.step_memory` of the trace, no framework constant:
    the CPU has no CUDA context) against :func:`real_peak` for each named config and mode.
    Columns ``model``, ``mode``, ``real_mb``, ``nslib_mb``, ``error_pct``, ``peak_phase``."""
    if optimizer != "adam":
        raise ValueError("the real step runs Adam: compare with optimizer='adam'")
    rows = []
    for name, cfg in configs.items():
        for mode in modes:
            real = real_peak(cfg, batch, seq, mode)
            m = step_memory(trace(cfg, Step(batch, seq, mode)), mode, optimizer)
            own = m.weights + m.grads + m.optimizer + m.activations
            rows.append({"model": name, "mode": mode, "real_mb": real / 1e6,
                         "nslib_mb": own / 1e6, "error_pct": 100 * (own / real - 1),
                         "peak_phase": m.peak_phase})
    return pd.DataFrame(rows)
