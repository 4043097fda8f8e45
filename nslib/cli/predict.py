"""``nslib predict``: one model on one GPU, as a table or JSON."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from nslib.cli.common import (DefaultsFormatter, check_generates, check_tensor_peak, cli_gpu,
                              fmt_count, fmt_fixed, power_hint, print_warnings)
from nslib.cli.intervals import calibrate_hint
from nslib.data.checks import arg_float, arg_int
from nslib.data.settings import Settings
from nslib.kernels.dtypes import DTYPES
from nslib.model.memory import memory_of, trace_memory
from nslib.model.parallel import LINK_UTILISATION
from nslib.model.predict import predict_model
from nslib.model.stream import LAUNCH_US
from nslib.model.step import Parallel, Step, split_options
from nslib.model.trace import ModelNoteWarning, model_notes
from nslib.predictors.gpu_range import DatasheetRangeWarning

GPU_FILE = "--gpu-spec FILE"  # where predict takes a datasheet file


def _predict(args) -> int:
    if bool(args.model) == bool(args.module):
        raise ValueError("give one of --model CONFIG (with --batch and --seq) and --module "
                         "FILE.py[:NAME] (a PyTorch module)")
    if args.gpu and args.gpu_spec:
        raise ValueError("give one of --gpu NAME and --gpu-spec FILE, not both")
    if not (args.gpu or args.gpu_spec):
        raise ValueError("name a GPU with --gpu NAME (see `nslib gpus`) or --gpu-spec FILE.json")
    if args.module:
        return _predict_module(args)
    if args.inputs is not None:
        raise ValueError("--inputs gives a module's input shapes: use it with --module")
    if args.tf32:
        raise ValueError("--tf32 applies to a module's convolutions (--module); a model "
                         "config's GEMMs run in FP32, PyTorch's default for matmuls")
    if args.batch is None or args.seq is None:
        raise ValueError("--model needs --batch N and --seq N")
    if args.kv_cache:
        check_generates(args.model)
    # a spec is always a file, whatever its suffix
    gpu = Path(args.gpu_spec) if args.gpu_spec else args.gpu
    spec = cli_gpu(gpu, GPU_FILE)
    name = spec.name   # the datasheet the name resolved to, for the report
    if (args.dtype or "fp32") != "fp32":
        check_tensor_peak(spec, gpu, GPU_FILE, f"a {args.dtype} step runs on the tensor cores")
    extra = _options(args)
    # how the step is priced; the rest describes the step and its GPUs
    pricing = {k: extra.pop(k) for k in ("tensor_predictor", "launch_us") if k in extra}
    step, par = split_options(args.batch, args.seq, args.mode, **extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame, summary = predict_model(gpu, args.model, step, args.predictor, parallel=par,
                                       settings=Settings(quick=args.quick), **pricing)
        mem, per_gpu = _memory(args, gpu, step, par, frame)
    _write_kernels(args, frame)
    summary = {"gpu": args.gpu_spec or args.gpu, "gpu_name": name, "model": args.model,
               "batch": args.batch, "seq": args.seq, "mode": args.mode,
               "predictor": args.predictor, **summary, "memory_gb": mem, "fits": mem["fits"]}
    if args.json:
        print(json.dumps(summary, indent=1, allow_nan=False))
    else:
        _print_summary(args, summary, mem, per_gpu)
        _interval_hint(args, summary)
        power_hint(summary)
    _print_warnings(summary["warnings"], model_notes(args.model, args.seq), caught)
    return 0


def _predict_module(args) -> int:
    """``nslib predict --module FILE.py[:NAME] [--inputs SHAPES]``: one FP32 step of the
    module, an inference forward (``--mode inf``) or a training step (``--mode train``)."""
    from nslib.model.tf32 import tensor_for
    from nslib.model.module_predict import is_module_spec, parse_shapes

    step_flags = [f"--{k.replace('_', '-')}" for k in ("batch", "seq", "dp", "tp", "pp",
                                                       "microbatches", "imbalance", "link_bw")
                  if getattr(args, k, None) is not None]
    step_flags += [f"--{k.replace('_', '-')}" for k in ("fused", "kv_cache") if getattr(args, k)]
    if (args.dtype or "fp32") != "fp32":
        step_flags.append("--dtype")
    if step_flags:
        raise ValueError(f"--module forecasts one FP32 step (--mode inf or train) on one GPU, "
                         f"its shapes from --inputs or the file's get_inputs(): drop "
                         f"{', '.join(step_flags)}")
    if not is_module_spec(args.module):
        raise ValueError(f"--module takes FILE.py (a file with Model, get_inputs() and "
                         f"get_init_inputs()) or FILE.py:NAME (a module class or factory), not "
                         f"{args.module!r}; a model config goes to --model")
    gpu = Path(args.gpu_spec) if args.gpu_spec else args.gpu
    name = cli_gpu(gpu, GPU_FILE).name
    inputs = parse_shapes(args.inputs) if args.inputs is not None else None
    launch = _options(args).get("launch_us", LAUNCH_US)   # the step flags are gone by now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame, summary = predict_model(gpu, args.module, Step(1, 1, args.mode),
                                       predictor=args.predictor, inputs=inputs,
                                       launch_us=launch, settings=Settings(quick=args.quick),
                                       tensor_predictor=args.tensor_predictor
                                       or tensor_for(args.predictor), tf32=args.tf32)
        mem = trace_memory(gpu, frame, args.mode, args.optimizer or "adam").to_dict()
    _write_kernels(args, frame)
    summary = {"gpu": args.gpu_spec or args.gpu, "gpu_name": name, "module": args.module,
               "inputs": args.inputs, "mode": args.mode, "predictor": args.predictor,
               **summary, "memory_gb": mem, "fits": mem["fits"]}
    if args.json:
        print(json.dumps(summary, indent=1, allow_nan=False))
    else:
        shapes = f" on inputs {args.inputs}" if args.inputs else ""
        step = "inference forward" if args.mode == "inf" else \
            "training step (forward + backward, no optimizer step)"
        print(f"{args.module}{shapes}, {step} on {name} ({args.predictor}): "
              f"{fmt_fixed(summary['e2e_ms'])} ms{_band(summary)}, "
              f"{fmt_count(summary['n_kernels'])} kernels{_tf32_note(summary)}")
        _print_classes(summary["per_class_ms"])
        print(_memory_line(mem, False))
        _interval_hint(args, summary)
        power_hint(summary)
    # the unpriced calls are the module's own note, not a datasheet range
    _print_warnings(summary["warnings"], summary.get("module_notes", []), caught)
    return 0


# the columns of --kernels, those of them a step's frame has
KERNEL_COLUMNS = ("kid", "phase", "aten", "module", "layer", "stage", "cls", "op", "B", "M",
                  "N", "K", "H", "flops", "bytes", "tf32", "pred_ms")


def _write_kernels(args, frame) -> None:
    """``--kernels FILE.csv``: the priced kernels of the step (:data:`KERNEL_COLUMNS`; ms,
    FLOP, bytes), written atomically."""
    if not getattr(args, "kernels", None):
        return
    from nslib.data.paths import atomic_write_text

    path = Path(args.kernels)
    if path.is_dir():
        raise ValueError(f"--kernels takes a file to write (e.g. {path / 'kernels.csv'}), "
                         f"not the folder {path}")
    cols = [c for c in KERNEL_COLUMNS if c in frame.columns]
    atomic_write_text(path, frame[cols].to_csv(index=False))


def _interval_hint(args, summary: dict) -> None:
    """On stderr, the note that ``nslib calibrate`` gives the forecast its interval, where
    it has none for want of a calibration (:func:`nslib.cli.intervals.calibrate_hint`), or
    that the forecast lies outside its interval, where it does."""
    if "interval_ms" in summary:
        lo, hi = summary["interval_ms"]
        if not lo <= summary["e2e_ms"] <= hi:   # a predictor that errs one way (the roofline)
            side = "below" if summary["e2e_ms"] < lo else "above"
            print(f"note: the forecast lies {side} its interval: on the GPUs it was "
                  f"calibrated on (each held out in turn), {args.predictor} errs {side} "
                  "the measured times, and the interval is where they fell", file=sys.stderr)
        return
    dtype = getattr(args, "dtype", "fp32") or "fp32"
    tensor = None if dtype == "fp32" else (args.tensor_predictor or "nslib")
    hint = calibrate_hint(args.predictor, args.quick, tensor)
    if hint:
        print(hint, file=sys.stderr)


def _tf32_note(summary: dict) -> str:
    """`` (N convolution kernels in TF32 on tensor cores)`` where a module step has them."""
    n = summary.get("tf32_kernels", 0)
    return f" ({n} convolution kernel{'s' * (n != 1)} in TF32 on tensor cores)" if n else ""


def _print_warnings(notes: list[str], model: list[str], caught) -> None:
    """Every warning once, on stderr, as ``warning: ...`` (no library file and line): the
    summary's notes (the model's, then the datasheet ranges', which say that the forecast
    extrapolates), then any other warning the run issued."""
    others = [str(w.message) for w in caught
              if not issubclass(w.category, (DatasheetRangeWarning, ModelNoteWarning))]
    lines = [n if n in model else f"{n} (outside the training GPUs: the forecast extrapolates)"
             for n in notes]
    print_warnings([*lines, *others])


def _options(args) -> dict:
    """The keyword arguments of :func:`predict_model` that the command line was given."""
    _check_flags(args)
    extra = {}
    if getattr(args, "fused", False):
        extra["fused"] = True
    for k in ("dp", "tp", "pp", "microbatches"):
        if getattr(args, k, None) is not None:
            extra[k] = getattr(args, k)
    if getattr(args, "link_bw", None) is not None:
        if not any(extra.get(k, 1) > 1 for k in ("dp", "tp", "pp")):
            raise ValueError("--link-bw applies to a multi-GPU step: add --dp N, --tp N or "
                             "--pp N")
        extra["link"] = args.link_bw
    if getattr(args, "imbalance", None) is not None:
        extra["imbalance"] = args.imbalance
    dtype = getattr(args, "dtype", "fp32") or "fp32"
    if dtype != "fp32":
        extra["dtype"] = dtype
        extra["tensor_predictor"] = getattr(args, "tensor_predictor", None) or "nslib"
    if getattr(args, "plain_sum", False):
        extra["launch_us"] = None
    elif getattr(args, "launch_us", None) is not None:
        extra["launch_us"] = args.launch_us
    return extra


def _check_flags(args) -> None:
    """ValueError for flags that do not apply to the step asked for (they would be ignored)."""
    get = lambda k: getattr(args, k, None)  # noqa: E731 - flags absent from other commands
    rules = [
        (get("tensor_predictor") is not None and (get("dtype") or "fp32") == "fp32"
         and not (get("module") and get("tf32")),
         "--tensor-predictor prices the 16-bit tensor-core kernels (and a module's TF32 "
         "convolutions): add --dtype bf16 (or fp16), or --tf32 with --module, or drop it"),
        (get("optimizer") is not None and get("mode") != "train",
         "--optimizer counts optimizer states in the training memory: add --mode train, or "
         "drop it"),
        (get("kv_cache") and get("mode") == "train",
         "--kv-cache keeps the keys and values of generation, an inference step: drop it or "
         "use --mode inf"),
        (get("plain_sum") and get("launch_us") is not None,
         "--plain-sum sums the kernels as measured, with no launch gap: give one of "
         "--plain-sum and --launch-us"),
        (get("microbatches") is not None and get("pp") is None,
         "--microbatches splits the batch of a pipeline: add --pp N, or drop it"),
    ]
    for bad, message in rules:
        if bad:
            raise ValueError(message)


def _print_classes(per_class_ms: dict) -> None:
    """One line per kernel class, the largest first (ms)."""
    for k, v in sorted(per_class_ms.items(), key=lambda kv: -kv[1]):
        print(f"  {k:12s} {fmt_fixed(v):>12s} ms")


def _band(summary: dict) -> str:
    """`` (80%: lo-hi)`` when the summary carries an interval, else ""."""
    band = summary.get("interval_ms")
    return (f" ({100 * summary['interval_coverage']:.0f}%: {fmt_fixed(band[0])}-"
            f"{fmt_fixed(band[1])})" if band else "")


def _print_summary(args, summary: dict, mem: dict, per_gpu: bool) -> None:
    dtype = getattr(args, "dtype", "fp32") or "fp32"
    what = (args.predictor if dtype == "fp32" else
            f"{dtype}: {args.tensor_predictor or 'nslib'} tensor cores, {args.predictor} vector")
    band = _band(summary)
    print(f"{args.model} {args.mode} batch {args.batch} seq {args.seq} on "
          f"{summary['gpu_name']} ({what}): {fmt_fixed(summary['e2e_ms'])} ms{band} "
          f"(forward {fmt_fixed(summary['fw_ms'])}, backward {fmt_fixed(summary['bw_ms'])})")
    _print_classes(summary["per_class_ms"])
    total = sum(summary["per_class_ms"].values())
    par = summary.get("parallel")
    if abs(total - summary["e2e_ms"]) > 0.005 * summary["e2e_ms"]:
        # a schedule, not a sum: the all-reduce overlaps the backward, a pipeline repeats
        # its stages over the micro-batches and idles in the bubble
        what = (f"one micro-batch through every stage (the step runs {par['microbatches']})"
                if par and par["kind"] == "pp" else "every kernel of the step once")
        print(f"  (the classes add up to {fmt_fixed(total)} ms: {what}, communication in full; "
              "the step's time is its schedule's, below)")
    if par:
        link = par["link"]
        print(f"  {par['kind']}{par['degree']} on {par['degree']} GPUs, global batch "
              f"{par['global_batch']}: communication {summary['comm_ms']:.2f} ms over "
              f"{link['bandwidth_gbps']:g} GB/s x {link['utilisation']:g}"
              f"{' / 2' if link['halved'] else ''} = {link['effective_gbps']:g} GB/s "
              f"({link['source']})")
        if par["kind"] == "dp":
            print(f"  gradient all-reduce finishes {par['finish_ms']:.2f} ms into the "
                  f"backward; exposed {par['exposed_comm_ms']:.2f} ms")
        elif par["kind"] == "pp" and "microbatches" in par:
            print(f"  pipeline: {par['microbatches']} micro-batch"
                  f"{'es' * (par['microbatches'] != 1)} through {par['degree']} stages, "
                  "the slowest stage setting the pace, and the fill and drain bubble")
    elif summary.get("fused"):
        print(f"  fused: {fmt_count(summary['n_kernels'])} kernels "
              f"(from {fmt_count(summary['n_kernels_unfused'])})")
    print(_memory_line(mem, per_gpu))


def _memory(args, gpu, step: Step, par: Parallel, frame) -> tuple[dict, bool]:
    """(:func:`nslib.model.memory.memory_of` of the run as a dict, whether it is per GPU of
    several)."""
    # the sharded trace predict_model made: not sharded twice
    sharded = frame if par.tp > 1 else None
    mem = memory_of(gpu, args.model, step, parallel=par, optimizer=args.optimizer or "adam",
                    kv_cache=args.kv_cache, sharded=sharded).to_dict()
    return mem, par.dp > 1 or par.tp > 1 or par.pp > 1


def _memory_line(mem: dict, per_gpu: bool) -> str:
    """'memory: fits (X GB of Y)' or 'memory: does not fit (needs X GB of Y)', with the parts."""
    parts = ", ".join(f"{k} {_fmt_gib(mem[k])}" for k in ("weights", "grads", "optimizer",
                                                          "activations", "kv_cache",
                                                          "framework", "comm") if mem[k] > 0)
    verdict = (f"fits ({_fmt_gib(mem['total'])} of {mem['capacity']:g} GiB)" if mem["fits"]
               else f"does not fit (needs {_fmt_gib(mem['total'])} of "
                    f"{mem['capacity']:g} GiB)")
    where = " per GPU" if per_gpu else ""
    phase = PHASES.get(mem["peak_phase"], mem["peak_phase"])
    at = mem["peak_module"] or f"kernel #{mem['peak_kid']} of the trace"
    return f"  memory{where}: {verdict}; peak during {phase} at {at}: {parts} GiB"


# the memory model's phases (nslib.model.memory.step) as people say them
PHASES = {"fw": "the forward pass", "bw": "the backward pass", "step": "the optimizer step"}


def _fmt_gib(v: float) -> str:
    """GiB (2**30 bytes) for people: two decimals, scientific beyond a million."""
    return f"{v:,.2f}" if abs(v) < 1e6 else f"{v:.3e}"


def _add_module_options(s) -> None:
    """``--module``, ``--inputs`` and ``--tf32``: a PyTorch module instead of a config."""
    s.add_argument("--module", metavar="FILE.py[:NAME]",
                   help="any PyTorch module instead of --model: a file with Model, "
                        "get_inputs() and get_init_inputs() (KernelBench's convention), or "
                        "FILE.py:NAME, a module class or factory, with --inputs; one FP32 "
                        "step is traced on the meta device and priced: an inference forward "
                        "(--mode inf) or a training step, forward + backward without the "
                        "optimizer step (--mode train; --optimizer counts its memory)")
    s.add_argument("--inputs", metavar="SHAPES",
                   help="the module's input shapes, e.g. 8x3x224x224 (several: comma "
                        "separated; FP32 unless a type follows, 8x128:int64 for token ids; "
                        "default: the file's get_inputs())")
    s.add_argument("--tf32", action="store_true", help="with --module: convolutions may run "
                   "in TF32 on tensor cores where faster (needs the datasheet's Bf16FLOPs)")


def add_predict_parser(sub) -> None:
    s = sub.add_parser("predict", help="predict a model's inference or training step on a GPU",
                       formatter_class=DefaultsFormatter)
    s.add_argument("--gpu", help="GPU name or alias (see `nslib gpus`)")
    s.add_argument("--gpu-spec", help="a GPU datasheet JSON in NeuSight's format")
    s.add_argument("--model", help="config name in the data, a JSON path, or a HuggingFace id "
                   "with a config in the project (meta-llama/Llama-3.1-8B-Instruct, "
                   "Qwen/Qwen3-32B), as `nslib serve --model` takes")
    _add_module_options(s)
    s.add_argument("--batch", type=arg_int(), help="batch size (with --dp: the global batch)")
    s.add_argument("--seq", type=arg_int(), help="sequence length, tokens")
    s.add_argument("--mode", choices=["inf", "train"], default="inf",
                   help="inf: an inference forward; train: a training step")
    s.add_argument("--predictor", default="nslib",
                   help="kernel predictor (in 16 bits: of the vector and memory kernels)")
    s.add_argument("--dtype", choices=list(DTYPES), default="fp32",
                   help="number format of the model (default: fp32, the paper's setting); "
                        "bf16/fp16 trace it with fused attention, priced by the 16-bit GEMM "
                        "and attention predictors (needs the datasheet's Bf16FLOPs)")
    s.add_argument("--tensor-predictor", metavar="NAME",
                   help="16-bit GEMM and attention predictor (default: nslib; or a baseline: "
                        "roofline, roofline_eff, xgboost, mlp; also --module --tf32's)")
    s.add_argument("--quick", action="store_true", help="use the quick-trained predictor")
    s.add_argument("--json", action="store_true")
    s.add_argument("--kernels", metavar="FILE.csv",
                   help="also write the priced kernels to this CSV, one row each: kid, phase "
                        "(fw/bw), aten (the operator), module, layer, stage (pipeline), cls "
                        "(kernel class), op, B M N K H (shape), flops, bytes, tf32, pred_ms")
    s.add_argument("--launch-us", type=arg_float(minimum=0), metavar="US",
                   help="gap between back-to-back kernels in the model, microseconds "
                        "(default: 3; see nslib.model.stream)")
    s.add_argument("--plain-sum", action="store_true",
                   help="sum the kernels' microbenchmark latencies as they are (each with "
                        "its dispatch floor), as the original tool does")
    s.add_argument("--imbalance", type=float, metavar="F",
                   help="mixture-of-experts routing: the busiest expert gets F times its even "
                        "share of tokens (default: 1, balanced)")
    s.add_argument("--optimizer", choices=["adam", "adamw", "sgd", "sgd_plain", "none"],
                   help="optimizer states counted in the training memory (default: adam; sgd "
                        "keeps a momentum buffer, sgd_plain none)")
    s.add_argument("--kv-cache", action="store_true",
                   help="inference keeps every layer's keys and values (generation) in memory")
    s.add_argument("--fused", action="store_true",
                   help="fuse chains of elementwise/memory kernels (nslib.model.fusion)")
    par = s.add_mutually_exclusive_group()
    par.add_argument("--dp", type=arg_int(), metavar="N",
                     help="data parallel on N GPUs (--batch is the global batch)")
    par.add_argument("--tp", type=arg_int(), metavar="N",
                     help="tensor parallel (Megatron) on N GPUs")
    par.add_argument("--pp", type=arg_int(), metavar="N", help="pipeline parallel, N stages")
    s.add_argument("--microbatches", type=arg_int(), metavar="M",
                   help="pipeline micro-batches (with --pp; default: 1)")
    s.add_argument("--link-bw", type=arg_float(positive=True), metavar="GBPS",
                   help="GPU link bandwidth in GB/s (datasheet, both directions; default: "
                        f"the datasheet's Link_Bw), used x "
                        f"{LINK_UTILISATION:g} / 2")
    s.set_defaults(func=_predict)
