"""``python -m nslib.cli``: the same as the ``nslib`` command."""
import sys

from nslib.cli.commands import main

sys.exit(main())
