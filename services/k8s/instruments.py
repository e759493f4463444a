"""The Kubernetes write counter every writer in services.k8s shares: `koordbus_k8s_writes{object, outcome}`.

The NodeMetric/Node/Event/topology writer, the ElasticQuota and NodeSLO mirrors and both eviction paths (agents'
requests, migrations) count each write they make, or decide not to make, here — one family a dashboard sums
over, by object kind (a fixed lower-case name, never an object's own name) and outcome (created, updated,
unchanged, deleted, skipped, failed, rejected; evictions: evicted, gone, replaced, blocked, expired, failed;
bindings: bound, gone, conflict, failed, rejected).
A registry holds one such counter, however many writers share it.

`WriteSummary` is the operator's view of the same counts: each write goes to the log at DEBUG only, and once a
minute a writer says at INFO what it wrote ("k8s writer, last 60 s: 50 nodemetric updated, 12 node updated,
0 failed"), so `make up`'s banner does not scroll away under per-object lines.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter

from services.common.metrics import once_per_registry

OBJECT_ELASTICQUOTA: Final = "elasticquota"
OBJECT_NODESLO: Final = "nodeslo"
OBJECT_EVICTION: Final = "eviction"
OBJECT_BINDING: Final = "binding"


def kube_writes(registry: CollectorRegistry) -> Counter:
    """The registry's write counter, created on first use."""
    return once_per_registry(registry, "koordbus_k8s_writes", _create)


def _create(registry: CollectorRegistry) -> Counter:
    return Counter(
        "koordbus_k8s_writes",
        "Writes to Kubernetes by object kind and outcome (created, updated, unchanged, deleted, skipped, "
        "failed, rejected; evictions: evicted, gone, replaced, blocked, expired, failed; bindings: bound, gone, "
        "conflict, failed, rejected)",
        ["object", "outcome"],
        registry=registry,
    )


SUMMARY_SECONDS: Final = 60.0
FAILED_OUTCOMES: Final = frozenset({"failed", "rejected"})


class WriteSummary:
    """One writer's outcomes since its last summary; logs the summary at INFO when a write comes `every` seconds or
    more after the previous summary (a writer with nothing to write says nothing)."""

    def __init__(
        self,
        writer: str,
        logger: logging.Logger,
        *,
        every: float = SUMMARY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._writer = writer
        self._log = logger
        self._every = every
        self._clock = clock
        self._since = clock()
        self._tally: Tally[tuple[str, str]] = Tally()

    def count(self, obj: str, outcome: str) -> None:
        self._tally[(obj, outcome)] += 1
        now = self._clock()
        if now - self._since >= self._every:
            self._log.info("%s", summary_line(self._writer, now - self._since, self._tally))
            self._tally.clear()
            self._since = now


def summary_line(writer: str, seconds: float, tally: Tally[tuple[str, str]]) -> str:
    """The summary, e.g. `k8s writer, last 60 s: 50 nodemetric updated, 3 node unchanged, 0 failed`: every (object,
    outcome) counted, biggest first, and always the failures."""
    parts = [f"{n} {obj} {outcome}" for (obj, outcome), n in sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))]
    failed = sum(n for (_, outcome), n in tally.items() if outcome in FAILED_OUTCOMES)
    return f"{writer}, last {seconds:.0f} s: {', '.join(parts) or 'nothing written'}, {failed} failed"
