"""The simulation's closed loop: batch pods placed only within a node's batch allocatable, evicted when it shrinks
(agent.simulate.place_batch_pods, and a SimulatedNode fed its allocatable window after window)."""

from __future__ import annotations

from agent.simulate import BatchDemand, BatchEviction, BatchPlacement, GiB, SimulatedNode, place_batch_pods
from schemas import vocab
from tests.support import batches as wire

T0 = 1_700_006_400.0


def pod(uid: str, cpu: float, memory_gib: int) -> BatchDemand:
    return BatchDemand(uid=uid, cpu=cpu, memory=memory_gib * GiB)


def test_candidates_are_placed_in_order_while_both_requests_fit() -> None:
    placement = place_batch_pods(
        (4.0, 8 * GiB), running=[], candidates=[pod("a", 2, 2), pod("b", 3, 1), pod("c", 1, 4), pod("d", 1, 3)]
    )
    # b does not fit the cpu left after a; c fits; d no longer fits the memory left
    assert placement == BatchPlacement(kept=(), placed=("a", "c"), evicted=())


def test_running_pods_are_kept_oldest_first_and_the_rest_evicted_when_allocatable_shrinks() -> None:
    running = [pod("old", 2, 2), pod("mid", 2, 2), pod("new", 1, 1)]
    assert place_batch_pods((10.0, 10 * GiB), running=running, candidates=[pod("x", 1, 1)]) == BatchPlacement(
        kept=("old", "mid", "new"), placed=("x",), evicted=()
    )
    shrunk = place_batch_pods((3.0, 10 * GiB), running=running, candidates=[pod("x", 1, 1)])
    assert shrunk == BatchPlacement(
        kept=("old", "new"),
        placed=(),
        evicted=(
            BatchEviction(
                uid="mid",
                feature="CPUAllocatableEvict",
                reason="batch-cpu request 2000m > 1000m left = batch allocatable 3000m − 2000m requested by the older "
                "pods kept",
            ),
        ),
    )
    memory = place_batch_pods((10.0, 3 * GiB), running=running, candidates=[])
    assert [(e.uid, e.feature) for e in memory.evicted] == [("mid", "MemoryAllocatableEvict")]
    assert memory.evicted[0].reason == (
        f"batch-memory request {2 * GiB} > {GiB} left = batch allocatable {3 * GiB} − {2 * GiB} requested by the "
        "older pods kept (bytes)"
    )
    gone = place_batch_pods((0.0, 0), running=running, candidates=[pod("x", 1, 1)])
    assert (gone.kept, gone.placed, [e.uid for e in gone.evicted]) == ((), (), ["old", "mid", "new"])


def batch_usage(node: SimulatedNode, start: float) -> tuple[float, int, dict[str, str]]:
    """The most CPU and memory the node's batch pods used at one second of a window, and their names by UID."""
    batch = node.batch(start, start + 10)
    per_second: dict[float, tuple[float, int]] = {}
    uids: dict[str, str] = {}
    for ref, samples in wire.samples_by_pod(batch):
        if ref.labels.get(vocab.PRIORITY_CLASS_LABEL) != vocab.PRIORITY_BATCH:
            continue
        uids[ref.uid] = f"{ref.namespace}/{ref.name}"
        for t, cpu, memory in samples:
            c, m = per_second.get(t, (0.0, 0))
            per_second[t] = (c + cpu, m + memory)
    return (
        max((c for c, _ in per_second.values()), default=0.0),
        max((m for _, m in per_second.values()), default=0),
        uids,
    )


def test_a_node_with_the_loop_closed_keeps_batch_usage_within_its_allocatable_and_evicts_when_it_shrinks() -> None:
    node = SimulatedNode("sim-node-0001", 5, cpu_cores=16, memory_bytes=64 * GiB, pods=40)
    # open loop (no allocatable known): the bursts want more than a third of the node at their peak
    peaks = [batch_usage(node, T0 + 600 * k)[0] for k in range(24)]
    assert max(peaks) > 4.0
    node = SimulatedNode("sim-node-0001", 5, cpu_cores=16, memory_bytes=64 * GiB, pods=40)
    node.set_batch_allocatable(4.0, 16 * GiB)
    seen: set[str] = set()
    for k in range(24):
        cpu, memory, uids = batch_usage(node, T0 + 600 * k)
        assert cpu <= 4.0 and memory <= 16 * GiB
        seen |= set(uids)
    assert seen  # batch pods still run, within the allocatable
    start = T0 + 600 * 24
    names = batch_usage(node, start)[2]
    running = set(names)
    assert running
    assert node.last_evictions == ()
    node.set_batch_allocatable(0.5, 1 * GiB)  # the node's batch allocatable shrinks
    cpu, memory, after = batch_usage(node, start + 10)
    uids = set(after)
    assert cpu <= 0.5 and memory <= 1 * GiB
    assert running - uids  # running pods left (evicted)
    # each one with the request a real agent publishes for a pod it evicts: this node, the window's start, the pod
    requests = node.last_evictions
    assert {r.uid: f"{r.namespace}/{r.name}" for r in requests} == {uid: names[uid] for uid in running - uids}
    assert {(r.node, r.at) for r in requests} == {("sim-node-0001", start + 10)}
    assert all(r.feature in ("CPUAllocatableEvict", "MemoryAllocatableEvict") and " > " in r.reason for r in requests)
    node.set_batch_allocatable(4.0, 16 * GiB)  # evicted pods do not come back; pods of later bursts are placed again
    assert not (running - uids) & set(batch_usage(node, start + 20)[2])
