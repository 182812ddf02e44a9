"""The installed version, from package metadata."""

from __future__ import annotations

try:
    from importlib.metadata import version as _version

    __version__ = _version("bellis")
except Exception:  # not installed (a source checkout on sys.path)
    __version__ = "unknown"
