"""JetStream key-value conventions the services' shells share: how a deleted key looks on the bucket's stream.

The KOORD_SLO bucket is written by the slo service (a node's NodeSLO, or a delete marker when the node is gone) and
by the load-aware scheduler and the descheduler (the watermarks they state, services.common.watermark_feed); the
API and the integration tests read it back. They all tell a deleted key the same way.
"""

from __future__ import annotations

from typing import Final

from bus.api import Delivery

KV_OPERATION: Final = "KV-Operation"
"""JetStream KV's header: `DEL` marks a deleted key (what `nats kv get` reports as deleted)."""
KV_DELETE: Final = "DEL"


def is_delete_marker(delivery: Delivery) -> bool:
    return delivery.headers.get(KV_OPERATION) in (KV_DELETE, "PURGE")
