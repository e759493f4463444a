"""Query strings carry only the keys a route declares, each once unless it takes a list: anything else is a 400.

A key the API does not know is a typo or a probe (`?nod=n1` would otherwise answer every node's events, unfiltered);
a repeated key that takes one value (`?dryRun=maybe&dryRun=false`) would otherwise be read as its last value, whatever
came before. Either way the caller learns at once, with the key named. The keys a route declares are read from its
FastAPI dependant (its own Query parameters and those of its dependencies, such as services.api.events.EventQuery),
so a new parameter needs no second list. services.api.app adds `refuse_unknown` to every route of the OpenAPI
document, after authentication; the events WebSocket, which answers a refusal in a frame of its own, calls `check`
with `keys_of(EventQuery)`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Final

from fastapi import HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_dependant
from starlette.datastructures import QueryParams

MAX_SHOWN_KEYS: Final = 5
MAX_KEY_CHARS: Final = 100
"""A refusal names at most this many unknown keys, each cut to this length (a key is whatever the caller sent)."""
_LISTS: Final = (list, tuple, set, frozenset, Sequence)


def takes_many(annotation: Any) -> bool:
    """Whether a Query parameter so annotated takes repeated keys (`list[str]`, `tuple[int, ...] | None`, …): the
    same rule as FastAPI's, which reads such a parameter with `getlist` and any other one as the last value given."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return takes_many(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(takes_many(arg) for arg in typing.get_args(annotation))
    return annotation in _LISTS or origin in _LISTS


def declared(dependant: Dependant) -> dict[str, bool]:
    """The query keys `dependant` reads (its own Query parameters by their alias, and its dependencies'), each with
    whether it takes repeated values."""
    keys = {param.alias: takes_many(param.field_info.annotation) for param in dependant.query_params}
    for sub in dependant.dependencies:
        keys.update(declared(sub))
    return keys


def keys_of(call: Callable[..., Any]) -> dict[str, bool]:
    """The query keys a dependency class or function declares (for routes that read their parameters themselves)."""
    return declared(get_dependant(path="", call=call))


def _shown(key: str) -> str:
    return repr(key if len(key) <= MAX_KEY_CHARS else key[: MAX_KEY_CHARS - 1] + "…")


def check(params: QueryParams, known: Mapping[str, bool]) -> None:
    """HTTPException 400 naming the keys of `params` that are not in `known` (and the keys that are), or else a key
    given more than once that takes one value."""
    unknown = list(dict.fromkeys(key for key in params if key not in known))
    if unknown:
        named = ", ".join(_shown(key) for key in unknown[:MAX_SHOWN_KEYS])
        more = f" and {len(unknown) - MAX_SHOWN_KEYS} more" if len(unknown) > MAX_SHOWN_KEYS else ""
        takes = f"known: {', '.join(sorted(known))}" if known else "this route takes none"
        raise HTTPException(400, f"unknown query parameter(s) {named}{more}; {takes}")
    for key, many in known.items():
        if not many and (times := len(params.getlist(key))) > 1:
            raise HTTPException(400, f"query parameter {key!r} is given {times} times; it takes one value")


async def refuse_unknown(request: Request) -> None:
    """A FastAPI dependency: 400 when the query string has a key the matched route does not declare, or repeats one
    that takes a single value."""
    dependant: Dependant | None = getattr(request.scope.get("route"), "dependant", None)
    check(request.query_params, declared(dependant) if dependant is not None else {})
