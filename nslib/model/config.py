"""Model configs and the models built from them on the ``meta`` device, for the tracer.

A config is a HuggingFace config dict (:func:`load_model_config` reads one by name or path);
:func:`build_model` turns it into a transformers model on ``meta`` (no weights, no memory):
the class the measurements ran (:data:`MEASURED_ARCHITECTURE`), else the pre-training model,
the speech or causal LM and so on (see :func:`nslib.model.trace.trace`).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from nslib.data.paths import data_root
from nslib.kernels.dtypes import TORCH_NAMES

__all__ = ["load_model_config", "hf_config", "build_model", "max_seq", "MEASURED_ARCHITECTURE",
           "MAX_POSITION_KEYS", "position_limits", "check_seq", "is_causal_lm"]

CONFIG_DIR = Path("data") / "DLmodel_configs"


def load_model_config(name_or_path: str | os.PathLike | dict, data=None) -> dict:
    """A model config as a dict.

    ``name_or_path`` is a dict (returned as a copy), a path to a JSON file, or a name like
    ``gpt3_27`` resolved to ``<data_root>/data/DLmodel_configs/gpt3_27.json`` (see
    :func:`nslib.data.paths.data_root`), or a HuggingFace id the project keeps a config for
    (:func:`nslib.data.serving_sample.model_configs`, e.g.
    ``meta-llama/Llama-3.1-8B-Instruct``): the one resolver of model names, for every command.
    Raises FileNotFoundError for a missing file and ValueError for malformed JSON, both naming
    the file and the fix.
    """
    if isinstance(name_or_path, dict):
        return copy.deepcopy(name_or_path)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model config must be a name, a path to a JSON file or a dict, "
                        f"not {type(name_or_path).__name__}")
    path = _config_path(os.fspath(name_or_path), data)
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {path} is not valid JSON ({e.msg} at line {e.lineno}, "
                         f"column {e.colno}): fix the file") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model config {path} must hold a JSON object (a HuggingFace config), "
                         f"not a {type(cfg).__name__}: fix the file")
    return cfg


def _config_path(raw: str, data=None) -> Path:
    """The config file ``raw`` names (see :func:`load_model_config`); FileNotFoundError naming
    what is accepted when none."""
    as_path = Path(raw).expanduser()
    if as_path.suffix == ".json" or os.sep in raw or "/" in raw or as_path.is_file():
        if as_path.is_file():
            return as_path
        kept = _kept_config(raw)
        if kept is None:
            raise FileNotFoundError(f"model config file {as_path} does not exist: pass an "
                                    f"existing HuggingFace config JSON, a config name, or a "
                                    f"HuggingFace id the project keeps a config for "
                                    f"({', '.join(_kept_ids())})")
        return kept
    folder = data_root(data) / CONFIG_DIR
    path = folder / f"{raw}.json"
    if path.is_file():
        return path
    kept = _kept_config(raw)
    if kept is None:
        known = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        raise FileNotFoundError(f"no model config named {raw!r}: {path} does not exist. "
                                f"Known names: {known}; or pass a path to a config JSON")
    return kept


def _kept_ids() -> list[str]:
    """The HuggingFace ids the project keeps a config for."""
    from nslib.data.serving_sample import model_configs
    return list(model_configs())


def _kept_config(raw: str) -> Path | None:
    """The project's config file of HuggingFace id ``raw``, or None."""
    from nslib.data.serving_sample import model_configs
    return model_configs().get(raw)


def hf_config(config: dict):
    """The transformers config object of a config dict (no KV cache); ValueError naming the
    fix when transformers does not know or rejects it."""
    from transformers import AutoConfig

    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise ValueError("model config has no 'model_type': add the HuggingFace model type "
                         "(e.g. \"gpt2\", \"bert\", \"opt\", \"switch_transformers\")")
    for k in ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        cfg.pop(k, None)
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"unknown model_type {model_type!r}: transformers has no such model "
                         f"(known types are the keys of transformers.CONFIG_MAPPING, e.g. "
                         f"'gpt2', 'bert', 'opt', 'switch_transformers'); fix the config")
    try:
        hf = AutoConfig.for_model(model_type, **cfg)
    except Exception as e:  # noqa: BLE001 - field validation errors of many kinds
        msg = str(e).strip().replace("\n", " ")
        raise ValueError(f"transformers rejects the {model_type!r} config ({msg}): fix the "
                         f"config") from None
    hf.use_cache = False
    return hf


# The HuggingFace model types whose trace is checked (tests/test_families.py and the paper's
# models): any other type is traced too, with a warning that its kernels are unchecked.
SUPPORTED_MODEL_TYPES = ("bert", "deepseek_v2", "deepseek_v3", "gemma", "gpt2", "llama",
                         "mistral", "mixtral", "opt", "phi3", "qwen2", "qwen2_moe", "qwen3",
                         "switch_transformers", "t5", "vit", "whisper")


# The models the NeuSight measurements ran, read from the node names of the original opgraphs
# (results/opgraph): BERT inference is a sequence classifier (pooler + 2-way classifier),
# BERT training the pre-training model (pooler + MLM + NSP heads).
MEASURED_ARCHITECTURE = {
    ("bert", "inf"): "BertForSequenceClassification",
    ("bert", "train"): "BertForPreTraining",
}


def _model_classes(hf, architecture: str | None):
    """The transformers classes to try building ``hf`` with, in order."""
    import transformers
    from transformers import (AutoModel, AutoModelForCausalLM, AutoModelForImageClassification,
                              AutoModelForMaskedLM, AutoModelForPreTraining, AutoModelForSeq2SeqLM,
                              AutoModelForSpeechSeq2Seq)

    if architecture:
        cls = getattr(transformers, architecture, None)
        if cls is None:
            raise ValueError(f"transformers has no model class {architecture!r}: pass a class "
                             f"name like 'GPT2LMHeadModel', or architecture=None")
        return [cls]
    # The original NeuSight graphs are those of the pre-training models (BERT: pooler + MLM +
    # NSP heads, i.e. BertForPreTraining; GPT-2: GPT2LMHeadModel; Switch: ForConditionalGeneration)
    # and of the causal LM where there is no pre-training class (OPT: OPTForCausalLM).
    # Speech models come before the causal LM (Whisper's causal LM is its decoder alone) and
    # vision models get their classifier rather than the bare encoder.
    return [AutoModelForPreTraining, AutoModelForSpeechSeq2Seq, AutoModelForCausalLM,
            AutoModelForSeq2SeqLM, AutoModelForMaskedLM, AutoModelForImageClassification,
            AutoModel]


def build_model(config: dict, architecture: str | None, dtype: str = "fp32"):
    """(HF config, model on meta): FP32 with eager attention, or a 16-bit ``dtype`` with
    PyTorch's scaled-dot-product attention (FlashAttention on a GPU)."""
    import torch

    torch_dtype = getattr(torch, TORCH_NAMES[dtype])
    attn = "eager" if dtype == "fp32" else "sdpa"
    hf = hf_config(config)
    model_type = hf.model_type
    errors = []
    for auto in _model_classes(hf, architecture):
        try:
            with torch.device("meta"):
                if hasattr(auto, "from_config"):
                    model = auto.from_config(hf, attn_implementation=attn, dtype=torch_dtype)
                else:  # a concrete class
                    model = auto._from_config(hf, attn_implementation=attn, dtype=torch_dtype)
            break
        except ValueError as e:
            msg = str(e)
            if "Unrecognized configuration class" in msg:
                errors.append(msg.splitlines()[0])
                continue
            if attn == "sdpa" and "attention implementation" in msg:
                # not a config problem: transformers has no fused-attention path for it
                raise ValueError(f"{model_type!r} has no scaled-dot-product attention in "
                                 f"transformers, which a {dtype} trace needs (its attention "
                                 f"is priced as one fused kernel): predict it with --dtype "
                                 f"fp32 (eager attention)") from None
            raise ValueError(f"transformers cannot build a {model_type!r} model from this config: "
                             f"{msg.splitlines()[0] if msg else e!r}. Fix the config (sizes must "
                             f"be consistent, e.g. hidden size divisible by the head count)") from None
        except Exception as e:  # noqa: BLE001 - any build failure is a config problem to the user
            raise ValueError(f"transformers cannot build a {model_type!r} model from this config: "
                             f"{type(e).__name__}: {e}. Fix the config (sizes must be consistent, "
                             f"e.g. hidden size divisible by the head count)") from None
    else:
        raise ValueError(f"no model class for model_type {model_type!r} ({'; '.join(errors)}): "
                         f"pass architecture= with a transformers class name")
    if any(p.dtype != torch_dtype for p in model.parameters()):
        model = model.to(torch_dtype)
    return hf, model


# config fields that cap the sequence length (tokens)
MAX_POSITION_KEYS = ("n_positions", "max_position_embeddings", "max_target_positions")


def position_limits(config) -> dict[str, int]:
    """``{field: tokens}``: the fields of :data:`MAX_POSITION_KEYS` that cap a model's
    sequence length, from a transformers config object (its defaults included) or a config
    dict (what it sets); positive integers only."""
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    return {k: v for k in MAX_POSITION_KEYS
            if isinstance(v := get(k), int) and not isinstance(v, bool) and v > 0}


def check_seq(limits: dict, seq: int, what: str = "seq",
              fix: str = "use a shorter sequence") -> None:
    """ValueError when ``seq`` tokens exceed one of ``limits`` (:func:`position_limits`),
    naming the field and the fix: the one context-length check (``what`` names the length,
    ``fix`` how to shorten it)."""
    for attr, limit in limits.items():
        if limit < seq:
            raise ValueError(f"{what} {seq} exceeds the model's {attr} = {limit}: {fix} or "
                             f"raise {attr} in the config")


def is_causal_lm(architecture: str) -> bool:
    """Whether a transformers model class (by name) is a causal language model: a decoder
    that generates its output token by token (``LlamaForCausalLM``, ``GPT2LMHeadModel``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    names = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    return any(architecture == n or (not isinstance(n, str) and architecture in n)
               for n in names)


def max_seq(model, data=None) -> int | None:
    """The longest sequence a model's config allows (tokens), or None when it sets no limit."""
    limits = position_limits(load_model_config(model, data))
    return min(limits.values()) if limits else None
