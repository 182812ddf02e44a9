"""``python -m bellis.worker --function module:attr``: join a running server as a worker."""

import sys

from ._cli._main import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
