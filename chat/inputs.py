"""What a request or a socket frame may carry: checked once, where it comes in.

JSON parses into values the database may still refuse: a NUL character (PostgreSQL
stores none, in text or in jsonb), a lone surrogate (``"\\ud800"``: not encodable as
UTF-8), a number past what a column holds, or nesting deep enough to exhaust a
recursive walk later. :func:`parse_object` refuses them all with a message for the
caller, so bad input is a 400 (or a notice on the socket) and never reaches a write.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32
MAX_INT = 2**63 - 1


class BadInput(ValueError):
    """Input refused, with a message for whoever sent it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None."""
    if "\x00" in value:
        return "contains a NUL character, which cannot be stored"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an invalid character (a lone surrogate)"
    return None


def check_text(value: str, what: str = "The text") -> str:
    problem = text_problem(value)
    if problem:
        raise BadInput(f"{what} {problem}.")
    return value


def check_value(value: Any, *, max_depth: int = MAX_DEPTH, finite: bool = True) -> None:
    """Walk parsed JSON (iteratively) and refuse what cannot be stored."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise BadInput(f"The JSON is nested too deeply (more than {max_depth} levels).")
        if isinstance(item, str):
            check_text(item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_INT:
                raise BadInput("A number in the JSON is too large.")
        elif isinstance(item, float):
            if finite and not math.isfinite(item):
                raise BadInput("A number in the JSON is not finite (NaN or too large).")
        elif isinstance(item, dict):
            for key, child in item.items():
                check_text(key, "A key")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def parse_object(raw: str | bytes, *, finite: bool = True) -> dict[str, Any]:
    """A JSON object from ``raw``, checked; :class:`BadInput` otherwise.

    ``finite=False`` lets NaN and infinities through (the socket reads a resync cursor
    of ``1e999`` as "from the start").
    """
    try:
        data = json.loads(raw)
    except RecursionError:
        raise BadInput(f"The JSON is nested too deeply (more than {MAX_DEPTH} levels).") from None
    except ValueError:  # UnicodeDecodeError included; also ints past Python's digit limit
        raise BadInput("The body must be JSON.") from None
    if not isinstance(data, dict):
        raise BadInput("The body must be a JSON object.")
    check_value(data, finite=finite)
    return data
