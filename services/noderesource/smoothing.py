"""Opt-in smoothing of batch and mid allocatable: beyond Koordinator, off by default (its numbers unchanged).

Users keep reporting batch allocatable that oscillates or drops steeply (Koordinator #1427, #1906, #2118), breaking
autoscalers that read it (#1969) and, in Crane, dropping below what running pods use so kubelet evicts them on a
restart (crane#890). Two independent knobs, applied to a computed decision after `prepare`:

* `max_decrease_percent_per_minute`: a value may fall by at most this share of the node's capacity per minute
  since the last write (rises apply at once). It descends step by step towards Koordinator's number.
* `floor_at_batch_requests`: batch-cpu / batch-memory never go below what the node's running and pending pods
  request of them, so reclaiming never takes away resources already handed out.

Never applied when the resources are removed (colocation disabled, NodeMetric stale): those are safety actions.
Each held value says why (`notes`), so every drop — or every drop that did not happen — is explainable.
Pure: callers pass `now` and the last write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from schemas import resources, vocab

BASE_RESOURCE = {
    vocab.BATCH_CPU: resources.CPU,
    vocab.BATCH_MEMORY: resources.MEMORY,
    vocab.MID_CPU: resources.CPU,
    vocab.MID_MEMORY: resources.MEMORY,
}
"""Each extended resource and the node capacity it is a share of."""


class SmoothingPolicy(msgspec.Struct, frozen=True, kw_only=True):
    max_decrease_percent_per_minute: float = 0.0
    """How fast a value may fall, as a percentage of node capacity per minute; 0 = no limit (Koordinator)."""
    floor_at_batch_requests: bool = False
    """Keep batch-cpu / batch-memory at least at what running and pending pods request of them."""

    def __post_init__(self) -> None:
        rate = self.max_decrease_percent_per_minute
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"max_decrease_percent_per_minute must be a finite number >= 0, got {rate}")

    @property
    def enabled(self) -> bool:
        return self.max_decrease_percent_per_minute > 0 or self.floor_at_batch_requests


def smooth(
    computed: Mapping[str, int | None],
    *,
    capacity: Mapping[str, int],
    requested: Mapping[str, int],
    last_written: Mapping[str, int],
    last_written_at: float | None,
    now: float,
    policy: SmoothingPolicy,
) -> tuple[dict[str, int | None], dict[str, str]]:
    """The values to publish and, for each value smoothing changed, a note saying from what and why.

    `computed` is the decision after prepare (None = remove: passed through untouched); `requested` is what the
    node's running and pending pods request of the extended resources; `last_written` the values of the last write
    (made at `last_written_at`).
    """
    out = dict(computed)
    notes: dict[str, str] = {}
    for name, value in computed.items():
        if value is None or name not in BASE_RESOURCE:
            continue
        held = value
        reasons: list[str] = []
        previous = last_written.get(name)
        if policy.max_decrease_percent_per_minute > 0 and previous is not None and last_written_at is not None:
            minutes = max(now - last_written_at, 0.0) / 60
            allowed = int(capacity.get(BASE_RESOURCE[name], 0) * policy.max_decrease_percent_per_minute / 100 * minutes)
            floor = previous - allowed
            if held < floor:
                held = floor
                reasons.append(
                    f"a fall of at most {policy.max_decrease_percent_per_minute:g}% of capacity per minute: "
                    f"{previous} written {minutes:.1f} min ago, so at least {floor}"
                )
        in_use = requested.get(name, 0)
        if policy.floor_at_batch_requests and name in (vocab.BATCH_CPU, vocab.BATCH_MEMORY) and held < in_use:
            held = in_use
            reasons.append(f"running and pending pods request {in_use}")
        if held != value:
            out[name] = held
            notes[name] = f"smoothing holds {held} instead of {value}: " + "; ".join(reasons)
    return out, notes
