"""Shared pytest wiring: fixtures for a real nats-server and real databases live in tests/fixtures."""

pytest_plugins = ["tests.fixtures.nats", "tests.fixtures.nats_cluster", "tests.fixtures.db", "tests.fixtures.kube"]
