"""daisy 1.x import path: ``from bellis.block import Block, BlockStatus``."""

from ._block import Block as Block, BlockStatus as BlockStatus
from ._names import HOMES as _HOMES, load_public_name as _load_public_name

__all__ = ["Block", "BlockStatus"]

# the same objects as ``bellis.Block``: loaded as ``bellis`` loads them, so that they name
# their public home (``bellis.Block``) whichever way a script reached them first
for _name in __all__:
    _load_public_name(_name, _HOMES, globals())
del _name
