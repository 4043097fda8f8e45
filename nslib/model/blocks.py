"""The model's structure for the tracer: its transformer blocks (a kernel's ``layer``) and the
module hooks that keep the tracer's module stacks (a kernel's ``module``), forward and backward.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from nslib.model.aten import tensors_in

if TYPE_CHECKING:
    from nslib.model.recorder import Tracer

__all__ = ["block_index", "check_layers", "install_hooks"]

# config fields that count transformer blocks (a zero in any of them is an error)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers",
               "encoder_layers", "decoder_layers")


def block_index(model) -> dict:
    """Qualified name of each transformer block -> its index (encoder blocks first)."""
    import torch.nn as nn

    out: dict[str, int] = {}
    taken: list[str] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if any(name.startswith(t + ".") for t in taken):
            continue
        kinds = {type(m) for m in mod}
        if len(kinds) != 1:
            continue
        cname = next(iter(kinds)).__name__
        if not (cname.endswith("Block") or cname.endswith("Layer")):
            continue
        taken.append(name)
        for i in range(len(mod)):
            out[f"{name}.{i}"] = len(out)
    return out


def install_hooks(model, tracer: Tracer) -> list:
    """Forward hooks on every module of ``model`` that keep ``tracer``'s module stacks, and
    gradient hooks that keep its backward stack; returns the handles to remove."""
    import torch
    from torch.autograd.graph import register_multi_grad_hook

    handles = []
    for name, mod in model.named_modules():
        def pre(m, args, kwargs, _name=name):
            tracer.fw_stack.append(_name)
            if torch.is_grad_enabled():
                ts = [t for t in tensors_in((args, kwargs), []) if t.requires_grad]
                if ts:
                    handles.append(register_multi_grad_hook(ts, lambda *_: _pop(_name)))

        def post(m, args, kwargs, output, _name=name):
            if tracer.fw_stack and tracer.fw_stack[-1] == _name:
                tracer.fw_stack.pop()
            if torch.is_grad_enabled():
                ts = [t for t in tensors_in(output, []) if isinstance(t, torch.Tensor)
                      and t.requires_grad]
                if ts:
                    handles.append(register_multi_grad_hook(
                        ts, lambda *_: _push(_name), mode="any"))

        def _push(n):
            # hooks on the same tensor fire inner module first (registration order): keep an
            # enclosing module below the descendants already on the stack
            st = tracer.bw_stack
            i = len(st)
            prefix = n + "." if n else ""
            while i > 0 and st[i - 1] != n and st[i - 1].startswith(prefix):
                i -= 1
            st.insert(i, n)

        def _pop(n):
            st = tracer.bw_stack
            for i in range(len(st) - 1, -1, -1):
                if st[i] == n:
                    del st[i]
                    break

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
    return handles


def check_layers(hf, block_of: dict, arch: str) -> None:
    """A model without transformer blocks would trace only embeddings and heads: an error."""
    zero = [k for k in _LAYER_KEYS if getattr(hf, k, None) == 0]
    if zero or not block_of:
        what = ", ".join(f"{k} = 0" for k in zero) or "no repeated transformer block found"
        raise ValueError(f"{arch} has no transformer layers ({what}): its trace would hold only "
                         f"the embeddings and the head. Set the layer count to at least 1")
