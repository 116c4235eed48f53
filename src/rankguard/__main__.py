"""``python -m rankguard``: the same command as ``rankguard`` (see ``rankguard.cli``)."""

import sys

from .cli import main

sys.exit(main())
