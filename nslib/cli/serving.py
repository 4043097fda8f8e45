"""``nslib serve`` and ``nslib eval-serving``: LLM serving forecasts from the command line.

A thin layer over :mod:`nslib.model.serving` (the forecast) and
:mod:`nslib.evaluation.serving_eval` (the check against aiconfigurator's measured sample).
"""
from __future__ import annotations

import json
import sys
import warnings

import pandas as pd

from nslib.cli.common import (DefaultsFormatter, check_tensor_peak, cli_gpu, fmt_count,
                              fmt_fixed, tensor_sheets)
from nslib.cli.intervals import calibrate_hint
from nslib.data.checks import arg_float, arg_int


GPU_FILE = "--gpu FILE.json"  # where serve takes a datasheet file


def _serve(args) -> int:
    from nslib.data.settings import Settings
    from nslib.model.serving import FRAMEWORKS, Workload, serving_forecast, waiting_note
    if args.framework not in FRAMEWORKS:
        raise ValueError(f"unknown --framework {args.framework!r}; use one of "
                         f"{', '.join(FRAMEWORKS)}")
    _check_gpu(args.gpu)
    if args.link_bw is not None and args.tp == 1:
        raise ValueError("--link-bw prices the tensor-parallel all-reduce between GPUs: it "
                         "applies with --tp 2 or more (one GPU crosses no link)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        work = Workload(args.isl, args.osl, args.framework, args.tp, args.link_bw)
        frame = serving_forecast(args.model, args.gpu, args.concurrency, work, args.predictor,
                                 tensor_predictor=args.tensor_predictor,
                                 settings=Settings(quick=args.quick))
    notes = list(dict.fromkeys(str(w.message) for w in caught))
    mem = frame.attrs["memory"]
    if not frame["fits"].any():
        raise ValueError(_no_fit(mem, args))
    if args.json:
        print(json.dumps({"gpu": frame.attrs["gpu"], "model": str(args.model),
                          "kv_cache_tokens": mem["kv_tokens"],
                          "weights_gib_per_gpu": mem["weight_bytes"] / 2 ** 30,
                          "forecasts": _json_rows(frame, args.osl), "warnings": notes},
                         indent=1))
        return 0
    print(f"{args.model} on {args.tp} x {frame.attrs['gpu']} ({args.framework} defaults), "
          f"{fmt_count(args.isl)} prompt / {fmt_count(args.osl)} output tokens per request")
    print(f"weights {mem['weight_bytes'] / 2 ** 30:.1f} GiB per GPU; the KV cache holds "
          f"{fmt_count(mem['kv_tokens'])} tokens")
    print(_table(frame, args.osl).to_string(index=False))
    print(_ttft_note(FRAMEWORKS[args.framework].mixed))
    short = frame[frame["kv_bound"]]
    if len(short):
        print(f"the KV cache holds {fmt_count(short['running'].iloc[0])} requests of this "
              "length: the others queue (their wait is in TTFT)")
    waits = waiting_note(args.framework)
    if waits and (frame["concurrency"] > 1).any():
        print(waits)
    if "interval_coverage" not in frame.attrs:
        hint = calibrate_hint(args.predictor, args.quick, args.tensor_predictor)
        if hint:
            print(hint, file=sys.stderr)
    for n in notes:
        print(f"warning: {n}", file=sys.stderr)
    return 0


def _no_fit(mem: dict, args) -> str:
    """Why not one request fits on the GPU (:func:`nslib.model.serving.no_fit`), and which
    option to change."""
    from nslib.model.serving import no_fit

    what, weights = no_fit(mem, args.isl + args.osl)
    fix = "to split the weights over more GPUs" if weights else "or shorten --isl / --osl"
    return f"does not fit: {what}; raise --tp (now {args.tp}) {fix}"


def _check_gpu(gpu) -> None:
    """ValueError (KeyError for an unknown name) naming serve's own options unless ``gpu``
    names a datasheet with the tensor-core peak a 16-bit serving forecast needs."""
    try:
        spec = cli_gpu(gpu, GPU_FILE)
    except KeyError as e:   # unknown or ambiguous: say which of the names serving can use
        served = sorted(tensor_sheets())
        raise KeyError(f"{e.args[0]}; serving (16-bit) needs a datasheet with "
                       f"'Bf16FLOPs', as these have: {', '.join(served)}") from None
    check_tensor_peak(spec, gpu, GPU_FILE, "serving forecasts are 16-bit")


def _ttft_note(mixed: bool) -> str:
    """One line on what the TTFT columns are, for an engine that mixes prompts into decode
    iterations or runs them first (:mod:`nslib.model.serving.schedule`)."""
    point = ("that wait plus the geometric mean of the rest of the range" if mixed else
             "its waves, the burst end (prompts run first, so arrivals merge)")
    return ("TTFT lone-burst: a request arriving alone .. every request at once (how the "
            f"requests arrive is not known; both include any wait for a KV slot); ttft_ms: "
            f"{point}\ntok/s: the schedule's own cycle (the GPU's work per request, which the "
            "arrival pattern does not change); latency_ms: ttft_ms + (osl - 1) tpot_ms")


# TPOT columns: with one output token a request has no time between tokens
TPOT_KEYS = ("tpot_ms", "tpot_lo_ms", "tpot_hi_ms")


def _json_rows(frame: pd.DataFrame, osl: int) -> list[dict]:
    """The forecast rows for JSON: figures rounded to 4 decimals, ``fits`` a boolean, the
    TPOTs (ms) null when a request has one output token."""
    return [{k: (bool(v) if k == "fits" else None if k in TPOT_KEYS and osl == 1
                 else round(float(v), 4) if isinstance(v, float) else v)
             for k, v in r.items()} for r in frame.to_dict("records")]


def _table(frame: pd.DataFrame, osl: int) -> pd.DataFrame:
    """The forecast as people read it: counts whole, latencies (ms) and rates (tokens/s)
    fixed with one decimal, TPOT n/a for one output token; the calibrated intervals (``nslib
    calibrate``) beside when the frame has them."""
    def fixed(col):
        return [fmt_fixed(v, 1) for v in frame[col]]
    show = pd.DataFrame({"concurrency": [fmt_count(v) for v in frame["concurrency"]],
                         "running": [fmt_count(v) for v in frame["running"]],
                         "ttft_ms": fixed("ttft_ms"),
                         "tpot_ms": fixed("tpot_ms") if osl > 1 else "n/a",
                         "latency_ms": fixed("latency_ms"), "tok/s": fixed("tokens_per_s"),
                         "tok/s/GPU": fixed("tokens_per_s_gpu")})
    if "ttft_lone_ms" in frame:   # what the arrival pattern, which no forecast knows, spans
        show["TTFT lone-burst"] = [f"{fmt_fixed(lo, 1)}-{fmt_fixed(hi, 1)}" for lo, hi in
                                   zip(frame["ttft_lone_ms"], frame["ttft_burst_ms"])]
    cover = frame.attrs.get("interval_coverage")
    if cover:
        for k, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
            show[f"{label} {100 * cover:.0f}%"] = "n/a" if k == "tpot" and osl == 1 else [
                f"{fmt_fixed(lo, 1)}-{fmt_fixed(hi, 1)}"
                for lo, hi in zip(frame[f"{k}_lo_ms"], frame[f"{k}_hi_ms"])]
    return show


def _eval_serving(args) -> int:
    from nslib.data.serving_sample import serving_rows
    from nslib.evaluation.serving_eval import (error_table, predict_sample, summary_json,
                                               unpriced)
    rows = serving_rows(args.sample)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = predict_sample(rows, quick=args.quick, progress=not args.json,
                              held_out=args.held_out)
    if pred.empty:
        reasons = rows["reason"].value_counts()
        raise ValueError("no row of the sample can be priced: " + "; ".join(
            f"{n} x {r}" for r, n in reasons.items() if r) + (
            "; " + "; ".join(pred.attrs["not_priced"]["reason"].unique())
            if len(pred.attrs.get("not_priced", [])) else ""))
    tab = error_table(pred)
    if args.json:
        print(json.dumps(summary_json(tab, rows), indent=1))
        return 0
    print(f"Serving sample: {len(pred)} rows priced, {int((rows['reason'] != '').sum())} not"
          + ("; each GPU's rows by predictors that never saw its kernels" if args.held_out
             else ""))
    cols = {"nslib_ttft_mape": "TTFT MAPE", "nslib_ttft_ratio": "TTFT pred/meas",
            "nslib_tpot_mape": "TPOT MAPE", "nslib_tpot_ratio": "TPOT pred/meas",
            "roofline_ttft_mape": "roofline TTFT", "roofline_tpot_mape": "roofline TPOT",
            "nslib_ttft_in_arrivals": "TTFT lone-burst %"}
    cols = {k: v for k, v in cols.items() if k in tab}
    print(tab[["framework", "model_path", "gpu", "n", *cols]].rename(columns=cols)
          .round(2).to_string(index=False))
    print("MAPE in %; pred/meas: the median ratio; roofline: the same schedule priced by the "
          "rooflines"
          + ("; TTFT lone-burst %: the share of rows whose measured TTFT lies between a "
             "request arriving alone and every request at once" if
             "nslib_ttft_in_arrivals" in tab else ""))
    miss = unpriced(rows)
    if len(miss):
        print("\nnot priced (rows by reason):")
        print(miss.to_string(index=False))
    for _, r in pred.attrs.get("not_priced", pd.DataFrame()).iterrows():
        print(f"not priced: {r['model_path']} on {r['system']} tp {r['tp_size']:g}: "
              f"{r['reason']}")
    return 0


def add_serving_parsers(sub) -> None:
    s = sub.add_parser("serve", help="forecast LLM serving: TTFT, TPOT, tokens/s",
                       formatter_class=DefaultsFormatter)
    s.add_argument("--model", required=True, help="a causal LM (decoder) config: name or JSON "
                   "path, or a HuggingFace id with a config in the project (meta-llama/"
                   "Llama-3.1-8B-Instruct, Qwen/Qwen3-32B)")
    s.add_argument("--gpu", required=True, help="GPU name, alias or datasheet JSON (needs "
                   "Bf16FLOPs)")
    s.add_argument("--isl", type=arg_int(), default=1024, help="prompt tokens per request")
    s.add_argument("--osl", type=arg_int(), default=128, help="output tokens per request")
    s.add_argument("--concurrency", type=arg_int(), nargs="+", default=[16],
                   help="requests in flight (several values: a sweep)")
    s.add_argument("--tp", type=arg_int(), default=1, help="tensor-parallel GPUs")
    s.add_argument("--framework", default="vllm", help="engine defaults: vllm, sglang, trtllm")
    s.add_argument("--predictor", default="nslib", help="vector-kernel predictor")
    s.add_argument("--tensor-predictor", default="nslib",
                   help="16-bit GEMM and attention predictor (nslib, roofline, ...)")
    s.add_argument("--link-bw", type=arg_float(positive=True), default=None,
                   help="GPU-to-GPU link, GB/s both directions (default: datasheet Link_Bw)")
    s.add_argument("--quick", action="store_true", help="quick-profile predictors")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_serve)

    s = sub.add_parser("eval-serving", help="serving forecasts against aiconfigurator's "
                       "measured TTFT/TPOT sample")
    s.add_argument("--sample", help="silicon_sample.csv (default: the one in the 16-bit data)")
    s.add_argument("--quick", action="store_true", help="quick-profile predictors")
    s.add_argument("--held-out", action="store_true",
                   help="price each GPU's rows with predictors trained without its kernels "
                        "(leave-one-GPU-out folds, cached): the GPU as one nobody measured")
    s.add_argument("--json", action="store_true",
                   help="{framework/model: {GPU: {ttft_mape, tpot_mape, n}}, unpriced: {...}}")
    s.set_defaults(func=_eval_serving)


__all__ = ["add_serving_parsers"]
