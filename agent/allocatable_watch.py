"""The node's batch and mid allocatable as the noderesource service last wrote it, for the allocatable evictions
(MemoryAllocatableEvict, CPUAllocatableEvict; spec §5.5.2–5.5.3), and its CPU normalization ratio, for the BE
pods' CFS quota (§5.7: divided by the ratio when it is above 1).

koordlet reads them from its Node object; the agent reads no Kubernetes object, so it reads the decision the bridge
writes on the Node: its own NodeResourceComputed on KOORD_NODERESOURCE, one direct read of its own subject (the only
read of that stream a node's NATS user is allowed, bus.auth.node_permissions). The allocatable in force is the last
decision that was due for a write (`resources` when `write_due`, else the `last_write_resources` it compared with);
a decision that removed them leaves none. The ratio is the decision's `node.koordinator.sh/cpu-normalization-ratio`
annotation (the value the bridge writes on the Node, which koordlet reads); a decision that leaves the annotation
alone keeps the last ratio read. Unreadable or undecodable: the last one read stays (None before any).
"""

from __future__ import annotations

import logging
from typing import Protocol

import msgspec

from bus import streams, subjects
from bus.api import Delivery
from bus.errors import BusError
from schemas.koordinator import ANNOTATION_CPU_NORMALIZATION_RATIO, parse_cpu_normalization_ratio
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed

log = logging.getLogger(__name__)


class KeyReader(Protocol):
    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None: ...


def allocatable_in_force(computed: NodeResourceComputed) -> dict[str, int]:
    """The batch/mid resources the node carries after this decision (the last due write's)."""
    written = computed.resources if computed.write_due else computed.last_write_resources
    return {name: int(amount) for name, amount in written.items() if amount is not None}


class AllocatableSource:
    def __init__(self, reader: KeyReader, node: str) -> None:
        self._reader = reader
        self._node = node
        self.allocatable: dict[str, int] | None = None
        """The node's batch/mid allocatable (kubernetes.io/batch-cpu in millicores, …); None: none read yet."""
        self.cpu_normalization_ratio: float | None = None
        """The node's CPU normalization ratio; None: none read yet, or not a number."""
        self.revision = 0
        self.read_failures = 0

    async def refresh(self) -> None:
        try:
            stored = await self._reader.last_on_subject(
                streams.KOORD_NODERESOURCE, subjects.noderesource_computed(self._node), direct=True
            )
        except (BusError, TimeoutError, OSError) as e:
            self.read_failures += 1
            log.debug("node %s: batch allocatable not readable (%s); keeping the last", self._node, e)
            return
        if stored is None or stored.stream_seq == self.revision:
            return
        try:
            computed = NODERESOURCE_COMPUTED_DECODER.decode(stored.data)
        except msgspec.DecodeError as e:
            self.read_failures += 1
            log.warning("node %s: batch/mid decision %d not readable: %s", self._node, stored.stream_seq, e)
            self.revision = stored.stream_seq
            return
        self.allocatable = allocatable_in_force(computed)
        ratio_text = computed.annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO)
        if ratio_text is not None:
            self.cpu_normalization_ratio = parse_cpu_normalization_ratio(ratio_text)
        self.revision = stored.stream_seq
