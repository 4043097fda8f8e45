"""The paper's evaluation protocol where the measurements do not carry it:
``datasets/protocol.json`` (which models count as out of distribution)."""
from __future__ import annotations

import json
from functools import lru_cache

from nslib.data.paths import PROJECT_ROOT, DataNotFoundError

PROTOCOL_FILE = PROJECT_ROOT / "datasets" / "protocol.json"


@lru_cache(maxsize=1)
def _protocol() -> dict:
    try:
        return json.loads(PROTOCOL_FILE.read_text())
    except (OSError, ValueError) as e:
        raise DataNotFoundError(f"cannot read the evaluation protocol {PROTOCOL_FILE} ({e}): "
                                "restore it from the repository") from None


def ood_models() -> tuple[str, ...]:
    """Config names of the models the paper reports as out of distribution."""
    return tuple(_protocol()["ood_models"])
