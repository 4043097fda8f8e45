"""Validation of user-given numbers: integers that really are integers, floats that are finite.

Each check names the field in its error, so a bad CLI option, API argument or datasheet value
says which one to fix. The ``arg_*`` helpers are argparse ``type=`` callables built on them.
"""
from __future__ import annotations

import argparse
import math
import numbers


# The largest count a command line takes (a batch, sequence, concurrency, degree): the
# largest integer a float64 holds exactly, as the traces keep their sizes
MAX_INT = 2**53


def check_int(name: str, value, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``value`` as an int (at most ``maximum`` when given), or ValueError naming ``name``.

    Booleans and non-whole numbers (2.5, NaN) are rejected: silently rounding a batch of 2.5
    to 2 gives an answer to a question nobody asked. Whole floats (``132.0``, as JSON writers
    sometimes emit) are accepted.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number (an integer), got {value!r}")
    if not float(value).is_integer():  # NaN and inf are not integers either
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if minimum == 1 and value < 1:
        raise ValueError(f"{name} must be positive (an integer >= 1), got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {value:,}")
    return value


def check_float(name: str, value, minimum: float | None = None, positive: bool = False) -> float:
    """``value`` as a finite float, or ValueError naming ``name``.

    ``minimum``: smallest allowed value (inclusive); ``positive``: must be > 0.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value:g}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value:g}")
    return value


def _arg(convert, check, what: str, **kw):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        try:
            return check("the value", value, **kw)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("the value ")) from None
    parse.__name__ = convert.__name__  # argparse names the type in its messages
    return parse


def arg_int(minimum: int = 1):
    """argparse type: an integer >= ``minimum`` and at most :data:`MAX_INT`."""
    return _arg(int, check_int, "an integer", minimum=minimum, maximum=MAX_INT)


def arg_float(minimum: float | None = None, positive: bool = False):
    """argparse type: a finite float (``nan``, ``inf`` rejected), >= minimum or > 0."""
    return _arg(float, check_float, "a number", minimum=minimum, positive=positive)
