"""``python -m bellis``: the same as the ``bellis`` command."""

import sys

from ._cli import main

sys.exit(main())
