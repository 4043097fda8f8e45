"""What one step is, as two frozen objects checked when made: :class:`Step` (the sizes, mode,
number format, fusion and expert routing of one forward or training step) and
:class:`Parallel` (how it is spread over GPUs and the link between them).

:func:`nslib.model.predict.predict_model`, :func:`nslib.model.parallel.predict_parallel` and
:func:`nslib.model.memory.memory_of` take them, so the same description prices a step and
sizes its memory: ``predict_model("A100 80GB", "gpt2_large", Step(8, 1024, "train"),
parallel=Parallel(tp=4))``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from nslib.data.checks import check_float, check_int
from nslib.data.settings import one_of
from nslib.kernels.dtypes import check_dtype
from nslib.model.moe import expert_tokens

MODES = ("inf", "train")


@dataclass(frozen=True)
class Step:
    """One step of a model: ``batch`` sequences (the global batch on several GPUs) of ``seq``
    tokens, ``mode`` ``inf`` (a forward) or ``train`` (forward and backward; the optimizer's
    states count in its memory, its update is not timed, as in the measurements);
    ``dtype`` ``fp32`` (the paper's setting) or ``bf16``/``fp16``; ``fused``: elementwise and
    memory chains merged (:func:`nslib.model.fusion.fuse`); ``imbalance``: mixture-of-experts
    routing, the busiest expert's share over an even one (1: even;
    :func:`nslib.model.moe.expert_tokens`). A ValueError names a bad field."""
    batch: int
    seq: int
    mode: str = "inf"
    dtype: str = "fp32"
    fused: bool = False
    imbalance: float = 1.0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        expert_tokens(1, 1, 1, self.imbalance)  # a ValueError naming a bad imbalance
        fields = {"batch": check_int("batch", self.batch), "seq": check_int("seq", self.seq),
                  "dtype": check_dtype(self.dtype), "fused": bool(self.fused),
                  "imbalance": float(self.imbalance)}
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    def but(self, **changes) -> "Step":
        """A copy with ``changes`` (``step.but(batch=4)``)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Parallel:
    """How a step is spread: ``dp`` data-parallel, ``tp`` tensor-parallel, ``pp`` pipeline
    GPUs (one of them above 1), ``microbatches`` per pipeline step; ``link``: the GPU-to-GPU
    link (None: the datasheet's; a bandwidth in GB/s; a
    :class:`nslib.model.parallel.LinkSpec`); ``vocab_parallel``: tensor parallelism shards
    the embedding and output head too (Megatron's default)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    link: object = None
    vocab_parallel: bool = True

    def __post_init__(self):
        for k in ("dp", "tp", "pp", "microbatches"):
            object.__setattr__(self, k, check_int(k, getattr(self, k)))
        link = self.link
        if isinstance(link, (int, float)) and not isinstance(link, bool):
            object.__setattr__(self, "link",
                               check_float("link bandwidth (GB/s)", link, positive=True))
        object.__setattr__(self, "vocab_parallel", bool(self.vocab_parallel))

    @property
    def multi(self) -> bool:
        """Whether the step runs on more than one GPU (or in pipeline micro-batches)."""
        return self.dp != 1 or self.tp != 1 or self.pp != 1 or self.microbatches != 1


ONE_GPU = Parallel()


def parallel_of(parallel: Parallel | None) -> Parallel:
    """``parallel``, or one GPU when None; a TypeError naming the fix otherwise."""
    return one_of(parallel, Parallel, ONE_GPU, "Parallel(dp=..., tp=..., pp=...)")


def step_of(step) -> Step:
    """``step`` checked to be a :class:`Step` (a TypeError naming the fix otherwise)."""
    return one_of(step, Step, None, "Step(batch, seq, mode=...)")


def split_options(batch: int, seq: int, mode: str = "inf", **options) -> tuple[Step, Parallel]:
    """A :class:`Step` and a :class:`Parallel` from flat keyword options, the form the command
    line and the label variants (``{"dp": 4}``, ``{"fused": True}``) carry: Step's fields
    (``dtype``, ``fused``, ``imbalance``) and Parallel's (``dp``, ``tp``, ``pp``,
    ``microbatches``, ``link``, ``vocab_parallel``); a TypeError names an unknown option."""
    fields = {"step": ("dtype", "fused", "imbalance"),
              "parallel": ("dp", "tp", "pp", "microbatches", "link", "vocab_parallel")}
    unknown = sorted(set(options) - set(fields["step"]) - set(fields["parallel"]))
    if unknown:
        raise TypeError(f"unknown step option(s) {unknown}: a step takes "
                        f"{', '.join(fields['step'] + fields['parallel'])}")
    step = Step(batch, seq, mode, **{k: v for k, v in options.items() if k in fields["step"]})
    par = Parallel(**{k: v for k, v in options.items() if k in fields["parallel"]})
    return step, par
