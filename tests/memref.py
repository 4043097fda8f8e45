"""Reference peak memory of a real step on the CPU, from PyTorch's allocator (the profiler's
allocation events with ``profile_memory=True``): independent of nslib's trace bookkeeping."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from nslib.graph import MEASURED_ARCHITECTURE, _build, _hf_config, _loss, _make_modes


def _max_allocated(fn) -> float:
    """Largest net bytes allocated while ``fn`` runs (the allocator's running total)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
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
    CUDA (fused ``native_dropout`` with a bool mask), as the trace assumes."""
    torch.manual_seed(0)
    arch = MEASURED_ARCHITECTURE.get((config.get("model_type"), mode))
    _, meta = _build(config, arch)   # the class nslib traces, built for real on the CPU
    model = type(meta)._from_config(_hf_config(config), attn_implementation="eager",
                                    dtype=torch.float32)
    ids = torch.zeros(batch, seq, dtype=torch.long)
    _, cuda_dropout = _make_modes(None, redirect_dropout=True)
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
                _loss(out).backward()
                opt.step()
    step()                       # first step: Adam's states, lazy caches
    _max_allocated(lambda: None)  # the profiler's own first-use allocations
    state = [t for s in getattr(locals().get("opt"), "state", {}).values() for t in s.values()
             if isinstance(t, torch.Tensor)] if mode == "train" else []
    grads = [p.grad for p in model.parameters() if p.grad is not None] if mode == "train" else []
    base = _resident(list(model.parameters()) + list(model.buffers()) + grads + state + [ids])
    return base + _max_allocated(step)
