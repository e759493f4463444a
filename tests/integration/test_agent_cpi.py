"""CPI on this machine's real kernel (issue 23, point 6): the probe answers, with a reason where hardware counters are
not allowed (this machine is a VM without a PMU: ENOENT); an agent with CPI on then says so once, shows it on
/metrics and publishes batches without any CPI; where the probe succeeds, the cycles and instructions of this test
process's own cgroup are counted. The same perf_event_open code (cgroup counter groups on every CPU, enable, read,
close) is exercised here with software events, which every kernel with perf events has: on this process's cgroup,
and as a whole CPI round on a pod cgroup of a private subtree of the real cgroup filesystem, whose counts reach the
published batch; a cancelled round closes every descriptor it opened."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import threading
import uuid
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from agent import collect, cpi, cpus, perf
from agent.cpi_collect import CpiCollector, in_thread
from agent.metrics import AgentMetrics
from agent.service import AgentService
from agent.settings import AgentSettings
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported
from tests.cgroup_tree import FakeCgroupTree, pod_rel
from tests.integration.test_agent_collect import (
    UID_B,
    UID_E,
    UID_G,
    FakeTime,
    FlakyPublisher,
    _remove_subtree,
    build_tree,
    settings_for,
)

SOFTWARE = (cpi.TASK_CLOCK, cpi.CONTEXT_SWITCHES)
"""Counted through the same code where hardware counters are not allowed: "cycles" is task-clock ns here."""


def open_descriptors() -> int:
    """This process's perf-event descriptors and descriptors into the cgroup filesystem: what the collector opens and
    must close. (Every descriptor, counted before, failed a run of the suites: earlier tests' sockets and files
    closed by a garbage collection in between, 47 before and 37 after with the collector's 4 open.)"""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            count += target == "anon_inode:[perf_event]" or target.startswith("/sys/fs/cgroup")
    return count


def own_perf_cgroup() -> Path | None:
    """This process's cgroup in the hierarchy that has the perf_event controller (v1 `perf_event`, else v2), or None
    when it cannot be found (a cgroup namespace whose root is not the mount's)."""
    memberships = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fstype, _source, options = tail.split(" ", 2)
        mounts.append((fields.split()[3], fields.split()[4], fstype, set(options.split(","))))
    v1 = next((p for _hid, controllers, p in memberships if "perf_event" in controllers.split(",")), None)
    if v1 is not None:
        path, wanted = v1, [m for m in mounts if m[2] == "cgroup" and "perf_event" in m[3]]
    else:
        path = next((p for hid, _c, p in memberships if hid == "0"), "")
        wanted = [m for m in mounts if m[2] == "cgroup2"]
    for root, mountpoint, _fstype, _options in wanted:
        if root == "/":
            return Path(mountpoint) / path.lstrip("/")
    return None


def busy_work() -> int:
    total = 0
    for i in range(300_000):
        total += i * i
    return total


# --- the probe


def test_the_probe_answers_on_this_kernel_and_closes_what_it_opened() -> None:
    before = open_descriptors()
    reason = perf.probe()
    assert open_descriptors() == before
    if reason is None:
        return  # a machine whose kernel lets this process count cycles and instructions
    assert re.fullmatch(r"E[A-Z0-9]+: .+", reason), reason
    if reason.startswith("ENOENT"):  # no PMU (this machine): perf events exist, the hardware ones do not
        assert "PMU" in reason
        assert perf.probe(SOFTWARE) is None


def test_counting_cycles_and_instructions_of_this_process_cgroup() -> None:
    reason = perf.probe()
    if reason is not None:
        pytest.skip(f"hardware counters are not available here: {reason}")
    cgroup = own_perf_cgroup()
    assert cgroup is not None, "the probe counts this process, so its perf_event cgroup must be found"
    before = open_descriptors()
    with perf.CounterGroups.open_cgroup(str(cgroup), cpus.online_cpus("/sys"), cpi.CPI_EVENTS) as groups:
        groups.enable()
        busy_work()
        count = cpi.count_of(groups.read(), t=1.0, seconds=1.0)
    assert open_descriptors() == before
    assert count.instructions > 0 and count.cycles > 0
    assert count.cpi is not None and count.cpi > 0


def test_the_cgroup_counter_code_counts_software_events_of_this_process_cgroup() -> None:
    reason = perf.probe(SOFTWARE)
    if reason is not None:
        pytest.skip(f"perf_event_open is not allowed here at all: {reason}")
    cgroup = own_perf_cgroup()
    if cgroup is None:
        pytest.skip("this process's perf_event cgroup is not under a mount of its hierarchy's root")
    online = cpus.online_cpus("/sys")
    before = open_descriptors()
    with perf.CounterGroups.open_cgroup(str(cgroup), online, SOFTWARE) as groups:
        assert groups.descriptors == 2 * len(online)
        groups.enable()
        busy_work()
        reads = groups.read()
    assert open_descriptors() == before
    assert len(reads) == len(online)
    task_clock_ns, _switches = cpi.totals(reads, 2)
    assert task_clock_ns > 0  # this process ran in its cgroup while the counters were on
    not_a_cgroup = Path("/proc/self").resolve()
    with pytest.raises(OSError):
        perf.CounterGroups.open_cgroup(str(not_a_cgroup), online, SOFTWARE)
    assert open_descriptors() == before


# --- an agent with CPI on where the kernel does not allow it


async def test_an_agent_with_cpi_on_says_so_once_and_publishes_no_cpi(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reason = perf.probe()
    tree = build_tree(tmp_path, 2, "cgroupfs")
    fake = FakeTime(tree, start=1_700_000_005.0)
    publisher = FlakyPublisher()

    async def sleep(seconds: float) -> None:
        await fake.sleep(seconds)
        await asyncio.sleep(0)  # lets the CPI task, started by run(), take its turn
        if fake.now >= 1_700_000_031.0:
            await service.stop()

    settings = settings_for(tree, cpi_collect=True)
    service = AgentService(settings, publisher, clock=fake.clock, sleep=sleep)
    with caplog.at_level(logging.INFO, logger="agent.cpi_collect"):
        await service.run()
    batches = [NODE_EVENT_DECODER.decode(d) for s, d, _ in publisher.sent if s.endswith(".metrics")]
    assert len(batches) == 3
    for data in (d for s, d, _ in publisher.sent if s.endswith(".metrics")):
        assert "pod_cpi" not in msgspec.msgpack.decode(data)  # nothing on the wire: no zeros, no empty field
    assert all(isinstance(b, NodeMetricsReported) and b.pod_cpi == [] for b in batches)
    said = [r for r in caplog.records if "CPI not available" in r.getMessage()]
    registry = CollectorRegistry()
    registry.register(AgentMetrics(service, None))
    gauge = registry.get_sample_value("koordbus_agent_cpi_unavailable", {"node": "node-a.example", "part": "metrics"})
    if reason is None:  # a machine with a PMU: CPI is on; its rounds (10 s of real time) had not ended yet
        assert said == [] and not service.cpi_stats.cpi_unavailable and gauge == 0.0
        return
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert said[0].getMessage() == f"node node-a.example: CPI not available: {reason}; no CPI is reported"
    assert service.cpi_stats.cpi_unavailable and service.cpi_stats.cpi_reason == reason
    assert service.cpi_stats.cpi_rounds == 0
    assert gauge == 1.0


async def test_an_agent_with_cpi_off_has_no_cpi_task_and_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = build_tree(tmp_path, 2, "cgroupfs")
    fake = FakeTime(tree, start=1_700_000_005.0)
    service = AgentService(settings_for(tree), FlakyPublisher(), clock=fake.clock, sleep=fake.sleep)
    with caplog.at_level(logging.INFO, logger="agent.cpi_collect"):
        for _ in range(3):
            await service.collect_once()
    assert service._cpi is None and not service.cpi_stats.cpi_unavailable
    assert not [r for r in caplog.records if "CPI" in r.getMessage()]


# --- a whole round on a real pod cgroup


_WORKER = """
import sys
for line in sys.stdin:          # one unit of work per line, in the pod cgroup it was moved to
    total = 0
    for i in range(1_000_000):
        total += i
    print("done", flush=True)
"""


def _perf_layout() -> tuple[Path, Path] | str:
    """(the hierarchy agent.collect detects kubepods in, the one with perf_event) under /sys/fs/cgroup, or why not."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return (root, root) if os.access(root, os.W_OK) else f"{root} is not writable"
    layout = next((root / h for h in ("cpuacct", "cpu,cpuacct") if (root / h).is_dir()), None)
    if layout is None:
        return "no cgroup v1 cpuacct hierarchy"
    for name in ("perf_event", "unified"):
        perf_root = root / name
        if perf_root.is_dir() and (name == "perf_event" or (perf_root / "cgroup.controllers").exists()):
            writable = os.access(layout, os.W_OK) and os.access(perf_root, os.W_OK)
            return (layout, perf_root) if writable else f"{layout} or {perf_root} is not writable"
    return "no perf_event hierarchy (v1 perf_event or a unified one)"


@pytest.mark.cgroup
async def test_a_round_counts_a_real_pod_cgroup_into_the_batch_and_a_cancelled_one_closes_everything(
    tmp_path: Path,
) -> None:
    if (reason := perf.probe(SOFTWARE)) is not None:
        pytest.skip(f"perf_event_open is not allowed here at all: {reason}")
    found = _perf_layout()
    if isinstance(found, str):
        pytest.skip(f"needs a writable cgroup filesystem with a perf_event hierarchy: {found}")
    layout_root, perf_root = found
    parent = f"koordbus-test-{uuid.uuid4().hex[:12]}"
    uid = UID_G
    pod_dir = perf_root / parent / pod_rel("cgroupfs", uid, "Guaranteed")
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WORKER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    tops = sorted({layout_root / parent, perf_root / parent})
    try:
        try:
            (layout_root / parent / "kubepods").mkdir(parents=True, exist_ok=True)
            pod_dir.mkdir(parents=True)
            (pod_dir / "cgroup.procs").write_text(str(worker.pid))
        except OSError as e:
            pytest.skip(f"cannot create or join a cgroup under {perf_root}: {e}")
        assert worker.stdin is not None and worker.stdout is not None
        stdin, stdout = worker.stdin, worker.stdout

        async def window(_seconds: float) -> None:  # the window lasts exactly one unit of the worker's work
            stdin.write(b"go\n")
            await stdin.drain()
            assert await stdout.readline() == b"done\n"

        real = AgentSettings(node_name="node-a.example", cgroup_driver="cgroupfs", kubepods_parent=parent)
        collector = CpiCollector(real, sleep=window, probe=lambda: None, events=SOFTWARE)

        # The agent, its node read from a generated tree that has the same pod, and this real CPI round.
        tree = build_tree(tmp_path, 2, "cgroupfs")
        fake = FakeTime(tree, start=1_700_000_000.0)
        publisher = FlakyPublisher()
        service = AgentService(settings_for(tree), publisher, clock=fake.clock, sleep=fake.sleep, cpi=collector)
        await service.collect_once()  # the first reading: the pods' baseline

        before = open_descriptors()
        counts = await collector.round_once()
        assert open_descriptors() == before
        assert set(counts) == {uid}
        count = counts[uid]
        assert count.cycles > 0  # task-clock ns of the worker's unit of work, counted through its pod cgroup
        assert count.seconds > 0
        assert collector.stats.cpi_rounds == 1 and collector.stats.cpi_pods == 1 and not collector.stats.cpi_unavailable

        for _ in range(12):  # past the window's end: the batch of [0, 10) is published
            await fake.sleep(1.0)
            await service.collect_once()
        batches = [NODE_EVENT_DECODER.decode(d) for s, d, _ in publisher.sent if s.endswith(".metrics")]
        rows = [(b.pods[r.pod].uid, r) for b in batches if isinstance(b, NodeMetricsReported) for r in b.pod_cpi]
        assert [(pod, row.t, row.cycles, row.instructions) for pod, row in rows] == [
            (uid, count.t, count.cycles, count.instructions)
        ]
        assert collector.take() == {}  # attached once, not again

        # A round cancelled in its window closes the groups it opened.
        in_window = asyncio.Event()

        async def endless_window(_seconds: float) -> None:
            in_window.set()
            await asyncio.Event().wait()

        collector = CpiCollector(real, sleep=endless_window, probe=lambda: None, events=SOFTWARE)
        round_task = asyncio.create_task(collector.round_once())
        await in_window.wait()
        assert open_descriptors() == before + 2 * len(cpus.online_cpus("/sys"))
        round_task.cancel()
        (outcome,) = await asyncio.gather(round_task, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError)
        assert open_descriptors() == before and collector.take() == {}
    finally:
        worker.kill()
        await worker.communicate()  # reaps the worker and closes its pipes
        _remove_subtree(tops)


async def test_what_a_thread_opens_after_its_caller_was_cancelled_is_handed_back_to_close() -> None:
    release = threading.Event()
    abandoned: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def opening() -> str:
        release.wait()
        return "descriptors"

    task = asyncio.create_task(in_thread(opening, if_abandoned=abandoned.set_result))
    await asyncio.sleep(0)  # the thread is started
    task.cancel()
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError) and not abandoned.done()
    release.set()
    assert await abandoned == "descriptors"


def test_fake_tree_pods_are_not_perf_event_cgroups(tmp_path: Path) -> None:
    """A directory that is no cgroup of the perf_event hierarchy is refused with a reason that says so."""
    if (reason := perf.probe(SOFTWARE)) is not None:
        pytest.skip(f"perf_event_open is not allowed here at all: {reason}")
    tree = FakeCgroupTree(root=tmp_path, version=2, driver="cgroupfs")
    tree.add_pod(UID_G, "Guaranteed")
    tree.write()
    directory = tree.cgroup_root / pod_rel("cgroupfs", UID_G, "Guaranteed")
    with pytest.raises(OSError) as refused:
        perf.CounterGroups.open_cgroup(str(directory), [0], SOFTWARE)
    assert "perf_event controller" in cpi.explain_errno(refused.value.errno or 0, cgroup=True)


async def test_pods_the_kernel_refuses_are_left_out_and_said_once_and_rounds_take_pods_in_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A generated tree's pod directories are no perf_event cgroups: every pod is refused, which is logged once (not
    every round) with the reason, and makes CPI count as unavailable; with room for one pod's descriptors per round,
    the pods are tried in turn, which is said once too."""
    if (reason := perf.probe(SOFTWARE)) is not None:
        pytest.skip(f"perf_event_open is not allowed here at all: {reason}")
    tree = build_tree(tmp_path, 2, "cgroupfs")
    windows: list[float] = []

    async def window(seconds: float) -> None:
        windows.append(seconds)

    online = len(cpus.online_cpus("/sys"))
    collector = CpiCollector(
        settings_for(tree), sleep=window, probe=lambda: None, events=SOFTWARE, max_descriptors=2 * online
    )
    before = open_descriptors()
    with caplog.at_level(logging.INFO, logger="agent.cpi_collect"):
        for _ in range(3):
            assert await collector.round_once() == {}
    assert open_descriptors() == before
    assert windows == [10.0, 10.0, 10.0]
    messages = [r.getMessage() for r in caplog.records]
    refused = [m for m in messages if "CPI not counted" in m]
    assert len(refused) == 1, messages
    assert "not counted for any pod" in refused[0] and "perf_event controller" in refused[0]
    assert [m for m in messages if "CPI counts 1 of 3 pods per round" in m] == [messages[0]]
    stats = collector.stats
    assert stats.cpi_unavailable and "perf_event controller" in stats.cpi_reason
    assert (stats.cpi_rounds, stats.cpi_pods, stats.cpi_pod_failures) == (3, 0, 3)


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_pod_cgroups_are_found_in_the_hierarchy_that_has_perf_event(tmp_path: Path, driver: str) -> None:
    v2 = build_tree(tmp_path / "v2", 2, driver)
    found, problem = collect.perf_event_pod_dirs(settings_for(v2), collect.detect_layout(settings_for(v2)))
    assert problem == "" and sorted(uid for uid, _ in found) == sorted([UID_G, UID_B, UID_E])
    assert all(Path(d).is_dir() and Path(d).is_relative_to(v2.cgroup_root) for _, d in found)

    v1 = build_tree(tmp_path / "v1", 1, driver)
    layout = collect.detect_layout(settings_for(v1))
    found, problem = collect.perf_event_pod_dirs(settings_for(v1), layout)
    assert found == [] and "perf_event hierarchy" in problem  # v1 without perf_event: said, not guessed
    for hierarchy in ("unified", "perf_event"):  # a hybrid host's unified one, then a v1 perf_event one (preferred)
        pod = v1.cgroup_root / hierarchy / pod_rel(driver, UID_B, "Burstable")
        pod.mkdir(parents=True)
        found, problem = collect.perf_event_pod_dirs(settings_for(v1), layout)
        assert (found, problem) == ([(UID_B, str(pod))], "")


async def test_a_round_without_a_perf_event_hierarchy_waits_no_window_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = build_tree(tmp_path, 1, "cgroupfs")

    async def no_window(seconds: float) -> None:
        raise AssertionError("nothing to count: no window")

    collector = CpiCollector(settings_for(tree), sleep=no_window, probe=lambda: None, events=SOFTWARE)
    with caplog.at_level(logging.INFO, logger="agent.cpi_collect"):
        assert await collector.round_once() == {}
        assert await collector.round_once() == {}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "CPI not counted for any pod: no kubepods in a perf_event hierarchy" in said[0]
    assert collector.stats.cpi_unavailable and collector.stats.cpi_rounds == 0


async def test_run_probes_once_then_counts_a_round_every_interval_until_cancelled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = build_tree(tmp_path, 2, "cgroupfs")
    now = [1_700_000_000.0]
    slept: list[float] = []
    probes: list[int] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
        if len(slept) == 6:
            raise asyncio.CancelledError

    def probe() -> None:
        probes.append(1)

    collector = CpiCollector(
        settings_for(tree, cpi_interval=60.0, cpi_window=10.0),
        clock=lambda: now[0],
        sleep=sleep,
        probe=probe,
        events=SOFTWARE,
        max_descriptors=0,  # not one pod's descriptors fit: rounds that count nobody, and so wait no window
    )
    with caplog.at_level(logging.INFO, logger="agent.cpi_collect"), pytest.raises(asyncio.CancelledError):
        await collector.run()
    assert probes == [1]
    assert slept == [60.0] * 6  # one round per interval, started on the interval's grid
    assert [r.getMessage() for r in caplog.records][:2] == [
        "node node-a.example: CPI on: task-clock and context-switches of every pod counted for 10 s every 60 s",
        f"node node-a.example: CPI counts 0 of 3 pods per round ({2 * len(cpus.online_cpus('/sys'))} descriptors "
        "each, at most 0 open); the others in turn",
    ]
