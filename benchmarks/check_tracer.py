"""Check nslib.model.trace.trace against the original NeuSight operator graphs (results/opgraph).

For every configuration ``<model>-<inf|train>-<seq>-<batch>.csv`` in results/opgraph (the
``-fusion``, ``-dp4``, ``-tp4``, ``-pp4_*`` variants are skipped: their kernels are those of a
base configuration that is checked), trace the model with :func:`nslib.model.trace.trace` and
compare:

- total GEMM FLOPs of the forward and of the backward pass. Reference: the one-layer graph
  with the transformer-layer nodes repeated ``n_layer`` times (Switch-XL-4's graph holds every
  block already and is taken as is);
- kernel counts per class (ours / reference; the reference counts one-layer nodes times
  n_layer the same way).

Exit status 1 if any forward or backward GEMM FLOP total differs by more than 1 %.

Reading the reference. Each node's FwOps / BwOps / AccOps is a list like
``[['Linear', (M, N, K)]]``, ``[['BMM', (B, M, N, K)]]``, ``[['VECadd', (B, H)]]``,
``[['MEM', (shapes...)]]``. The layer is the span of nodes from the first node named after
block 0 (``transformer_h_0_...``, ``bert_encoder_layer_0_...``, ``model_decoder_layers_0_...``)
up to the first later node named after a model-level module (``transformer_ln_f``,
``bert_pooler_dense``, ``model_decoder_final_layer_norm``...): the unnamed nodes inside it
(``matmul``, ``softmax``, ``add_10``...) belong to the layer too.

Result (see the table it prints): forward and backward GEMM FLOPs agree exactly (0.00 %) for
all 24 base configurations, and so do the GEMM kernel counts except Switch's (below).

Why the other kernel counts differ:

- The reference is a torch.fx graph of Python-level calls, ours the aten ops a GPU runs.
  Python ``getitem`` on size tuples appears in the reference as ``MEM ((1,), (1,))``; it
  launches nothing (dropped from the reference counts here). Its ``getitem`` of ``split``
  outputs and of the causal-mask buffer are views: no kernel for us.
- Matmul internals: ``torch.matmul`` on 4-D attention tensors folds to ``bmm`` and copies
  non-contiguous operands (the permuted Q/K/V heads) with ``clone`` first, and the backward
  ``bmm``s copy their transposed operands too (fewer copies at batch 1, where some
  transposes are already contiguous). The reference has one ``matmul`` node and no copy, so
  we have more memory kernels.
- Biases: ``addmm`` folds the forward bias add into the GEMM on both sides; in the backward
  each bias gradient is a column-sum reduction (``sum.dim_IntList``, memory) that the
  reference does not list.
- Backward elementwise: autograd's formulas differ from the reference's rules. The reference
  gives a forward ``add`` two backward ``MEM`` copies where we launch nothing, but we add the
  gradients of every tensor used twice (residual branches, the Q/K/V input, the tied
  embedding) with an ``add``; GELU-new's ``pow`` backward is ``pow``, ``mul``, ``mul``...
- LayerNorm backward: the reference records a ``VECmul`` (elementwise); we emit an ``ln``
  row for the input gradient and a memory row for the weight/bias gradient reduction (the
  two kernels CUDA runs). Softmax backward: the reference lists a ``VECmul`` and a
  ``VECsoftmax``, we have the one ``_softmax_backward_data`` kernel.
- Dropout (training): both sides record the forward as memory; our backward is one
  masked-scale kernel (elementwise ``mul``) where the reference lists two MEM copies. OPT's
  attention dropout has p = 0, for which CUDA launches nothing; the reference still lists
  it.
- Gradient accumulation: the reference lists one ``VECadd`` per weight and bias in AccOps;
  we trace the same adds (``add_``), except for parameters the reference invents (a bias of
  GPT-2's LM head) or counts twice (the tied embedding).
- Masks and scaling: the reference divides the scores (``truediv``) and applies the causal
  mask per layer with ``where`` (MEM); transformers 5 builds the mask once per model with a
  few small kernels and per layer multiplies by the scale (``mulu``) and adds the mask
  (``add``): one elementwise kernel more and one memory kernel less per layer. BERT without
  an attention mask gets no mask add at all in transformers 5 (the reference adds an all-ones
  mask per layer).
- BERT: the reference's inference graph is BertForSequenceClassification (pooler + 2-way
  classifier), its training graph BertForPreTraining (pooler + MLM + NSP heads);
  nslib.model.trace.trace builds the same (MEASURED_ARCHITECTURE), so its GEMMs match.
- Switch-XL-4: the reference records 11 attention-score matmuls as ``Linear
  (batch*heads*seq, d_kv, seq)`` instead of ``BMM`` (same FLOPs): our linear/bmm counts are
  553/144 against its 564/133. Its two extra softmaxes (and a few reductions) are the router
  load-balancing loss over the concatenated router logits (``(6144, 4)``), which
  transformers 5 computes only when labels are passed; we leave it out (negligible). Its
  experts read and write their token blocks with ``getitem``/``setitem`` (MEM), ours with
  ``index_select``/``index_add_``; RMSNorm's ``rsqrt`` is MEM there and a unary elementwise
  (``tanh``-class) kernel here.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nslib.data.paths import data_root
from nslib.data.reference_graphs import layer_span, ref_class
from nslib.model.config import load_model_config
from nslib.model.trace import trace
from nslib.model.step import Step

CLASSES = ("linear", "bmm", "elementwise", "softmax", "layernorm", "memory")
NAME_RE = re.compile(r"^(?P<model>.+?)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)"
                     r"(?P<suffix>-.+)?$")
def gemm_flops(kind: str, dims) -> float:
    if kind == "Linear":
        m, n, k = dims
        return 2.0 * m * n * k
    if kind == "BMM":
        b, m, n, k = dims
        return 2.0 * b * m * n * k
    return 0.0


def is_size_getitem(kind: str, dims) -> bool:
    """A MEM entry whose every shape is (1,): Python size arithmetic, no kernel."""
    if kind != "MEM":
        return False
    try:
        return all(tuple(s) == (1,) for s in dims)
    except TypeError:
        return False


def reference(path: Path, n_layer: int) -> dict:
    df = pd.read_csv(path)
    names = df["Name"].astype(str).tolist()
    span = layer_span(names)
    out = {"fw_gemm": 0.0, "bw_gemm": 0.0, "fw": Counter(), "bw": Counter(), "full": span is None}
    for i, row in enumerate(df.itertuples(index=False)):
        rep = n_layer if span is not None and span[0] <= i < span[1] else 1
        for col, phase in (("FwOps", "fw"), ("BwOps", "bw"), ("AccOps", "bw")):
            ops = ast.literal_eval(getattr(row, col)) if isinstance(getattr(row, col), str) else []
            for kind, dims in ops:
                if is_size_getitem(kind, dims):
                    continue
                out[phase][ref_class(kind)] += rep
                if col != "AccOps":
                    out[f"{phase}_gemm"] += rep * gemm_flops(kind, dims)
    return out


def n_layers(cfg: dict) -> int:
    for k in ("n_layer", "num_hidden_layers", "num_layers"):
        if k in cfg:
            return int(cfg[k])
    raise ValueError("config has no layer count")


def ours(cfg: dict, batch: int, seq: int, mode: str) -> tuple[dict, float]:
    trace(cfg, Step(1, 8, mode))  # warm-up: imports the model's transformers module
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr = trace(cfg, Step(batch, seq, mode))
    dt = time.perf_counter() - t0
    for w in caught:
        print(f"  warning: {w.message}", file=sys.stderr)
    gemm = tr["cls"].isin(("linear", "bmm"))
    out = {"fw_gemm": float(tr.loc[gemm & (tr["phase"] == "fw"), "flops"].sum()),
           "bw_gemm": float(tr.loc[gemm & (tr["phase"] == "bw"), "flops"].sum()),
           "fw": Counter(tr.loc[tr["phase"] == "fw", "cls"]),
           "bw": Counter(tr.loc[tr["phase"] == "bw", "cls"])}
    return out, dt


def pct(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return 100.0 * (a - b) / b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="NeuSight data (default: NSLIB_DATA, or "
                    "../shared/neusight when the default folder is absent)")
    ap.add_argument("--only", default=None, help="regex on the configuration name")
    ap.add_argument("--tol", type=float, default=1.0, help="allowed GEMM FLOP difference, %%")
    args = ap.parse_args(argv)
    data = args.data
    if data is None:
        try:
            data_root(None)
        except FileNotFoundError:
            data = str(Path(__file__).resolve().parents[2] / "shared" / "neusight")
    root = data_root(data)
    files = sorted((root / "results" / "opgraph").glob("*.csv"))
    rows, bad, skipped = [], [], []
    for f in files:
        m = NAME_RE.match(f.stem)
        if not m or (args.only and not re.search(args.only, f.stem)):
            continue
        if m["suffix"]:
            skipped.append(f.stem)
            continue
        cfg = load_model_config(m["model"], data=data)
        mode, seq, batch = m["mode"], int(m["seq"]), int(m["batch"])
        ref = reference(f, n_layers(cfg))
        got, dt = ours(cfg, batch, seq, mode)
        d_fw = pct(got["fw_gemm"], ref["fw_gemm"])
        d_bw = pct(got["bw_gemm"], ref["bw_gemm"])
        row = {"config": f.stem,
               "fw GF ours": got["fw_gemm"] / 1e9, "fw GF ref": ref["fw_gemm"] / 1e9,
               "fw diff%": d_fw,
               "bw GF ours": got["bw_gemm"] / 1e9, "bw GF ref": ref["bw_gemm"] / 1e9,
               "bw diff%": d_bw, "trace s": dt}
        for phase in ("fw", "bw"):
            for c in CLASSES:
                row[f"{phase} {c}"] = f"{got[phase].get(c, 0)}/{ref[phase].get(c, 0)}"
        rows.append(row)
        if abs(d_fw) > args.tol or abs(d_bw) > args.tol:
            bad.append(f.stem)
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 50,
                           "display.float_format", "{:.2f}".format):
        flops_cols = ["config", "fw GF ours", "fw GF ref", "fw diff%", "bw GF ours",
                      "bw GF ref", "bw diff%", "trace s"]
        print("GEMM FLOPs (GFLOP), ours vs reference:")
        print(table[flops_cols].to_string(index=False))
        for phase in ("fw", "bw"):
            print(f"\n{phase} kernel counts per class, ours/ref (ref: size getitems dropped):")
            print(table[["config"] + [f"{phase} {c}" for c in CLASSES]].to_string(index=False))
    if skipped:
        print(f"\nskipped (variants of a base configuration): {', '.join(skipped)}")
    if bad:
        print(f"\nFAIL: GEMM FLOPs differ by more than {args.tol}% in: {', '.join(bad)}")
        return 1
    print(f"\nOK: all {len(rows)} configurations within {args.tol}% on forward and backward "
          f"GEMM FLOPs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
