"""``python -m bellis``: the same as the ``bellis`` command."""

import sys

from ._cli._main import main

sys.exit(main())
