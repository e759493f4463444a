"""How a simulated pod's object changes as the cluster handles it: pure.

koordbus.simcluster.loop keeps each pod as the API server would return it (a JSON document) and publishes it as the
Kubernetes bridge would after each change: `bound` once the extender's bind went through (its node, Running, and the
PodScheduled, Initialized and Ready conditions the load-aware extender and the migration arbiter read), and
`replacement` for the pod a ReplicaSet creates when one of its pods is evicted (a new name and uid, unscheduled).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any

from schemas import kube

CONDITIONS = ("PodScheduled", "Initialized", "Ready")


def bound(doc: dict[str, Any], node: str, *, at: float) -> dict[str, Any]:
    """The pod bound to `node` at `at`, as the bridge then sees it: its node, Running, scheduled and ready."""
    placed = {
        **doc,
        "spec": {**doc["spec"], "nodeName": node},
        "status": {**doc.get("status", {}), "phase": kube.PHASE_RUNNING},
    }
    return with_conditions(placed, at)


def with_conditions(doc: dict[str, Any], at: float) -> dict[str, Any]:
    """The pod with PodScheduled, Initialized and Ready true since `at` (what its kubelet reports once it runs)."""
    since = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": kind, "status": "True", "lastTransitionTime": since} for kind in CONDITIONS]
    return {**doc, "status": {**doc.get("status", {}), "conditions": conditions}}


def replacement(doc: dict[str, Any], replica_set: str) -> dict[str, Any]:
    """The pod a ReplicaSet makes for the evicted pod `doc`: a new name and uid (derived from the old uid, so a run is
    repeatable), its template's spec without a node, Pending."""
    seed = f"{doc['metadata']['uid']}/replacement".encode()
    suffix = hashlib.blake2b(seed, digest_size=3).hexdigest()[:5]
    uid = str(uuid.UUID(bytes=hashlib.blake2b(seed, digest_size=16).digest(), version=4))
    metadata = {**doc["metadata"], "name": f"{replica_set}-{suffix}", "uid": uid}
    spec = {k: v for k, v in doc["spec"].items() if k != "nodeName"}
    status = {"phase": kube.PHASE_PENDING, "qosClass": doc.get("status", {}).get("qosClass", "")}
    return {**doc, "metadata": metadata, "spec": spec, "status": status}
