"""A service process that loses its NATS connection is not left silently dead (issue #19, point 3).

A real `koordbus service slo` process on a real nats-server with users. Its user is removed (the config reloaded
with SIGHUP, as an operator revoking a credential does): nats-server drops the connection and refuses every
reconnect. nats-py keeps trying; the process used to answer /healthz 200 all along. Now /healthz answers 503
naming the bus once the connection has been down past koordbus.runtime.BUS_LIVENESS_SECONDS (a supervisor restarts
the process), and 200 again once the user is back and the connection with it. (A client nats-py closes for good,
which it never reuses, makes the process exit non-zero: tests/integration/test_liveness_bus_lost.py.)
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from bus import auth, streams
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus import runtime
from tests.faults.processes import KoordbusProcess, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


async def test_a_service_refused_by_the_server_fails_healthz_past_the_bound_and_recovers(tmp_path: Path) -> None:
    service_user, admin = auth.issue_service("slo"), auth.issue_service("admin")
    server = EmbeddedNatsServer(
        tmp_path / "nats", port=free_port(), authorization=auth.render_authorization([service_user, admin])
    )
    await server.start()
    creds = tmp_path / "slo.creds"
    creds.write_text(auth.creds_json(service_user))
    port = free_port()
    process = KoordbusProcess(
        ["service", "slo", "--nats-url", server.url, "--nats-creds", str(creds), "--port", str(port)],
        log_path=tmp_path / "slo.log",
    )
    try:
        setup = await JetStreamBus.connect(server.url, name="setup", user=admin.user, password=admin.password)
        await setup.ensure_streams(streams.all_streams())
        await setup.close()
        process.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def ready() -> bool:
                process.assert_alive()
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(ready, timeout=60, what="koordbus service slo ready")
        # revoke the service's user: the reloaded server drops its connection and refuses it from then on
        config = server.data_dir / "nats-server.conf"
        granted = config.read_text()
        both, admin_only = auth.render_authorization([service_user, admin]), auth.render_authorization([admin])
        assert both in granted
        config.write_text(granted.replace(both, admin_only))
        os.kill(server.pid, signal.SIGHUP)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def healthz(status: int) -> bool:
                process.assert_alive()
                return (await http.get("/healthz")).status_code == status

            await wait_for(lambda: healthz(503), timeout=runtime.BUS_LIVENESS_SECONDS + 15, what="/healthz 503")
            failures = (await http.get("/healthz")).json()["failures"]
            assert failures["bus"].startswith("the NATS connection has been down for"), failures
            # the user restored: nats-py reconnects and the process is alive again
            config.write_text(granted)
            os.kill(server.pid, signal.SIGHUP)
            await wait_for(lambda: healthz(200), timeout=20, what="/healthz 200 after the reconnect")
            assert (await http.get("/readyz")).status_code == 200
    finally:
        process.kill()
        await server.stop()
