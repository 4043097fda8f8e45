"""HuggingFace configs pasted as text into the explorer: read them, or say what is wrong."""
from __future__ import annotations

import json
import re

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?\s*```\s*$", re.S)
# Python-style dict (single quotes, True/False/None) and trailing-comma spotters for the hints
_PYTHON_DICT = re.compile(r"'[^']*'\s*:|\bTrue\b|\bFalse\b|\bNone\b")
_TRAILING_COMMA = re.compile(r",\s*[}\]]")


def _known_model_types():
    try:
        from transformers import CONFIG_MAPPING
        return CONFIG_MAPPING
    except Exception:  # noqa: BLE001 - transformers missing or broken: skip this check
        return None


def _json_error(body: str, e: json.JSONDecodeError) -> str:
    """The message for text that is not JSON, with a hint for the usual slips."""
    hint = ""
    if _PYTHON_DICT.search(body):
        hint = " It looks like a Python dict: JSON needs double quotes and true/false/null."
    elif _TRAILING_COMMA.search(body):
        hint = " JSON allows no trailing comma before } or ]."
    return (f"The pasted config is not valid JSON: {e.msg} at line {e.lineno}, "
            f"column {e.colno}.{hint}")


def _config_error(cfg) -> str | None:
    """What is wrong with a parsed config (not an object, no or unknown model_type), or None."""
    if not isinstance(cfg, dict):
        return (f"The pasted config must be a JSON object ({{...}}, a HuggingFace "
                f"config), not a {type(cfg).__name__}.")
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt.strip():
        return ("The pasted config has no 'model_type': add the HuggingFace model type, "
                "e.g. \"model_type\": \"gpt2\" (or \"bert\", \"opt\", "
                "\"switch_transformers\").")
    known = _known_model_types()
    if known is not None and mt not in known:
        return (f"Unknown model_type {mt!r}: transformers has no such model "
                f"(e.g. 'gpt2', 'bert', 'opt', 'gptj', 'switch_transformers').")
    return None


def _parse(text) -> tuple[dict | None, str | None]:
    if text is None:
        return None, "No config was pasted: paste the contents of a HuggingFace config.json."
    if not isinstance(text, str):
        return None, f"The pasted config must be text (JSON), not {type(text).__name__}."
    body = text.strip()
    m = _FENCE.match(body)
    if m:
        body = m.group(1).strip()
    if not body:
        return None, ("The pasted config is empty: paste the contents of a HuggingFace "
                      "config.json.")
    try:
        cfg = json.loads(body)
    except json.JSONDecodeError as e:
        return None, _json_error(body, e)
    err = _config_error(cfg)
    return (None, err) if err else (cfg, None)


def parse_pasted_config(text) -> tuple[dict | None, str | None]:
    """Read a HuggingFace ``config.json`` pasted as text: ``(config, None)`` or ``(None, error)``.

    Never raises. Accepts surrounding whitespace and a Markdown code fence; rejects empty text,
    invalid JSON (the message gives the line and column, and a hint for Python-style dicts),
    anything but a JSON object, and a missing or unknown ``model_type``. Whether the sizes in
    the config are consistent is only known when the model is traced (the explorer shows that
    error too).
    """
    try:
        return _parse(text)
    except Exception as e:  # noqa: BLE001 - the contract is: never raise
        return None, f"Could not read the pasted config ({type(e).__name__}: {e})."


__all__ = ["parse_pasted_config"]
