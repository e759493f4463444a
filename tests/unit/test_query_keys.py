"""services.api.query_keys: the keys a route declares, read from its dependant (nested dependencies included), and
the refusal's message (unknown keys named, cut to a readable length, the known ones listed)."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import Depends, HTTPException, Query
from starlette.datastructures import QueryParams

from services.api import query_keys


class Paging:
    def __init__(self, limit: int = 10, after: Annotated[str | None, Query(alias="continue")] = None) -> None:
        self.limit, self.after = limit, after


def route(paging: Annotated[Paging, Depends()], node: str, verbose: bool = False) -> None:
    """A route with its own query keys and a dependency's (one of them by alias)."""


def test_the_keys_of_a_route_include_its_dependencies_and_aliases() -> None:
    assert query_keys.keys_of(route) == {"limit", "continue", "node", "verbose"}
    assert query_keys.keys_of(lambda: None) == frozenset()


def test_known_keys_pass_and_repeated_ones_too() -> None:
    query_keys.check(QueryParams("node=a&limit=1&limit=2&continue=x"), query_keys.keys_of(route))


def test_unknown_keys_are_named_once_each_in_order() -> None:
    with pytest.raises(HTTPException) as refused:
        query_keys.check(QueryParams("zeta=1&node=a&alpha=2&zeta=3"), {"node"})
    assert refused.value.status_code == 400
    assert refused.value.detail == "unknown query parameter(s) 'zeta', 'alpha'; known: node"


def test_a_route_without_keys_says_so() -> None:
    with pytest.raises(HTTPException, match="unknown query parameter\\(s\\) ''; this route takes none"):
        query_keys.check(QueryParams("=1"), frozenset())


def test_hostile_keys_are_cut_and_counted() -> None:
    many = "&".join(f"{'k' * 500}{i}=1" for i in range(8))
    with pytest.raises(HTTPException) as refused:
        query_keys.check(QueryParams(many), frozenset())
    detail = str(refused.value.detail)
    assert detail.count("…") == query_keys.MAX_SHOWN_KEYS
    assert "and 3 more" in detail
    assert len(detail) < (query_keys.MAX_KEY_CHARS + 4) * query_keys.MAX_SHOWN_KEYS + 100
