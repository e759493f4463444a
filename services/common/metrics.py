"""Prometheus metrics plumbing shared by every service: one registry per process, passed in, never global.

Services create their instruments on the registry they are given; the API renders it at
`/metrics`. Keeping the registry explicit lets tests run many services in one process.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "CollectorRegistry", "new_registry", "once_per_registry", "render"]

_T = TypeVar("_T")
# Memo, not a plugin registry: what is kept belongs to the registry it was made for and dies with it.
_PER_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = weakref.WeakKeyDictionary()
_PER_REGISTRY_LOCK = threading.Lock()


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text exposition format."""
    return bytes(generate_latest(registry))


def once_per_registry(registry: CollectorRegistry, name: str, create: Callable[[CollectorRegistry], _T]) -> _T:
    """The instrument or collector `name` of `registry`, made by `create` on first use: one per registry however
    many parts of a process share it (a metric family may be registered only once)."""
    with _PER_REGISTRY_LOCK:
        made = _PER_REGISTRY.setdefault(registry, {})
        if name not in made:
            made[name] = create(registry)
        found: _T = made[name]
        return found
