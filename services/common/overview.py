"""The dashboard's cluster overview, joined from two services without either knowing the other: the nodemetric
component provides the rows' first columns (liveness and usage, one page of nodes by name), the noderesource component
the batch/mid columns of the same name range. services.api.dashboard asks both and merges them per node."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class NodePage:
    """One page of the overview's node columns, by node name."""

    rows: Sequence[dict[str, Any]]
    """Each row's columns, with its node's name under "name"."""
    through: str | None
    """The page's last node name (None: an empty page): the next page starts after it."""
    more: bool
    """Another page follows."""
    now: float
    stale_after_seconds: float


@dataclass(frozen=True)
class OverviewNodes:
    """A page of nodes with their liveness and usage columns (the nodemetric component provides it)."""

    page: Callable[[str | None, int], Awaitable[NodePage]]
    """(after, limit) → the page."""


@dataclass(frozen=True)
class OverviewResources:
    """The batch/mid columns of each node in a name range (the noderesource component provides it)."""

    columns: Callable[[str | None, str], Awaitable[Mapping[str, dict[str, Any]]]]
    """(after, through) → node name → its columns."""
