"""Paging and times shared by the REST routes of every service: keyset pages by name (pass a page's
`metadata.continue` as `after` for the next; the last page has none), RFC 3339 times, and the `since` parameter."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Final, TypeVar

from fastapi import HTTPException, Query

_Row = TypeVar("_Row")

DEFAULT_PAGE = 500
Limit = Annotated[
    int | None, Query(ge=1, description="page size: default 500, at most the server's page_limit_max (1000)")
]
After = Annotated[str | None, Query(description="continue after this node name (a page's metadata.continue)")]


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def split_page(rows: Sequence[_Row], *, limit: int, name: Callable[[_Row], str]) -> tuple[list[_Row], str | None]:
    """(this page, continue token) from up to limit+1 rows: the extra row only says another page exists."""
    if len(rows) > limit:
        return list(rows[:limit]), name(rows[limit - 1])
    return list(rows), None


def page_size(limit: int | None, maximum: int) -> int:
    """The requested page size, or the default capped by the server's maximum."""
    if limit is None:
        return min(DEFAULT_PAGE, maximum)
    if limit > maximum:
        raise HTTPException(422, f"invalid query parameter 'limit' (got {limit}): must be at most {maximum}")
    return limit


LATEST_SINCE: Final = 253402300799.0
"""9999-12-31T23:59:59Z, the last second a datetime can hold: `since` is a time between the epoch and this."""


def parse_since(text: str | None) -> float | None:
    """`since` as unix seconds: a finite number of seconds from 0 to LATEST_SINCE, or an RFC 3339 time; ValueError
    for anything else."""
    if text is None or not text.strip():
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is None:
        try:
            parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"invalid since {text!r}: expected unix seconds or an RFC 3339 time such as 2026-11-24T03:00:00Z"
            ) from None
        if parsed.tzinfo is None:
            raise ValueError(f"invalid since {text!r}: give a time zone (e.g. Z)")
        try:
            seconds = parsed.timestamp()
        except (OverflowError, ValueError):
            seconds = math.inf
    if not 0 <= seconds <= LATEST_SINCE:  # NaN fails both comparisons
        raise ValueError(
            f"invalid since {text!r}: expected unix seconds from 0 to {LATEST_SINCE:.0f} (9999-12-31T23:59:59Z)"
        )
    return seconds
