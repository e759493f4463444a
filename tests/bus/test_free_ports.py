"""bus.cluster.free_ports: ports free when picked, distinct, and outside the kernel's ephemeral range — where an
outgoing connection can take a port as its local one between the pick and the server's bind (a `koordbus up` started
on a port picked by binding port 0 exited with uvicorn's code 3 once, under two test suites at a time)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bus import cluster


def ephemeral_range() -> range:
    low, high = (int(bound) for bound in cluster.EPHEMERAL_RANGE_FILE.read_text().split())
    return range(low, high + 1)


def test_the_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    ports = cluster.free_ports(40)
    assert len(set(ports)) == 40
    assert all(cluster.PICK_FROM <= port < 65536 and port not in ephemeral_range() for port in ports), ports
    held = []
    try:
        for port in ports:  # all of them at once
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in held:
            s.close()


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    listening = [socket.socket() for _ in range(3)]
    try:
        for s in listening:
            s.bind(("127.0.0.1", 0))
            s.listen()
        busy = [s.getsockname()[1] for s in listening]
        # the only candidates: the busy ports and one free one, found among them
        free = cluster.free_ports(1)[0]
        monkeypatch.setattr(cluster, "_candidate_ports", lambda: (*busy, free))
        assert cluster.free_ports(1) == [free]
    finally:
        for s in listening:
            s.close()


def test_without_room_outside_the_ephemeral_range_the_kernel_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "ip_local_port_range"
    whole.write_text("1024\t65535\n")
    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE_FILE", whole)
    cluster._candidate_ports.cache_clear()
    try:
        assert cluster._candidate_ports() == ()
        ports = cluster.free_ports(3)
        assert len(set(ports)) == 3 and all(1024 <= port <= 65535 for port in ports)
    finally:
        monkeypatch.undo()
        cluster._candidate_ports.cache_clear()
