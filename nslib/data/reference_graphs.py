"""The original tool's parsed operator graphs (``results/opgraph/<tag>.csv``) and the measured
per-operator latencies beside the labels (``label/<GPU>/<tag>.csv``).

Both hold the embedding and head plus ONE transformer layer (the original repeats it
``n_layer`` times); :func:`layer_span` finds that layer, :func:`class_ms` sums the measured
per-node latencies (ms) per kernel class with the layer rows repeated.
"""
from __future__ import annotations

import re

import pandas as pd

from nslib.data.paths import data_root, require

LAYER0 = re.compile(r"(^|_)(h|layer|layers|block)_0_")
LAYER1 = re.compile(r"(^|_)(h|layer|layers|block)_1_")
# FX targets that return a view or a Python value: the host runs them, no kernel is launched
HOST_TARGETS = re.compile(r"getitem|getattr|^(?:size|dim|view|split|chunk|permute|transpose|t|"
                          r"unsqueeze|squeeze|expand|narrow|select|detach)$")
# Selects read their inputs and a mask and write one output per element, with no arithmetic:
# elementwise operators, on the label side and the trace side alike (the original graph files
# ``where`` on its own, nslib's kernel tables under memory, and GPT-2's causal mask is a
# ``where`` in the measured code but an ``add`` in today's transformers).
SELECT_OPS = ("where", "masked_fill")
# What the graph's ``misc`` nodes launch, by the function or method they call: the nslib class
# of the aten op they run (:mod:`nslib.model.aten`). ``max`` is ``torch.max(a, b)`` in these
# graphs (OPT's clamp of the attention scores), the elementwise ``maximum``; casts, the
# comparisons that build masks, fills and gathers are memory ops.
MISC_TARGETS = {
    **{k: "elementwise" for k in ("max", "min", "add", "sub", "mul", "truediv", "pow")},
    **{k: "elementwise" for k in SELECT_OPS + ("masked_fill_",)},
    **{k: "memory" for k in ("lt", "gt", "eq", "ne", "to",
                             "type", "type_as", "long", "bool", "float", "arange", "full",
                             "ones", "zeros", "tensor", "cumsum", "embedding", "contiguous",
                             "reshape", "cat")},
}
MODULE_CLASS = re.compile(r"<class '[\w.]*?(\w+)'>\)\]\)")
MODULE_ROOTS = re.compile(r"^(transformer|bert|model|cls|lm_head|encoder|decoder|shared|"
                          r"final_logits)(_|$)")


def ref_class(kind: str) -> str:
    """The nslib kernel class of an original op kind (``Linear``, ``BMM``, ``VECln``, ``MEM``...)."""
    if kind == "Linear":
        return "linear"
    if kind == "BMM":
        return "bmm"
    if kind == "VECsoftmax":
        return "softmax"
    if kind == "VECln":
        return "layernorm"
    if kind.startswith("VEC"):
        return "elementwise"
    return "memory"


def layer_span(names: list[str]) -> tuple[int, int] | None:
    """[start, end) of the block-0 nodes in graph order; None when the graph holds every block.

    The layer runs from the first node named after block 0 (``transformer_h_0_...``) to the
    first later node of another top-level module (``transformer_ln_f``...): unnamed nodes in
    between (``matmul``, ``softmax``, ``add_10``) belong to the layer.
    """
    if any(LAYER1.search(n) for n in names):
        return None
    starts = [i for i, n in enumerate(names) if LAYER0.search(n)]
    if not starts:
        return None
    end = len(names)
    for i in range(starts[-1] + 1, len(names)):
        if MODULE_ROOTS.match(names[i]) and not LAYER0.search(names[i]):
            end = i
            break
    return starts[0], end


def load_opgraph(tag: str, data=None) -> pd.DataFrame:
    """The original parsed graph of configuration ``tag`` (e.g. ``gpt2_large-inf-1024-4``)."""
    return pd.read_csv(require(data_root(data) / "results" / "opgraph" / f"{tag}.csv",
                               f"original operator graph of {tag}"))


def class_ms(df: pd.DataFrame, n_layer: int, train: bool) -> pd.Series:
    """Measured ms per kernel class (:func:`node_classes`) of a label CSV's nodes
    (:func:`measured_nodes`), the layer's nodes counted ``n_layer`` times."""
    return (df["latency"] * layer_repeats(df, n_layer)).groupby(node_classes(df, train)).sum()


def node_classes(df: pd.DataFrame, train: bool) -> pd.Series:
    """The nslib class of each label node, by the kernels it launches.

    - ``host``: nodes that launch none (:func:`host_nodes`), dropout in inference (the
      identity), and a ``reshape`` or ``contiguous`` of a contiguous tensor (a view, the
      tensor itself);
    - the class of the original graph's ``OpName`` (:func:`ref_class`) where it names one,
      selects (:data:`SELECT_OPS`) as elementwise;
    - the graph's ``misc`` nodes by what they call: :data:`MISC_TARGETS`, embedding modules as
      memory (gathers), and ``other`` for the rest.
    """
    op = df["OpName"].fillna("misc").astype(str)
    base = df["target"].astype(str).map(_target_base)
    module = df.get("meta", pd.Series("", index=df.index)).astype(str).map(_module_class)
    misc = base.map(MISC_TARGETS).where(module != "Embedding", "memory").fillna("other")
    cls = op.map(ref_class).where(op != "misc", misc).where(~op.isin(SELECT_OPS), "elementwise")
    dropout = (op == "dropout") | (module == "Dropout") | (base == "dropout")
    view = base.isin(("reshape", "contiguous")) & _contiguous_input(df)
    host = host_nodes(df) | view | (dropout & (not train))
    return cls.where(~dropout, "memory").where(~host, "host")


def _contiguous_input(df: pd.DataFrame) -> pd.Series:
    """True where the node's first input was contiguous (the graph's ``input_contiguous``)."""
    flags = df.get("input_contiguous", pd.Series("", index=df.index))
    return flags.astype(str).str.startswith("[True")


def gemm_copies_inside(df: pd.DataFrame) -> bool:
    """Whether the measured code's batched GEMM nodes copy their own operands.

    ``torch.matmul`` copies operands it cannot view as 3-D batches and its node times those
    copies; ``torch.bmm`` copies nothing, so code calling it makes its operands contiguous in
    separate nodes first (OPT's ``contiguous()`` calls), timed as memory operators. False only
    when every BMM node of the graph calls ``bmm`` or ``baddbmm``.
    """
    gemm = df["OpName"].astype(str) == "BMM"
    base = df.loc[gemm, "target"].astype(str).map(_target_base)
    return not (len(base) and base.isin(("bmm", "baddbmm")).all())


def _target_base(target: str) -> str:
    """``<built-in method max of type object at 0x..>`` -> ``max``; method names as they are;
    a module path (``bert.embeddings.position_embeddings``) -> its last part."""
    m = re.match(r"<(?:built-in )?(?:function|method) (\w+)", target)
    return m.group(1) if m else target.rsplit(".", 1)[-1]


def _module_class(meta: str) -> str:
    """The class name of the innermost module of a node's ``nn_module_stack`` (``Embedding``),
    or ""."""
    m = MODULE_CLASS.search(meta)
    return m.group(1) if m else ""


def layer_repeats(df: pd.DataFrame, n_layer: int) -> pd.Series:
    """How many times each node of a one-layer graph runs: ``n_layer`` for the layer's nodes
    (:func:`layer_span`), 1 for the others."""
    span = layer_span(df["Name"].astype(str).tolist())
    rep = pd.Series(1, index=df.index)
    if span is not None:
        rep.iloc[span[0]:span[1]] = n_layer
    return rep


def host_nodes(df: pd.DataFrame) -> pd.Series:
    """True for the label CSV's nodes that launch no kernel: a non-tensor result (no dtype)
    or one of the view targets of :data:`HOST_TARGETS`."""
    return df["dtype"].isna() | df["target"].astype(str).str.contains(HOST_TARGETS)


def measured_nodes(gpu_key: str, tag: str, data=None) -> pd.DataFrame | None:
    """The label CSV's timed nodes (Name, target, dtype, latency ms) with the original graph's
    ``OpName``; None when the label has no CSV."""
    path = data_root(data) / "label" / gpu_key / f"{tag}.csv"
    if not path.exists():
        return None
    meas = pd.read_csv(path)
    missing = [c for c in ("Name", "target", "dtype", "latency") if c not in meas.columns]
    if missing:
        raise ValueError(f"{path}: per-operator label CSV without columns {missing}; is this "
                         "a NeuSight label CSV?")
    meas = meas[["Name", "target", "dtype", "latency"]
                + [c for c in ("op", "meta", "input_contiguous") if c in meas.columns]]
    graph = load_opgraph(tag.removesuffix("-fusion"), data)[["Name", "OpName"]]
    return meas.merge(graph, on="Name", how="left")
