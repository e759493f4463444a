"""The simulated cluster's loop (koordbus.simcluster.loop) over an in-memory bus, with the API and the extender
answered by stand-ins: a team pod is created pending, checked against its quota, filtered, scored and bound through
the extender, then published bound and run by its node; an evicted ReplicaSet pod is deleted and replaced by a new
pod that is scheduled like any other."""

from __future__ import annotations

import json

import httpx
import msgspec

from agent.simulate import SimulatedNode
from bus import streams, subjects
from bus.api import FollowFrom
from bus.memory import MemoryBus
from koordbus.simcluster import teams
from koordbus.simcluster.loop import SimCluster
from schemas.cluster import PodObserved

T0 = 1_795_776_000.0


class Stand:
    """The API's quota check and the extender's verbs, recording what was asked."""

    def __init__(self, *, fits: bool = True) -> None:
        self.fits = fits
        self.asked: list[str] = []

    def api(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.asked.append(request.url.path)
        if request.url.path == "/api/v1/quotas/import":
            return httpx.Response(200, json={"changed": [q["metadata"]["name"] for q in body["items"]]})
        verdicts = [{"fits": self.fits, "reasons": [] if self.fits else ["over max"]} for _ in body["pods"]]
        return httpx.Response(200, json={"fits": self.fits, "verdicts": verdicts})

    def extender(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.asked.append(request.url.path)
        if request.url.path == "/filter":
            return httpx.Response(200, json={"NodeNames": body["NodeNames"], "Error": ""})
        if request.url.path == "/prioritize":
            return httpx.Response(
                200, json=[{"Host": n, "Score": 10 if n.endswith("2") else 1} for n in body["NodeNames"]]
            )
        return httpx.Response(200, json={"Error": ""})


async def _last_pods(bus: MemoryBus) -> dict[tuple[str, str], PodObserved]:
    follower = await bus.follow(streams.KOORD_CLUSTER, [subjects.CLUSTER_PODS], FollowFrom(sequence=1))
    last: dict[tuple[str, str], PodObserved] = {}
    while not await follower.caught_up():
        for delivery in await follower.next():
            observed = msgspec.json.decode(delivery.data, type=PodObserved)
            last[(observed.namespace, observed.name)] = observed
    await follower.close()
    return last


async def _cluster(
    stand: Stand, clock: list[float]
) -> tuple[SimCluster, MemoryBus, httpx.AsyncClient, httpx.AsyncClient]:
    bus = MemoryBus()
    await bus.ensure_streams([streams.cluster_stream()])
    nodes = [SimulatedNode(f"sim-node-000{i}", i, cpu_cores=32, pods=6) for i in (1, 2)]
    sim = SimCluster(bus, nodes, api="http://api", token="t", extender=None, clock=lambda: clock[0])
    api = httpx.AsyncClient(base_url="http://api", transport=httpx.MockTransport(stand.api))
    tls = httpx.AsyncClient(base_url="https://extender", transport=httpx.MockTransport(stand.extender))
    await sim._publish_nodes_pods()
    return sim, bus, api, tls


async def test_team_pods_are_checked_placed_through_the_extender_bound_and_run_by_their_node() -> None:
    stand, clock = Stand(), [T0]
    sim, bus, api, tls = await _cluster(stand, clock)
    await sim.step(api, tls)
    wanted = teams.wanted(2, now=T0)
    assert sim.tally.created == len(wanted) and sim.tally.bound == len(wanted)
    assert stand.asked[:4] == ["/api/v1/quotas/check", "/filter", "/prioritize", "/bind"]
    last = await _last_pods(bus)
    team_pod = wanted[0]
    observed = last[(team_pod.team, team_pod.pod["metadata"]["name"])]
    assert observed.node_name == "sim-node-0002" and observed.pod is not None  # the best score
    assert observed.pod.status.phase == "Running" and observed.resource_version == "2"  # pending, then bound
    assert team_pod.uid in {p.uid for p in sim.nodes["sim-node-0002"].pods()}
    # after its lifetime it finishes (Succeeded), and its node stops running it
    clock[0] = team_pod.end + 1
    await sim.step(api, tls)
    finished = (await _last_pods(bus))[(team_pod.team, team_pod.pod["metadata"]["name"])]
    assert finished.pod is not None and finished.pod.status.phase == "Succeeded" and not finished.deleted
    assert team_pod.uid not in {p.uid for p in sim.nodes["sim-node-0002"].pods()}


async def test_a_pod_its_quota_refuses_stays_pending_and_unbound() -> None:
    stand, clock = Stand(fits=False), [T0]
    sim, _, api, tls = await _cluster(stand, clock)
    await sim.step(api, tls)
    assert sim.tally.bound == 0 and "/filter" not in stand.asked
    assert all(why.startswith("quota: over max") for why in sim.tally.unschedulable.values())


async def test_an_evicted_replicaset_pod_is_deleted_and_replaced_elsewhere() -> None:
    stand, clock = Stand(), [T0]
    sim, bus, api, tls = await _cluster(stand, clock)
    victim = sim.nodes["sim-node-0001"].pods()[0]
    namespace, name = victim.pod.metadata.namespace, victim.pod.metadata.name
    before = set(await _last_pods(bus))
    await sim.evicted(namespace, name)
    await sim.step(api, tls)
    last = await _last_pods(bus)
    assert last[(namespace, name)].deleted
    assert victim.uid not in {p.uid for p in sim.nodes["sim-node-0001"].pods()}
    owner = victim.pod.metadata.owner_references[0].name
    (replacement,) = [o for key, o in last.items() if key not in before and key[0] == namespace]
    assert replacement.name.startswith(f"{owner}-") and replacement.uid != victim.uid
    # scheduled like any pod: here where its requests fit (the victim's node has its room back; the extender keeps a
    # replacement off a node that is still hot)
    assert replacement.node_name in sim.nodes and sim.tally.moved == 1
    assert replacement.pod is not None and replacement.pod.status.phase == "Running"
