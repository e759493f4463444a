"""/readyz tells the truth through a leader election: `koordbus service nodemetric` on the three-server cluster
(tests/fixtures/nats_cluster.py) answers 503 naming the bus while KOORD_NODE has no leader (its SIGKILLed server
led it), and 200 again once a new leader is elected — without a restart. The time from the kill to ready again is
printed (with -s)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from bus import streams
from bus.cluster import free_port
from tests.faults.processes import KoordbusProcess, wait_for
from tests.fixtures.nats_cluster import REPLICAS, ClusterUnderTest

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

BOUND_SECONDS = 30.0


async def test_readyz_fails_while_the_stream_has_no_leader_and_recovers_without_a_restart(
    nats_cluster: ClusterUnderTest, tmp_path: Path
) -> None:
    cluster = nats_cluster.cluster
    port = free_port()
    arguments = ["service", "nodemetric", "--nats-url", cluster.url, "--port", str(port)]
    arguments += ["--nats-creds", str(nats_cluster.creds_file(tmp_path, user="nodemetric"))]
    arguments += ["--database-url", f"sqlite:///{tmp_path / 'nodemetric.db'}"]
    service = KoordbusProcess(
        arguments, log_path=tmp_path / "nodemetric.log", env={"KOORDBUS_STREAM_REPLICAS": str(REPLICAS)}
    )
    service.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

        async def readyz() -> tuple[int, str]:
            try:
                response = await http.get("/readyz")
            except httpx.TransportError:
                return 0, ""
            return response.status_code, response.text

        async def ready() -> bool:
            service.assert_alive()
            return (await readyz())[0] == 200

        try:
            await wait_for(ready, timeout=BOUND_SECONDS, what="ready before the kill")
            leader = await cluster.stream_leader(streams.KOORD_NODE)
            assert leader is not None
            pid = service.pid
            killed_at = time.monotonic()
            await cluster.kill(cluster.index_of(leader))
            during = await readyz()  # asked at once: no server leads KOORD_NODE (an election takes seconds)
            elected = await cluster.wait_for(lambda: cluster.stream_leader(streams.KOORD_NODE), timeout=BOUND_SECONDS)
            election = time.monotonic() - killed_at
            assert during[0] == 503 and "bus" in during[1], (during, election)
            await wait_for(ready, timeout=BOUND_SECONDS, what="ready again after the election")
            recovered = time.monotonic() - killed_at
            assert service.pid == pid  # the same process: not restarted
            figures = f"{elected} elected in {election:.1f} s, /readyz 200 again after {recovered:.1f} s"
            print(f"\n{leader} killed: {figures}")
        finally:
            service.kill()
