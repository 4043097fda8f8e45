"""``nslib predict``: one model on one GPU, as a table or JSON."""
from __future__ import annotations

import json


def _predict(args) -> int:
    from .predict import predict_model
    gpu = args.gpu_spec or args.gpu
    if not gpu:
        raise ValueError("name a GPU with --gpu NAME (see `nslib gpus`) or --gpu-spec FILE.json")
    frame, summary = predict_model(gpu, args.model, args.batch, args.seq, args.mode,
                                   predictor=args.predictor, quick=args.quick)
    summary = {"gpu": str(gpu), "model": args.model, "batch": args.batch, "seq": args.seq,
               "mode": args.mode, "predictor": args.predictor, **summary}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{args.model} {args.mode} batch {args.batch} seq {args.seq} on {gpu} "
              f"({args.predictor}): {summary['e2e_ms']:.2f} ms "
              f"(forward {summary['fw_ms']:.2f}, backward {summary['bw_ms']:.2f})")
        for k, v in sorted(summary["per_class_ms"].items(), key=lambda kv: -kv[1]):
            print(f"  {k:12s} {v:10.2f} ms")
    return 0


def add_predict_parser(sub) -> None:
    s = sub.add_parser("predict", help="predict a model's inference or training step on a GPU")
    s.add_argument("--gpu", help="GPU name or alias (see `nslib gpus`)")
    s.add_argument("--gpu-spec", help="a GPU datasheet JSON in NeuSight's format")
    s.add_argument("--model", required=True, help="config name in the data, or a JSON path")
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("--seq", type=int, required=True)
    s.add_argument("--mode", choices=["inf", "train"], default="inf")
    s.add_argument("--predictor", default="neusight")
    s.add_argument("--quick", action="store_true", help="use the quick-trained predictor")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_predict)
