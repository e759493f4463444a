"""The simulated cluster's loop: what the API server, kube-scheduler and the kubelets of `koordbus up --simulate-nodes`
would do, through the same interfaces a real cluster uses.

`SimCluster.run` imports the teams' quota tree through the REST API (koordbus.simcluster.teams), publishes every
simulated node's pods and their ReplicaSets on KOORD_CLUSTER as the Kubernetes bridge would (PodObserved,
WorkloadObserved), then every `tick` seconds:

  * creates the team pods `teams.wanted` starts (a pending PodObserved) and finishes the ones that ended
    (Succeeded, then their tombstone; their node stops running them);
  * schedules the pending pods, oldest first, as kube-scheduler with the quota plugin and the load-aware extender
    would: the quota check (POST /api/v1/quotas/check), the nodes their requests fit on (koordbus.simcluster
    .placement), then the extender's filter and prioritize over mutual TLS, and its bind, which records the placement
    and creates the Binding through the bridge; a bound pod is published with its node and from then on runs on
    that simulated node (agent.simulate.SimulatedNode.add_pod), so its usage shows in the node's NodeMetric;
  * carries out the evictions the migration executor asked for (services.k8s.recording_verbs calls `evicted`): the
    pod stops running, its tombstone is published and, for a ReplicaSet's pod, a replacement is created with the
    same requests and usage, scheduled like any other pod (so it lands on a node with room).

Nothing is decided here that a real cluster's components would not decide; numbers come from the simulated nodes
and the pure plans. Started by koordbus.up; tests/e2e/test_up_simcluster.py runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import msgspec

from agent.actuate import NodePod
from agent.simulate import SimulatedNode
from agent.simulate_pods import UsageProfile
from bus import streams, subjects
from bus.api import Bus, FollowFrom, msg_id
from bus.errors import BusError
from koordbus.simcluster import placement, pods, teams
from schemas import kube, resources
from schemas.cluster import PodObserved, WorkloadObserved
from schemas.scheduling import SchedulingPod

log = logging.getLogger(__name__)

_POD_OBSERVED: Final = msgspec.json.Decoder(PodObserved)
TICK_SECONDS: Final = 5.0
REPORT_SECONDS: Final = 300.0
"""How often the loop logs what it runs."""
FINISHED_KEPT_SECONDS: Final = 30.0
"""A finished (Succeeded) pod is deleted this long after it finished, as a Job's controller cleans up."""


@dataclass(frozen=True)
class Extender:
    """Where the load-aware extender answers and the client credentials to present."""

    url: str
    ca: str
    cert: str
    key: str


@dataclass
class _Pod:
    doc: dict[str, Any]
    usage: UsageProfile
    node: str = ""
    version: int = 0
    finished_at: float | None = None
    team_index: int | None = None
    _request: resources.ResourceList | None = None

    @property
    def request(self) -> resources.ResourceList:
        """Its cpu and memory request (placement.request), computed once: a pod's requests never change."""
        if self._request is None:
            self._request = placement.request(msgspec.convert(self.doc, kube.Pod))
        return self._request

    @property
    def namespace(self) -> str:
        return str(self.doc["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.doc["metadata"]["uid"])


@dataclass
class Tally:
    """What the loop did, for its log line and the tests."""

    created: int = 0
    bound: int = 0
    finished: int = 0
    moved: int = 0
    unschedulable: dict[str, str] = field(default_factory=dict)


class SimCluster:
    def __init__(
        self,
        bus: Bus,
        nodes: list[SimulatedNode],
        *,
        api: str,
        token: str,
        extender: Extender | None,
        running_since: float | None = None,
        tick: float = TICK_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`running_since`: when the nodes' own pods were scheduled (their PodScheduled time; default now)."""
        self.bus = bus
        self.nodes = {node.name: node for node in nodes}
        self.api, self.token, self.extender, self.tick, self.clock = api, token, extender, tick, clock
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.pending: deque[tuple[str, str]] = deque()
        self.evictions: deque[tuple[str, str]] = deque()
        self.tally = Tally()
        self._started = clock()
        self.running_since = self._started if running_since is None else running_since

    async def evicted(self, namespace: str, name: str) -> None:
        """An eviction the migration executor asked for (services.k8s.recording_verbs): carried out next tick."""
        self.evictions.append((namespace, name))

    async def run(self) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise, every tick
        api = httpx.AsyncClient(base_url=self.api, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        tls = None
        if self.extender is None:
            log.warning("simulated cluster: no extender (--no-extender): the teams' pods are created and stay pending")
        else:
            tls = httpx.AsyncClient(
                base_url=self.extender.url,
                verify=_ssl_context(self.extender),
                timeout=30,
            )
        try:
            await self._import_quotas(api)
            while True:  # the cluster's pods, once: retried while the bus fails (a start-up under load)
                try:
                    await self._sweep_previous_run()
                    await self._publish_nodes_pods()
                    break
                except BusError as e:
                    log.warning("simulated cluster: publishing the nodes' pods: %s; trying again", e)
                    await asyncio.sleep(self.tick)
            report_due = self.clock() + REPORT_SECONDS
            while True:
                try:
                    await self.step(api, tls)
                except (httpx.HTTPError, BusError, ValueError, KeyError) as e:  # the API or bus away, an odd answer:
                    log.warning("simulated cluster: %r; the next tick tries again", e)  # the loop goes on
                if self.clock() >= report_due:
                    report_due = self.clock() + REPORT_SECONDS
                    log.info("simulated cluster: %s", self.summary())
                await asyncio.sleep(self.tick)
        finally:
            await api.aclose()
            if tls is not None:
                await tls.aclose()

    def summary(self) -> str:
        """What runs now and what happened since the start, for the log."""
        team_pods = [p for p in self.pods.values() if p.team_index is not None and p.finished_at is None]
        running = sum(1 for p in team_pods if p.node)
        t = self.tally
        return (
            f"{running} team pods running, {len(team_pods) - running} pending; since the start {t.created} created, "
            f"{t.bound} bound, {t.finished} finished, {t.moved} moved by migrations"
        )

    async def _import_quotas(self, api: httpx.AsyncClient) -> None:
        items = teams.quotas(len(self.nodes))
        for attempt in range(60):
            try:
                answer = await api.post("/api/v1/quotas/import", json={"items": items})
                if answer.status_code == 200:
                    log.info(
                        "simulated cluster: the teams' quota tree imported (changed: %s)", answer.json().get("changed")
                    )
                    return
                log.warning("simulated cluster: importing the teams' quotas: %s %s", answer.status_code, answer.text)
            except httpx.HTTPError as e:
                log.info("simulated cluster: the API is not answering yet (%s)", e)
            await asyncio.sleep(min(1.0 + attempt, 5.0))

    async def _sweep_previous_run(self) -> None:
        """Tombstones for the pods an earlier run of the simulation left on the cluster stream (a data dir used
        again): the team pods and replacements it ran are gone with it, as a restarted cluster's would be."""
        current = {(p.pod.metadata.namespace, p.pod.metadata.name) for n in self.nodes.values() for p in n.pods()}
        teams_namespaces = {team.name for team in teams.TEAMS}
        last: dict[str, PodObserved] = {}
        try:
            follower = await self.bus.follow(streams.KOORD_CLUSTER, [subjects.CLUSTER_PODS], FollowFrom(sequence=1))
        except BusError as e:  # no stream yet: nothing left over
            log.info("simulated cluster: no earlier pods to sweep (%s)", e)
            return
        try:
            while True:
                batch = await follower.next()
                for delivery in batch:
                    with contextlib.suppress(msgspec.MsgspecError):
                        last[delivery.subject] = _POD_OBSERVED.decode(delivery.data)
                if not batch and await follower.caught_up():
                    break
        finally:
            await follower.close()
        left = [
            o
            for o in last.values()
            if not o.deleted
            and (o.node_name in self.nodes or o.namespace in teams_namespaces)
            and (o.namespace, o.name) not in current
        ]
        messages = []
        for observed in left:
            gone = msgspec.structs.replace(observed, deleted=True, observed_at=self._started)
            subject = subjects.cluster_pod(observed.namespace, observed.name)
            messages.append((subject, msgspec.json.encode(gone), msg_id("simcluster", "swept", subject, self._started)))
        if messages:
            await self.bus.publish_many(messages)
            log.info("simulated cluster: %d pods of an earlier run deleted", len(messages))

    async def _publish_nodes_pods(self) -> None:
        messages: list[tuple[str, bytes, str]] = []
        replicas: dict[tuple[str, str], tuple[kube.OwnerReference, int]] = {}
        for node in self.nodes.values():
            for node_pod in node.pods():
                doc = pods.with_conditions(msgspec.to_builtins(node_pod.pod), self.running_since)
                pod = self.pods[(node_pod.pod.metadata.namespace, node_pod.pod.metadata.name)] = _Pod(
                    doc=doc, usage=UsageProfile(0, 0, 0, 0), node=node.name
                )
                messages.append(self._observed(pod))
                owner = kube.controller_of(node_pod.pod.metadata)
                if owner is not None:
                    key = (pod.namespace, owner.name)
                    replicas[key] = (owner, replicas.get(key, (owner, 0))[1] + 1)
        for (namespace, name), (owner, count) in replicas.items():
            workload = WorkloadObserved(
                namespace=namespace,
                name=name,
                observed_at=self._started,
                api_version=owner.api_version,
                kind=owner.kind,
                uid=owner.uid,
                replicas=count,
                resource_version="1",
            )
            subject = subjects.cluster_workload(namespace, name)
            messages.append((subject, msgspec.json.encode(workload), msg_id("simcluster", subject, self._started)))
        await self.bus.publish_many(messages)

    def _observed(self, pod: _Pod, *, deleted: bool = False) -> tuple[str, bytes, str]:
        pod.version += 1
        now = self.clock()
        observed = PodObserved(
            namespace=pod.namespace,
            name=pod.name,
            observed_at=now,
            uid=pod.uid,
            node_name=pod.node,
            resource_version=str(pod.version),
            deleted=deleted,
            pod=msgspec.convert(pod.doc, SchedulingPod),
        )
        subject = subjects.cluster_pod(pod.namespace, pod.name)
        return subject, msgspec.json.encode(observed), msg_id("simcluster", pod.uid, pod.version, self._started)

    async def step(self, api: httpx.AsyncClient, tls: httpx.AsyncClient | None) -> None:
        """One tick: evictions, finished pods, new pods, then scheduling."""
        now = self.clock()
        messages: list[tuple[str, bytes, str]] = []
        while self.evictions:
            messages.extend(self._evict(*self.evictions.popleft()))
        wanted = {(p.team, p.pod["metadata"]["name"]): p for p in teams.wanted(len(self.nodes), now=now)}
        for key, pod in list(self.pods.items()):
            if pod.team_index is None:
                continue
            if pod.finished_at is None and key not in wanted:
                messages.extend(self._finish(pod, now))
            elif pod.finished_at is not None and now - pod.finished_at >= FINISHED_KEPT_SECONDS:
                messages.append(self._observed(pod, deleted=True))
                del self.pods[key]
        for key, team_pod in wanted.items():
            if key not in self.pods:
                pod = self.pods[key] = _Pod(doc=team_pod.pod, usage=team_pod.usage, team_index=team_pod.index)
                self.pending.append(key)
                messages.append(self._observed(pod))
                self.tally.created += 1
        if messages:
            await self.bus.publish_many(messages)
        if self.pending and tls is not None:
            await self._schedule(api, tls)

    def _finish(self, pod: _Pod, now: float) -> list[tuple[str, bytes, str]]:
        pod.finished_at = now
        if pod.node:
            self.nodes[pod.node].remove_pod(pod.uid)
        else:  # never scheduled: deleted, as its Job gave up on it
            pod.finished_at = now - FINISHED_KEPT_SECONDS
        pod.doc = {**pod.doc, "status": {**pod.doc.get("status", {}), "phase": kube.PHASE_SUCCEEDED}}
        self.tally.finished += 1
        return [self._observed(pod)]

    def _evict(self, namespace: str, name: str) -> list[tuple[str, bytes, str]]:
        pod = self.pods.pop((namespace, name), None)
        if pod is None or not pod.node:
            return []
        usage = self.nodes[pod.node].remove_pod(pod.uid) or pod.usage
        messages = [self._observed(pod, deleted=True)]
        owner = kube.controller_of(msgspec.convert(pod.doc["metadata"], kube.ObjectMeta))
        if owner is not None and owner.kind == "ReplicaSet":  # its controller makes a new pod, scheduled afresh
            replacement = _Pod(doc=pods.replacement(pod.doc, owner.name), usage=usage)
            self.pods[(replacement.namespace, replacement.name)] = replacement
            self.pending.append((replacement.namespace, replacement.name))
            messages.append(self._observed(replacement))
        self.tally.moved += 1
        log.info("simulated cluster: %s/%s evicted from %s", namespace, name, pod.node)
        return messages

    async def _schedule(self, api: httpx.AsyncClient, tls: httpx.AsyncClient) -> None:
        keys = [
            k for k in self.pending if k in self.pods and not self.pods[k].node and self.pods[k].finished_at is None
        ]
        self.pending.clear()
        if not keys:
            return
        answer = await api.post("/api/v1/quotas/check", json={"pods": [self.pods[k].doc for k in keys]})
        verdicts = answer.json().get("verdicts", []) if answer.status_code == 200 else []
        allocatable = {
            name: {"cpu": round(node.cpu_cores * 1000), "memory": node.memory_bytes}
            for name, node in self.nodes.items()
        }
        running = ((p.node, p.request) for p in self.pods.values() if p.node and p.finished_at is None)
        room = placement.free(allocatable, running)
        published: list[tuple[str, bytes, str]] = []
        for i, key in enumerate(keys):
            pod = self.pods[key]
            verdict = verdicts[i] if i < len(verdicts) else {}
            if not verdict.get("fits", False):
                self._unschedulable(key, f"quota: {'; '.join(verdict.get('reasons', [])) or answer.status_code}")
                continue
            fit = placement.candidates(pod.request, room=room)
            node = await self._place(tls, pod, fit) if fit else None
            if node is None:
                self._unschedulable(key, "no node has room" if not fit else "the extender filtered every node")
                continue
            pod.node = node
            pod.doc = pods.bound(pod.doc, node, at=self.clock())
            room[node] = resources.sub(room[node], pod.request)
            self.nodes[node].add_pod(NodePod(pod=msgspec.convert(pod.doc, kube.Pod)), pod.usage)
            published.append(self._observed(pod))
            self.tally.unschedulable.pop(f"{key[0]}/{key[1]}", None)
            self.tally.bound += 1
        if published:
            await self.bus.publish_many(published)

    def _unschedulable(self, key: tuple[str, str], why: str) -> None:
        self.tally.unschedulable[f"{key[0]}/{key[1]}"] = why
        self.pending.append(key)

    async def _place(self, tls: httpx.AsyncClient, pod: _Pod, nodes: list[str]) -> str | None:
        """Filter, prioritize and bind through the extender; the node bound to, or None."""
        args = {"Pod": pod.doc, "NodeNames": nodes}
        filtered = (await tls.post("/filter", json=args)).json()
        passing = filtered.get("NodeNames") or []
        if not passing:
            return None
        scores = (await tls.post("/prioritize", json={**args, "NodeNames": passing})).json()
        node = placement.best({s["Host"]: int(s["Score"]) for s in scores or []}, among=passing) or passing[0]
        binding = {"PodName": pod.name, "PodNamespace": pod.namespace, "PodUID": pod.uid, "Node": node}
        result = (await tls.post("/bind", json=binding)).json()
        if result.get("Error"):
            log.warning("simulated cluster: binding %s/%s: %s", pod.namespace, pod.name, result["Error"])
            return None
        return node


def _ssl_context(extender: Extender) -> Any:
    import ssl

    context = ssl.create_default_context(cafile=extender.ca)
    context.load_cert_chain(extender.cert, extender.key)
    return context
