"""Every device is the meta device while a module is traced.

Research code is written for a GPU: ``nn.Linear(...).cuda()``, ``torch.zeros(n,
device="cuda")``, ``x.to(device)`` with ``device`` picked by ``torch.cuda.is_available()``.
None of that may run here (no GPU, and a CPU copy would allocate the weights), and none of it
changes which kernels the model launches. :func:`on_meta` makes every tensor a factory
function makes land on meta whatever device it names, and turns device moves
(``Tensor.cuda``, ``Tensor.cpu``, ``Tensor.to(device)``) into moves to meta (a dtype change
is kept: a cast is a kernel). With ``small_on_cpu``, tensors of at most :data:`SMALL_ON_CPU`
elements are made on the CPU instead and device moves move nothing, so that a constructor
can read their values (drop-path rates from ``torch.linspace(...).item()``); the caller moves
the built module to meta, outside the block.
"""
from __future__ import annotations

import contextlib

# most elements of a tensor made on the CPU for its values (a rate schedule, a position
# index, a window mask): 4 MiB in FP32
SMALL_ON_CPU = 1 << 20


@contextlib.contextmanager
def on_meta(small_on_cpu: bool = False):
    """Within the block, factory functions make tensors on meta (or, with ``small_on_cpu``,
    small ones on the CPU) whatever device they are given, and a device move (``.cuda()``,
    ``.cpu()``, ``.to(device)``; ``.to(dtype)`` still converts) moves to meta (with
    ``small_on_cpu``, nowhere)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    moves = {torch.Tensor.cuda, torch.Tensor.cpu}

    class Meta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in _device_constructors():
                made = func(*args, **{**kwargs, "device": "meta"})   # free: its shape only
                if small_on_cpu and isinstance(made, torch.Tensor) and \
                        made.numel() <= SMALL_ON_CPU:
                    return func(*args, **{**kwargs, "device": "cpu"})
                return made
            if func in moves or func is torch.Tensor.to:
                # no device move but to meta (a move to meta is a trace's own, and what a
                # real tensor given as an input needs); a CPU build keeps its device
                moved = _to_without_device(args, kwargs) if func is torch.Tensor.to \
                    else args[0]
                return moved if small_on_cpu else moved.to("meta")
            return func(*args, **kwargs)

    with Meta():
        yield


def _to_without_device(args, kwargs):
    """``tensor.to(...)`` with any device argument dropped (its dtype, if any, kept)."""
    import torch

    tensor, rest = args[0], list(args[1:])
    kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "copy")}
    keep = [a for a in rest if not isinstance(a, (str, torch.device, int, bool))]
    if keep and isinstance(keep[0], torch.Tensor):   # .to(other): take its dtype only
        keep = [keep[0].dtype]
    return tensor.to(*keep, **kwargs) if keep or kwargs else tensor
