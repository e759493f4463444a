"""bus.retry: which publish failures the bus retries on a cluster, and its backoff; bus.cluster's config block."""

from __future__ import annotations

import pytest

from bus import retry
from bus.cluster import render_cluster_block


@pytest.mark.parametrize(
    ("code", "description"),
    [
        (10008, "JetStream system temporarily unavailable"),
        (10163, "expected last sequence per subject temporarily unavailable"),
        (10118, "stream is offline"),
        (None, "JetStream cluster can not handle request"),
        (10005, "no suitable peers for placement, peer offline"),
        (10158, "duplicate message id is in process"),
    ],
)
def test_what_a_cluster_says_while_it_elects_a_leader_is_temporary(code: int | None, description: str) -> None:
    assert retry.temporary_api_error(code, description)


@pytest.mark.parametrize(
    ("code", "description"),
    [(10071, "wrong last sequence: 4"), (10059, "stream not found"), (10052, "replicas > 1 not supported")],
)
def test_a_refusal_for_good_is_not(code: int, description: str) -> None:
    assert not retry.temporary_api_error(code, description)


def test_an_unanswered_publish_is_retried_only_when_its_msg_id_makes_a_second_copy_a_duplicate() -> None:
    assert retry.may_retry(retry.Failure.NO_RESPONDERS, has_msg_id=False)
    assert retry.may_retry(retry.Failure.UNAVAILABLE, has_msg_id=False)
    assert not retry.may_retry(retry.Failure.NO_ANSWER, has_msg_id=False)
    assert retry.may_retry(retry.Failure.NO_ANSWER, has_msg_id=True)


def test_the_backoff_grows_to_its_cap_and_jitter_only_shortens_it() -> None:
    delays = [retry.delay(n, jitter=0.0) for n in range(1, 9)]
    assert delays == sorted(delays)
    assert delays[0] == retry.BACKOFF_SECONDS[0] and delays[-1] == retry.BACKOFF_SECONDS[-1]
    assert retry.delay(0, jitter=0.0) == retry.BACKOFF_SECONDS[0]
    assert retry.delay(3, jitter=1.0) == pytest.approx(retry.BACKOFF_SECONDS[2] * (1 - retry.JITTER))
    assert retry.delay(3, jitter=7.0) == retry.delay(3, jitter=1.0)
    # Retries never outlast the bound by more than one delay.
    assert max(retry.BACKOFF_SECONDS) < retry.PUBLISH_RETRY_SECONDS


def test_a_members_routes_carry_the_route_users_credentials() -> None:
    block = render_cluster_block(
        name="koordbus", port=6222, routes=["127.0.0.1:6222", "127.0.0.1:6223"], user="route", password="kabc"
    )
    assert 'authorization { user: "route", password: "kabc", timeout: 5 }' in block
    assert 'routes: ["nats://route:kabc@127.0.0.1:6222", "nats://route:kabc@127.0.0.1:6223"]' in block
    assert "port: 6222" in block and 'name: "koordbus"' in block


def test_a_buss_publish_retries_are_exported_by_failure() -> None:
    import collections

    from prometheus_client import generate_latest

    from services.common import observe
    from services.common.metrics import new_registry

    class Counting:
        def __init__(self) -> None:
            self.publish_retries: collections.Counter[str] = collections.Counter({"no responders": 3})

    registry = new_registry()
    bus = Counting()
    observe.watch_bus(registry, bus)  # type: ignore[arg-type]
    observe.watch_bus(registry, bus)  # type: ignore[arg-type]  # once per registry
    bus.publish_retries["no answer"] += 1
    text = generate_latest(registry).decode()
    assert 'koordbus_bus_publish_retries_total{failure="no responders"} 3.0' in text
    assert 'koordbus_bus_publish_retries_total{failure="no answer"} 1.0' in text
    assert 'koordbus_bus_publish_retries_total{failure="temporarily unavailable"} 0.0' in text
