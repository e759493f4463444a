"""The descheduler's view of one LowNodeLoad round, on the wire and in the API (issue 25, point 5).

The migration service publishes a DeschedulerRound after every Balance round it runs (subject
`koord.v1.descheduler.rounds`, stream KOORD_DESCHEDULER) and answers a plan request with one computed for the state
it holds without acting on it (`koord.v1.rpc.migration.plan`). `GET /api/v1/descheduler/rounds/latest`,
`GET /api/v1/descheduler/plan`, the dashboard's migrations page and `koordbus migration plan` show them.

Amounts are Kubernetes' integer forms, as the descheduler compares them: cpu in millicores, memory in bytes, pods as
a count. Built from a round's decision by services.migration.descheduler_view.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

UnixSeconds = Annotated[float, msgspec.Meta(ge=0, le=4_102_444_800, description="seconds since the epoch")]
NodeClass = Literal["lowNodes", "highNodes", "prodLowNodes", "prodHighNodes", "bothLowNodes", "normal", "unusable"]

MAX_ROUND_NODES: Final = 1_000
"""The most nodes a round's view lists, the classes the round acts on first (`nodesOmitted` counts the rest): about
450 bytes each, so a round stays well within NATS's 1 MB message limit. Each pool's `counts` cover every node."""


class NodeLoadView(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One node of a pool as the round saw it: its class, whether it is abnormal, why, and the figures."""

    node: str
    pool: str
    node_class: NodeClass
    abnormal: bool = False
    """Over its thresholds for the anomaly condition's consecutive rounds (only high and prodHigh nodes)."""
    why: str
    allocatable: dict[str, int] = {}
    usage: dict[str, int] = {}
    prod_usage: dict[str, int] = {}
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    prod_low: dict[str, int] = {}
    prod_high: dict[str, int] = {}


class PoolView(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A node pool's round: how many of its nodes fell in each class and why the round ended there."""

    name: str
    nodes: int
    counts: dict[str, int]
    """Nodes per class (NodeClass), abnormal ones as `abnormal` and `abnormalProd`."""
    outcome: str


class EvictionView(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A pod the round asked to move (or would have, on a dry run or a plan), with Koordinator's reason."""

    pod: str
    node: str
    pool: str
    prod: bool
    reason: str
    job: str = ""
    """The PodMigrationJob asked for; empty on a dry run, a plan, or when the pod has a job already."""


class DeschedulerRound(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag="descheduler.round.v1"):
    """One LowNodeLoad round as the descheduler decided it (`planned`: computed on request, nothing acted on)."""

    at: UnixSeconds
    plugin: Literal["LowNodeLoad"] = "LowNodeLoad"
    planned: bool = False
    dry_run: bool = False
    paused: bool = False
    problems: list[str] = []
    """Why the round did not run: the effective args' validation problems."""
    pools: list[PoolView] = []
    nodes: Annotated[list[NodeLoadView], msgspec.Meta(max_length=MAX_ROUND_NODES)] = []
    nodes_omitted: int = 0
    evictions: list[EvictionView] = []


_ENCODER = msgspec.json.Encoder()
ROUND_DECODER: Final = msgspec.json.Decoder(DeschedulerRound)


def encode_round(view: DeschedulerRound) -> bytes:
    return _ENCODER.encode(view)
