"""Prometheus metrics plumbing shared by every service: one registry per process, passed in, never global.

Services create their instruments on the registry they are given; the API renders it at
`/metrics`. Keeping the registry explicit lets tests run many services in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "CollectorRegistry", "new_registry", "render"]


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text exposition format."""
    return bytes(generate_latest(registry))
