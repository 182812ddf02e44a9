"""The ``bellis`` command (``bellis._cli._main:main``, also ``python -m bellis``).

Owns:
  ``_main``   the parser and the subcommands: ``demo``, ``worker``, ``status``, ``report``,
              ``as-daisy``
  ``_demo``   ``bellis demo``: a real two-task pipeline on a synthetic zarr volume
  ``_watch``  ``bellis status PATH --watch``: the status redrawn while a run goes
  ``_errors`` ``bellis status PATH --failed`` and ``--block 3,7,2``: the error records

May import anything, the public face included (the demo is a user of ``import bellis``).
Must never be imported by anything but the entry points (``__main__``, ``worker``).
"""
