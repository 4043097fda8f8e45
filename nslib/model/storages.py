"""The storages a trace follows: which kernel last wrote each one (a kernel's ``inputs``) and
when each is allocated and freed (the memory columns, :data:`MEMORY_COLUMNS`).

:class:`StorageTracker` is the storage half of the tracer (:class:`nslib.model.recorder.Tracer`
mixes it in); it reads the tracer's ``n`` (kernels recorded so far).
"""
from __future__ import annotations

import weakref

import numpy as np
import pandas as pd

__all__ = ["MEMORY_COLUMNS", "StorageTracker", "storage_of"]

# Storage lifetimes, appended to every trace for nslib.model.memory: ``allocs`` (tuple of the
# bytes of each storage this kernel is the first to touch: allocated just before it runs),
# ``frees`` (for each of them the kid of the last kernel launched before PyTorch freed it, as
# reference counting on the meta device tells; -1 for those alive at the end of the step:
# inputs, outputs the caller holds), ``params`` (bytes of the parameters and buffers this
# kernel is the first to read; those no kernel reads go on the first row) and ``trainable``
# (the part of ``params`` that gets a gradient). Parameters and pre-set gradients are not in
# ``allocs``: they live for the whole step.
MEMORY_COLUMNS = ("allocs", "frees", "params", "trainable")


def storage_of(t):
    """The untyped storage a tensor (or view) lives in, or None."""
    try:
        return t.untyped_storage()
    except Exception:  # noqa: BLE001 - tensors without storage (none expected)
        return None


class StorageTracker:
    """Last writers and lifetimes of storages, keyed by storage id."""

    def __init__(self):
        self.writer: dict[int, tuple] = {}   # storage id -> kids that last wrote it
        self._keep: list = []                # storages of parameters, gradients, inputs
        self._refs: dict = {}                # storage id -> weakref reporting its death
        self.dead: list = []                 # [first kid, last kid, bytes] of freed storages
        self.closed = False                  # set after the step: later deaths are teardown
        self.life: dict[int, list] = {}      # storage id -> [first kid, last kid, bytes]
        self.persist: dict[int, str] = {}    # storage id -> "param", "trainable" or "grad"
        self._storage_bytes: dict[int, int] = {}

    # --- producers ---------------------------------------------------------------------------
    # A kernel's producers are the last writers of the storages its tensors live in: views,
    # reshapes and autograd's saved copies of a tensor share its storage, so this follows them
    # to the real producer; an in-place op becomes the new writer of the whole storage.
    def producers(self, tensors) -> tuple:
        """Sorted kids of the kernels that last wrote the storages of ``tensors``."""
        kids: set = set()
        writer = self.writer
        for t in tensors:
            st = storage_of(t)
            if st is not None:
                kids.update(writer.get(st._cdata, ()))
        return tuple(sorted(kids))

    def set_writer(self, tensors, kids: tuple):
        """Record ``kids`` as the last writers of the storages of ``tensors``."""
        for t in tensors:
            st = storage_of(t)
            if st is not None:
                sid = st._cdata
                if sid not in self._refs:
                    self._watch(st)  # forget the id when the storage dies: it may be reused
                self.writer[sid] = kids

    # --- storage lifetimes (MEMORY_COLUMNS) ----------------------------------------------------
    def mark(self, tensors, kind: str):
        """Label the storages of ``tensors`` "param", "trainable" or "grad", or "held" (the
        caller holds them to the end of the step: inputs, outputs); all stay alive."""
        for t in tensors:
            st = storage_of(t)
            if st is None:
                continue
            if kind != "held":
                self.persist.setdefault(st._cdata, kind)
                self._storage_bytes[st._cdata] = int(st.nbytes())
            self._keep.append(st)

    def touch(self, tensors, kid: int):
        """Start the lifetime of each storage of ``tensors`` that kernel ``kid`` touches first."""
        for t in tensors:
            st = storage_of(t)
            if st is None:
                continue
            if st._cdata not in self.life:
                self.life[st._cdata] = [kid, -1, int(st.nbytes())]
                if st._cdata not in self._refs:
                    self._watch(st)

    def temporary(self, first: int, last: int, nbytes: int):
        """A buffer a library allocates inside one call (no tensor the trace sees): alive from
        kernel ``first`` to kernel ``last``, ``nbytes`` bytes."""
        self.dead.append([first, last, int(nbytes)])

    # Storages die when PyTorch frees them (the last tensor, view or autograd saved variable
    # using them is gone): the meta device follows the same reference counting as a GPU, so
    # the lifetimes are those of the real step, Python locals and saved tensors included.
    def _watch(self, st):
        sid = st._cdata
        self._refs[sid] = weakref.ref(st, lambda _r, sid=sid: self._died(sid))

    def _died(self, sid: int):
        self._refs.pop(sid, None)
        self.writer.pop(sid, None)
        life = self.life.pop(sid, None)
        if life is not None and not self.closed:
            life[1] = self.n - 1   # freed after the last kernel launched so far
            self.dead.append(life)

    def memory_frame(self) -> pd.DataFrame:
        """The :data:`MEMORY_COLUMNS` of the ``n`` kernels recorded, one row each."""
        n = self.n
        allocs: list[list] = [[] for _ in range(n)]
        frees: list[list] = [[] for _ in range(n)]
        params, trainable = np.zeros(n), np.zeros(n)
        for first, last, nb in self.dead:
            allocs[first].append(nb)
            frees[first].append(last)
        for sid, (first, last, nb) in self.life.items():   # alive at the end of the step
            kind = self.persist.get(sid)
            if kind is None:
                allocs[first].append(nb)
                frees[first].append(-1)
            elif kind != "grad":
                params[first] += nb
                trainable[first] += nb if kind == "trainable" else 0
        for sid, kind in self.persist.items():  # parameters no kernel reads
            if sid not in self.life and kind != "grad" and n:
                nb = int(self._storage_bytes.get(sid, 0))
                params[0] += nb
                trainable[0] += nb if kind == "trainable" else 0
        return pd.DataFrame({"allocs": [tuple(a) for a in allocs],
                             "frees": [tuple(f) for f in frees],
                             "params": params, "trainable": trainable})
