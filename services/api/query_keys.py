"""Query strings carry only the keys a route declares: any other key is refused with a 400 naming it.

A key the API does not know is a typo or a probe (`?nod=n1` would otherwise answer every node's events, unfiltered);
either way the caller learns at once. The keys a route declares are read from its FastAPI dependant (its own Query
parameters and those of its dependencies, such as services.api.events.EventQuery), so a new parameter needs no
second list. services.api.app adds `refuse_unknown` to every route of the OpenAPI document, after authentication; the
events WebSocket, which answers a refusal in a frame of its own, calls `check` with `keys_of(EventQuery)`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Final

from fastapi import HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_dependant
from starlette.datastructures import QueryParams

MAX_SHOWN_KEYS: Final = 5
MAX_KEY_CHARS: Final = 100
"""A refusal names at most this many unknown keys, each cut to this length (a key is whatever the caller sent)."""


def declared(dependant: Dependant) -> frozenset[str]:
    """The query keys `dependant` reads: its own Query parameters (by their alias) and its dependencies'."""
    keys = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        keys |= declared(sub)
    return frozenset(keys)


def keys_of(call: Callable[..., Any]) -> frozenset[str]:
    """The query keys a dependency class or function declares (for routes that read their parameters themselves)."""
    return declared(get_dependant(path="", call=call))


def _shown(key: str) -> str:
    return repr(key if len(key) <= MAX_KEY_CHARS else key[: MAX_KEY_CHARS - 1] + "…")


def check(params: QueryParams, known: Collection[str]) -> None:
    """HTTPException 400 naming the keys of `params` that are not in `known`, and the keys that are."""
    unknown = list(dict.fromkeys(key for key in params if key not in known))
    if not unknown:
        return
    named = ", ".join(_shown(key) for key in unknown[:MAX_SHOWN_KEYS])
    more = f" and {len(unknown) - MAX_SHOWN_KEYS} more" if len(unknown) > MAX_SHOWN_KEYS else ""
    takes = f"known: {', '.join(sorted(known))}" if known else "this route takes none"
    raise HTTPException(400, f"unknown query parameter(s) {named}{more}; {takes}")


async def refuse_unknown(request: Request) -> None:
    """A FastAPI dependency: 400 when the query string has a key the matched route does not declare."""
    dependant: Dependant | None = getattr(request.scope.get("route"), "dependant", None)
    check(request.query_params, declared(dependant) if dependant is not None else frozenset())
