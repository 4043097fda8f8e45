"""Serving iterations of a 16-bit model on one of ``tp`` GPUs: what an engine step costs.

An LLM serving engine runs *iterations*: each one pushes a set of tokens through every layer
(prompt tokens of requests being prefilled and one new token of each request decoding) and
samples one token for each request whose prompt is done. Outside attention, every kernel of
an iteration depends only on how many tokens it carries, ``T``: the GEMMs are ``[T x k] @
[k x n]``, the vector kernels touch ``T x hidden`` elements. Attention depends on each
request's own query and context lengths.

:class:`StepCost` prices iterations from the same trace and predictors as
``predict_model(..., dtype="bf16")`` (:func:`nslib.model.stream.stream_ms`), not a second model of
the GPU:

- **Token law.** The model is traced (16-bit, scaled-dot-product attention) at batch 1 and two
  sequence lengths, tensor-parallel sharded (:func:`nslib.model.parallel.shard_tensor_parallel`)
  and fused (:func:`nslib.model.fusion.fuse`: serving engines run fused norms, rotary and
  gated activations). Every dim of every row is then ``c * T**j`` with ``j`` 0 or 1, read off
  the two traces. Rows growing faster (``j >= 2``: the causal masks an eager model builds) are
  dropped: serving attention kernels take lengths, not masks.
- **Output head.** The causal LM's last GEMM (the vocabulary projection) runs only for the
  tokens that sample: one per request that decodes or finishes its prompt, not for every
  prompt token. Its rows take ``T = logits``.
- **Attention.** The trace's attention rows give the per-GPU heads, key/value heads, head dim
  and the layer count; each iteration's attention is priced by the 16-bit attention predictor
  per request group: prefill (``batch`` prompts of ``q = kv = isl``) and decode (``batch``
  requests, one query each, ``kv`` cached tokens).
- **Tensor parallelism.** All-reduces carry ``T x hidden`` 16-bit elements over the GPU's
  link (:func:`nslib.model.parallel.default_link`: the datasheet's ``Link_Bw``).

All distinct token counts of a whole sweep are priced in one batched predictor call per
kernel class. Units: ms, tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from nslib import __version__
from nslib.data.cache import JSON, cached
from nslib.data.paths import hash_files
from nslib.kernels import sizes
from nslib.kernels.dtypes import bytes_per_elem, check_dtype
from nslib.model.fusion import fuse
from nslib.model.config import is_causal_lm, load_model_config
from nslib.model.inputs import get_predictor, kernel_frame, resolve_gpu, traced
from nslib.model.parallel import default_link, model_info, resolve_link, shard_tensor_parallel
from nslib.model.stream import (LAUNCH_US, datasheet_columns, stream_ms, tensor_masks,
                                 tensor_predictors)
from nslib.model.sweep import identical_rows
from nslib.model.trace import TRACE_VERSION

DIMS = ("B", "M", "N", "K", "H", "flops", "bytes")
# (tokens, logits) pairs a StepCost keeps priced before it starts afresh
PRICED_KEPT = 100_000
# two probe token counts of the token law (ratio 1.5, as the scenario sweeps)
PROBE_TOKENS = (32, 48)


@dataclass(frozen=True)
class ServingSetup:
    """What a serving forecast is asked about: the model, the GPU, the tensor-parallel degree
    and the predictors. ``predictor`` prices the vector kernels (FP32-trained, at their real
    bytes), ``tensor_predictor`` the 16-bit GEMMs and attention (names of
    ``nslib.predictors.available("gemm")``, e.g. ``"nslib"`` or ``"roofline"``).
    Fitted predictors are accepted too (``tensor_predictor`` then a ``(gemm, attention)``
    pair). ``link``: None (the datasheet's), a bandwidth in GB/s or a LinkSpec."""

    model: object
    gpu: object
    tp: int = 1
    dtype: str = "bf16"
    predictor: str = "nslib"
    tensor_predictor: str = "nslib"
    link: object = None
    launch_us: float = LAUNCH_US
    quick: bool = False
    data: object = None


def _probe(setup: ServingSetup, info: dict, tokens: int) -> pd.DataFrame:
    tr = traced(setup.model, 1, tokens, "inf", setup.data, dtype=setup.dtype)
    tr = shard_tensor_parallel(tr, setup.tp, info)
    return engine_kernels(fuse(tr, prologues=True).reset_index(drop=True))


def engine_kernels(frame: pd.DataFrame) -> pd.DataFrame:
    """A fused forward trace as serving engines run it (vLLM, SGLang and TensorRT-LLM
    alike): the forward GEMMs of one layer that read the same input (query/key/value
    projections; gate and up projections) are one GEMM with their output widths summed, and
    each run of vector and memory kernels between two GEMM, attention or communication
    kernels of a layer is one fused kernel, priced as the largest of the run (the fused
    kernel still reads its largest input and writes its output; what passes between the run's
    kernels stays on chip). Rows outside the layers are kept as they are."""
    df = frame.reset_index(drop=True)
    gemm = df["cls"].isin(sizes.GEMM_CLASSES).to_numpy() & (df["phase"] == "fw").to_numpy()
    key = df["layer"].astype(str) + "|" + df["inputs"].astype(str) + "|" + \
        df["M"].astype(str) + "|" + df["N"].astype(str)
    drop = np.zeros(len(df), bool)
    layer = df["layer"].to_numpy()
    for _, idx in df[gemm & (layer >= 0)].groupby(key[gemm & (layer >= 0)]).groups.items():
        idx = list(idx)
        if len(idx) > 1:
            first = idx[0]
            df.at[first, "K"] = float(df.loc[idx, "K"].sum())
            df.at[first, "flops"] = float(df.loc[idx, "flops"].sum())
            df.at[first, "bytes"] = float(df.loc[idx, "bytes"].sum())
            drop[idx[1:]] = True
    vector = (df["cls"].isin(sizes.VECTOR_CLASSES) | (df["cls"] == "memory")).to_numpy()
    run = np.cumsum(~vector | (np.r_[True, layer[1:] != layer[:-1]]))
    for _, idx in df[vector & (layer >= 0)].groupby(run[vector & (layer >= 0)]).groups.items():
        idx = np.asarray(list(idx))
        if len(idx) > 1:
            keep = idx[int(np.argmax(df.loc[idx, "bytes"].to_numpy(float)))]
            drop[idx[idx != keep]] = True
    return df[~drop].reset_index(drop=True)


# columns the engine table keeps (what pricing needs; the trace's tuple columns stay out)
KEEP = ("kid", "phase", "aten", "cls", "op", *DIMS, "layer", "module", "kv_heads", "causal")
ENGINE_VERSION = 1  # bump when engine_kernels or the token law change


def model_sizes(model, data=None) -> dict:
    """``{heads, kv_heads, params, architecture, causal_lm, positions}`` of a model config
    (``params``: parameter count, tied weights once; ``architecture``: the transformers class
    the trace builds, ``causal_lm`` whether it generates token by token; ``positions``: its
    sequence limits in tokens, :func:`nslib.model.config.position_limits`), cached by config:
    the model is built on the meta device only the first time."""
    config = load_model_config(model, data)
    key = hash_files([], extra=[config, __version__, "serving-sizes-2"])

    def build():
        info = model_info(config, "inf")
        return {"heads": info["heads"], "kv_heads": info["kv_heads"],
                "params": sum(info["param_bytes"].values()) / sizes.BYTES_PER_ELEM,
                "architecture": info["architecture"],
                "causal_lm": is_causal_lm(info["architecture"]),
                "positions": info["positions"]}
    return cached("traces", f"sizes-{key}", build, "model sizes", JSON)


def check_servable(info: dict) -> None:
    """ValueError unless the model of ``info`` (:func:`model_sizes`) is a causal language
    model: serving iterations prefill prompts and decode one token at a time, which an
    encoder (BERT, ViT) or an encoder-decoder (T5, Whisper) does not."""
    if not info["causal_lm"]:
        raise ValueError(f"serving forecasts need a decoder-only causal language model (one "
                         f"that generates its output token by token, e.g. Llama, Qwen, GPT-2, "
                         f"OPT); this config builds {info['architecture']}, which is not one: "
                         f"serve a causal LM config, or forecast this model's forward pass "
                         f"with `nslib predict`")


def token_law(setup: ServingSetup, info: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """(rows with no attention, ``{dim: (c, j)}``) such that a dim at ``T`` tokens is
    ``c * T**j``; rows with any ``j >= 2`` and the attention rows are left out. The frame has
    a boolean ``head`` column: the output projection's rows."""
    table = engine_table(setup, info)
    rows = table[table["law"]].reset_index(drop=True)
    law = {c: (rows[f"c_{c}"].to_numpy(float), rows[f"j_{c}"].to_numpy(float)) for c in DIMS}
    return rows, law


def engine_table(setup: ServingSetup, info: dict | None = None) -> pd.DataFrame:
    """The engine's kernels at :data:`PROBE_TOKENS` tokens with their token law (columns
    ``c_<dim>``, ``j_<dim>``), ``head`` and ``law`` (False for attention rows and rows growing
    faster than the tokens); cached by the model config, ``tp`` and format."""
    config = load_model_config(setup.model, setup.data)
    key = hash_files([], extra=[config, int(setup.tp), setup.dtype, __version__, TRACE_VERSION,
                                ENGINE_VERSION, "engine"])
    return cached("traces", f"engine-{key}",
                  lambda: _engine_table(setup, info or model_info(config, "inf")),
                  "serving engine kernels")


def _engine_table(setup: ServingSetup, info: dict) -> pd.DataFrame:
    a, b = (_probe(setup, info, t) for t in PROBE_TOKENS)
    if len(a) != len(b) or (a["aten"].to_numpy() != b["aten"].to_numpy()).any():
        raise ValueError("this model launches different kernels at different prompt lengths; "
                         "its serving steps cannot be priced from a token law")
    t0, t1 = PROBE_TOKENS
    out = a[[c for c in KEEP if c in a.columns]].copy()
    keep = (a["cls"] != "attention").to_numpy().copy()
    for col in DIMS:
        x, y = a[col].to_numpy(float), b[col].to_numpy(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            j = np.round(np.log(y / x) / np.log(t1 / t0))
        j = np.where(np.isfinite(j), j, 0.0)
        keep &= j <= 1
        out[f"c_{col}"], out[f"j_{col}"] = x / t0 ** j, j
    gemm = np.flatnonzero((a["cls"].isin(sizes.GEMM_CLASSES) & (a["phase"] == "fw")).to_numpy())
    head = np.zeros(len(a), bool)
    if len(gemm) and int(a.at[gemm[-1], "layer"]) < 0:
        head[a["module"].to_numpy() == a.at[gemm[-1], "module"]] = True
    out["head"], out["law"] = head, keep
    return out.reset_index(drop=True)


def _at_tokens(rows: pd.DataFrame, law: dict, elem: np.ndarray, tokens: np.ndarray,
               logits: np.ndarray) -> pd.DataFrame:
    """``rows`` at each (tokens, logits) pair, one block after another; ``pair`` holds the
    pair's index."""
    n, m = len(rows), len(tokens)
    cols = [c for c in KEEP if c in rows.columns] + ["head"]
    df = rows[cols].iloc[np.tile(np.arange(n), m)].reset_index(drop=True)
    head = np.tile(rows["head"].to_numpy(), m)
    t = np.where(head, np.repeat(logits, n), np.repeat(tokens, n)).astype(float)
    for col in DIMS:
        c, j = (np.tile(v, m) for v in law[col])
        df[col] = np.where(j > 0, np.maximum(np.round(c * t ** j), 1.0), c)
    # a GEMM's bytes are affine in T, not a power of it: recomputed from the dims, at each
    # row's element size
    meas = df["cls"].isin(sizes.CLASSES).to_numpy()
    if meas.any():
        f, by = sizes.flops_bytes(df[meas])
        df.loc[meas, "flops"] = f
        df.loc[meas, "bytes"] = by * np.tile(elem, m)[meas] / sizes.BYTES_PER_ELEM
    df["pair"] = np.repeat(np.arange(m), n)
    return df


def _distinct_rows(rows: pd.DataFrame, law: dict, elem: np.ndarray):
    """((rows, law, elem) of the distinct kernels, how often each runs): the layers repeat
    the same kernels, which are priced once per token count."""
    key = rows[["phase", "cls", "op", "head"]].assign(
        elem=elem, **{f"{c}{k}": law[c][k] for c in DIMS for k in range(2)})
    first, count = identical_rows(key)
    small = rows.iloc[first].reset_index(drop=True)
    return ((small, {c: tuple(a[first] for a in law[c]) for c in DIMS}, elem[first]),
            count.astype(float))


class StepCost:
    """Prices serving iterations of ``setup`` (see the module doc).

    Use :meth:`tokens_ms` for the token-proportional part and :meth:`attention_ms` for
    attention; :meth:`iteration_ms` adds them.
    """

    def __init__(self, setup: ServingSetup):
        self.setup = setup
        self.spec = resolve_gpu(setup.gpu, setup.data)
        datasheet_columns(self.spec)   # a datasheet without Bf16FLOPs fails here
        self.dtype = check_dtype(setup.dtype)
        if self.dtype == "fp32":
            raise ValueError("serving forecasts are 16-bit: use dtype 'bf16' or 'fp16'")
        self.info = model_sizes(setup.model, setup.data)
        check_servable(self.info)
        if self.info["heads"] % setup.tp or self.info["kv_heads"] % setup.tp:
            ok = [t for t in range(1, self.info["kv_heads"] + 1)
                  if self.info["heads"] % t == 0 and self.info["kv_heads"] % t == 0]
            raise ValueError(f"tp={setup.tp} must divide the model's {self.info['heads']} "
                             f"attention heads and {self.info['kv_heads']} key/value heads: "
                             f"use --tp {', '.join(map(str, ok))}")
        self.rows, self.law = token_law(setup)
        self._elem = np.nan_to_num(sizes.elem_bytes(self.rows), nan=sizes.BYTES_PER_ELEM)
        self._distinct, self._count = _distinct_rows(self.rows, self.law, self._elem)
        self._priced: dict = {}   # (tokens, logits) -> (gemm, vector, comm) ms
        self._attended: dict = {}  # (phase, batch, q_len, kv_len) -> every layer's ms
        self.link = resolve_link(setup.link, self.spec, setup.data) if setup.link is not None \
            else default_link(self.spec, setup.data)
        attn = engine_table(setup)
        attn = attn[attn["cls"] == "attention"]
        if attn.empty:
            raise ValueError("the traced model has no scaled-dot-product attention rows: "
                             "serving forecasts need a decoder with attention")
        first = attn.iloc[0]
        self.layers = int(len(attn))
        self.heads = float(first["H"])
        self.kv_heads = float(self.info["kv_heads"] // setup.tp)
        self.head_dim = float(first["N"])

    @cached_property
    def predictors(self):
        """(vector predictor, (GEMM, attention) 16-bit predictors), trained or cached."""
        s = self.setup
        tensor = (tensor_predictors(s.tensor_predictor, s.quick)
                  if isinstance(s.tensor_predictor, str) else tuple(s.tensor_predictor))
        return get_predictor(s.predictor, s.data, s.quick), tensor

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token takes on one GPU (every layer's keys and values)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * bytes_per_elem(self.dtype)

    def weight_bytes(self) -> float:
        """Parameter bytes on one GPU: the blocks' and the head's split ``tp`` ways, in the
        model's 16-bit format (the embedding table and norms counted the same way)."""
        total = self.info["params"]
        return total * bytes_per_elem(self.dtype) / self.setup.tp

    def _frame(self, tokens: np.ndarray, logits: np.ndarray) -> pd.DataFrame:
        """The law's rows at each (tokens, logits) pair, one block after another; ``pair``
        holds the pair's index."""
        return _at_tokens(self.rows, self.law, self._elem, tokens, logits)

    def tokens_ms(self, tokens, logits) -> np.ndarray:
        """Time (ms) of everything but attention for iterations of ``tokens`` tokens of which
        ``logits`` sample (arrays of the same shape; each distinct pair priced once)."""
        return sum(self.token_parts(tokens, logits).values())

    def token_parts(self, tokens, logits) -> dict:
        """:meth:`tokens_ms` split into ``{"gemm": 16-bit GEMMs, "vector": the rest of the
        kernels, "comm": all-reduces}`` (ms arrays of ``tokens``' shape)."""
        tokens = np.maximum(np.asarray(tokens, float), 1.0)
        logits = np.clip(np.asarray(logits, float), 1.0, tokens)
        pairs, inv = np.unique(np.ceil(np.stack([tokens.ravel(), logits.ravel()], 1)),
                               axis=0, return_inverse=True)
        # the schedule asks again for the token counts it priced (each interval bound reruns
        # it with the same counts): only new pairs are priced
        keys = [tuple(p) for p in pairs.tolist()]
        _fill(self._priced, keys, lambda new: self._price(np.array(new)))
        per = np.array([self._priced[k] for k in keys]).reshape(len(pairs), 3)
        return {part: per[inv.ravel(), j].reshape(tokens.shape)
                for j, part in enumerate(("gemm", "vector", "comm"))}

    def _price(self, pairs: np.ndarray) -> np.ndarray:
        """(gemm, vector, comm) ms of each (tokens, logits) row of ``pairs``."""
        rows, law, elem = self._distinct
        df = _at_tokens(rows, law, elem, pairs[:, 0], pairs[:, 1])
        comm = (df["cls"] == "comm").to_numpy()
        ms, gemm = np.zeros(len(df)), np.zeros(len(df), bool)
        if (~comm).any():
            vec, tensor = self.predictors
            kf = kernel_frame(df[~comm].drop(columns=["pair", "head"]), self.spec)
            ms[~comm] = stream_ms(vec, kf, self.setup.launch_us, self.setup.data,
                                  tensor=(self.spec, *tensor))
            gemm[~comm] = tensor_masks(kf)[0]
        if comm.any():
            ms[comm] = self.link.allreduce_ms(df.loc[comm, "bytes"].to_numpy(float),
                                              self.setup.tp)
        ms *= np.tile(self._count, len(pairs))   # each distinct kernel as often as it runs
        pair = df["pair"].to_numpy()
        return np.stack([np.bincount(pair[m], weights=ms[m], minlength=len(pairs))
                         for m in (gemm, ~gemm & ~comm, comm)], axis=1)

    def attention_ms(self, phase, batch, q_len, kv_len) -> np.ndarray:
        """Time (ms) of every layer's attention for groups of ``batch`` requests with ``q_len``
        query and ``kv_len`` key tokens each (``phase`` ``"prefill"`` or ``"decode"``;
        arrays broadcast together); 0 where ``batch`` is 0."""
        phase, batch, q_len, kv_len = np.broadcast_arrays(
            np.asarray(phase), *(np.asarray(v, float) for v in (batch, q_len, kv_len)))
        out = np.zeros(batch.shape)
        live = batch.ravel() > 0
        if not live.any():
            return out
        keys = list(zip(phase.ravel()[live].tolist(), np.ceil(batch.ravel()[live]).tolist(),
                        np.ceil(q_len.ravel()[live]).tolist(),
                        np.ceil(kv_len.ravel()[live]).tolist()))
        # as for the token counts: the schedule and its interval bounds ask again for the
        # groups they priced, and only new ones go to the predictor
        _fill(self._attended, keys, self._attention)
        out.ravel()[np.flatnonzero(live)] = [self._attended[k] for k in keys]
        return out

    def _attention(self, groups: list) -> list:
        """Every layer's attention (ms) of each (phase, batch, q_len, kv_len) of ``groups``."""
        uniq = pd.DataFrame(groups, columns=["phase", "batch", "q_len", "kv_len"])
        rows = uniq.assign(heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                           causal=uniq["phase"] == "prefill", **datasheet_columns(self.spec))
        ms = np.asarray(self.predictors[1][1].predict(rows), float) * self.layers
        if self.setup.launch_us is not None:
            ms = np.maximum(ms, self.layers * self.setup.launch_us / 1000.0)
        return ms.tolist()


def _fill(memo: dict, keys: list, price) -> None:
    """Add to ``memo`` the ``keys`` it lacks, priced once each by ``price(new keys)`` (a
    sequence of values in their order); a memo holding more than :data:`PRICED_KEPT` entries
    is emptied first (bounded memory in a long sweep)."""
    if len(memo) > PRICED_KEPT:
        memo.clear()
    new = list(dict.fromkeys(k for k in keys if k not in memo))
    if new:
        memo.update(zip(new, price(new)))


class ScaledCost:
    """A :class:`StepCost` whose parts are scaled: ``factors`` maps ``gemm``, ``vector``,
    ``comm`` and ``attention`` to multipliers (1 where absent). The serving schedule run on
    it with every part at its interval's bound gives the bound of TTFT, TPOT and throughput
    (they only grow with each part's time), the parts moving together as one GPU's kernels
    do (:mod:`nslib.predictors.intervals`)."""

    def __init__(self, cost: StepCost, factors: dict):
        self.cost, self.factors = cost, dict(factors)

    def __getattr__(self, name):
        return getattr(self.cost, name)

    def tokens_ms(self, tokens, logits) -> np.ndarray:
        parts = self.cost.token_parts(tokens, logits)
        return sum(v * self.factors.get(k, 1.0) for k, v in parts.items())

    def attention_ms(self, phase, batch, q_len, kv_len) -> np.ndarray:
        return self.cost.attention_ms(phase, batch, q_len, kv_len) * \
            self.factors.get("attention", 1.0)
