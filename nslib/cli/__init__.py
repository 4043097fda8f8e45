"""The ``nslib`` command line: :mod:`nslib.cli.commands` (every sub-command but one) and
:mod:`nslib.cli.predict` (``nslib predict``)."""
from nslib.cli.commands import main

__all__ = ["main"]
