"""services.api.query_keys: the keys a route declares, read from its dependant (nested dependencies included) with
which take lists, and the refusals (unknown keys named, cut to a readable length, the known ones listed; a key that
takes one value given twice)."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import Depends, HTTPException, Query
from starlette.datastructures import QueryParams

from services.api import query_keys


class Paging:
    def __init__(self, limit: int = 10, after: Annotated[str | None, Query(alias="continue")] = None) -> None:
        self.limit, self.after = limit, after


def route(
    paging: Annotated[Paging, Depends()],
    node: str,
    types: Annotated[list[str], Query(alias="type")] = [],  # noqa: B006 - FastAPI reads the default only
    ids: Annotated[tuple[int, ...] | None, Query()] = None,
) -> None:
    """A route with its own query keys, two of them lists, and a dependency's (one of them by alias)."""


def test_the_keys_of_a_route_include_its_dependencies_and_aliases_and_say_which_take_lists() -> None:
    assert query_keys.keys_of(route) == {"limit": False, "continue": False, "node": False, "type": True, "ids": True}
    assert query_keys.keys_of(lambda: None) == {}


def test_known_keys_pass_and_repeated_list_keys_too() -> None:
    query_keys.check(QueryParams("node=a&limit=1&type=x&type=y&ids=1&ids=2&continue=x"), query_keys.keys_of(route))


def test_a_repeated_key_that_takes_one_value_is_refused() -> None:
    with pytest.raises(HTTPException) as refused:
        query_keys.check(QueryParams("node=a&limit=1&limit=2&limit=3"), query_keys.keys_of(route))
    assert refused.value.status_code == 400
    assert refused.value.detail == "query parameter 'limit' is given 3 times; it takes one value"


def test_unknown_keys_are_named_once_each_in_order() -> None:
    with pytest.raises(HTTPException) as refused:
        query_keys.check(QueryParams("zeta=1&node=a&alpha=2&zeta=3"), {"node": False})
    assert refused.value.status_code == 400
    assert refused.value.detail == "unknown query parameter(s) 'zeta', 'alpha'; known: node"


def test_a_route_without_keys_says_so() -> None:
    with pytest.raises(HTTPException, match="unknown query parameter\\(s\\) ''; this route takes none"):
        query_keys.check(QueryParams("=1"), {})


def test_hostile_keys_are_cut_and_counted() -> None:
    many = "&".join(f"{'k' * 500}{i}=1" for i in range(8))
    with pytest.raises(HTTPException) as refused:
        query_keys.check(QueryParams(many), {})
    detail = str(refused.value.detail)
    assert detail.count("…") == query_keys.MAX_SHOWN_KEYS
    assert "and 3 more" in detail
    assert len(detail) < (query_keys.MAX_KEY_CHARS + 4) * query_keys.MAX_SHOWN_KEYS + 100
