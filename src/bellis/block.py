"""daisy 1.x import path: ``from bellis.block import Block, BlockStatus``."""

from ._block import Block, BlockStatus

__all__ = ["Block", "BlockStatus"]
