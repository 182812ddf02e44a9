"""The worker's :class:`Context`: the string-to-string mapping that reaches a worker in
``BELLIS_CONTEXT`` (or daisy's ``DAISY_CONTEXT``), and its encoding. ``bellis.Context``;
split from ``_client`` (the worker's side of the protocol), which re-exports it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .._protocol import CONTEXT_ENV, DAISY_CONTEXT_ENV

__all__ = ["ENV_VARIABLES", "Context"]

ENV_VARIABLES = (CONTEXT_ENV, DAISY_CONTEXT_ENV)

_SPECIAL = {"%": "%25", ":": "%3A", "=": "%3D"}


def _escape(text: str) -> str:
    return "".join(_SPECIAL.get(ch, ch) for ch in text)


def _unescape(text: str) -> str:
    if "%" not in text:
        return text
    out = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "%" and i + 2 < n:
            code = text[i + 1 : i + 3].upper()
            if code == "25":
                out.append("%")
                i += 3
                continue
            if code == "3A":
                out.append(":")
                i += 3
                continue
            if code == "3D":
                out.append("=")
                i += 3
                continue
        out.append(ch)
        i += 1
    return "".join(out)


class Context:
    """A string-to-string mapping that travels to workers in ``BELLIS_CONTEXT``.

    Encoded as ``key=value`` pairs joined by ``:``; ``%``, ``:`` and ``=`` are
    percent-encoded, so any task id round-trips. Keys are emitted in sorted order, so the
    encoding is deterministic.
    """

    ENV_VARIABLE = "DAISY_CONTEXT"

    def __init__(self, **kwargs: Any) -> None:
        self._d: dict[str, str] = {str(k): str(v) for k, v in kwargs.items()}
        if "logdir" not in self._d:
            from .. import logging as blog

            base = blog.get_log_basedir()
            self._d["logdir"] = "" if base is None else str(base)

    @classmethod
    def _raw(cls, d: dict[str, str]) -> Context:
        c = cls.__new__(cls)
        c._d = d
        return c

    def __getitem__(self, key: str) -> str:
        return self._d[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._d[str(key)] = str(value)

    def __delitem__(self, key: str) -> None:
        del self._d[key]

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def keys(self) -> list[str]:
        return list(self._d.keys())

    def values(self) -> list[str]:
        return list(self._d.values())

    def items(self) -> list[tuple[str, str]]:
        return list(self._d.items())

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key, default)

    def copy(self) -> Context:
        return Context._raw(dict(self._d))

    def to_env(self) -> str:
        return ":".join(f"{_escape(k)}={_escape(v)}" for k, v in sorted(self._d.items()))

    def __repr__(self) -> str:
        return self.to_env()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self._d == other._d

    __hash__ = None  # type: ignore[assignment]

    @staticmethod
    def from_env_string(text: str) -> Context:
        d: dict[str, str] = {}
        for token in text.split(":"):
            if not token:
                continue
            if "=" not in token:
                raise ValueError(f"invalid context token: {token!r}")
            k, v = token.split("=", 1)
            d[_unescape(k)] = _unescape(v)
        return Context._raw(d)

    @staticmethod
    def from_env() -> Context:
        for name in ENV_VARIABLES:
            text = os.environ.get(name)
            if text is not None:
                return Context.from_env_string(text)
        raise KeyError("DAISY_CONTEXT not found")
