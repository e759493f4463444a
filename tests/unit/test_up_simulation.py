"""`koordbus up --simulate-nodes` wiring without a bus (koordbus.up_simulation): the migration args file it writes
for the simulated cluster, and the API token the simulated cluster imports its quotas with."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from koordbus import up_simulation
from koordbus.api import API_TOKEN_FILE
from koordbus.simcluster import descheduling
from services.api.settings import ApiSettings


def _args(*, nodes: int = 3, kubeconfig: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(simulate_nodes=nodes, kubeconfig=kubeconfig)


def test_the_migration_args_are_written_only_for_a_simulated_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KOORDBUS_MIGRATION_ARGS_FILE", raising=False)
    written = up_simulation.migration_args(_args(), tmp_path)
    assert written == str(tmp_path / up_simulation.SIMULATION_MIGRATION_ARGS_FILE)
    assert Path(written).read_text() == descheduling.MIGRATION_ARGS
    assert up_simulation.migration_args(_args(nodes=0), tmp_path) is None
    assert up_simulation.migration_args(_args(kubeconfig="kubeconfig"), tmp_path) is None
    monkeypatch.setenv("KOORDBUS_MIGRATION_ARGS_FILE", "/elsewhere.yaml")
    assert up_simulation.migration_args(_args(), tmp_path) is None


def test_the_simulated_cluster_takes_ups_token_or_the_first_admin_of_the_token_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / API_TOKEN_FILE).write_text("generated\n")
    assert up_simulation.api_token(ApiSettings(), tmp_path) == "generated"
    assert up_simulation.api_token(ApiSettings(auth_enabled=False), tmp_path) == ""
    tokens = tmp_path / "tokens"
    tokens.write_text("# admin admin\nreader viewer\nquotas quota-admin ops\nroot admin\n")
    assert up_simulation.api_token(ApiSettings(api_tokens_file=str(tokens)), tmp_path) == "quotas"
    tokens.write_text("reader viewer\n")
    with caplog.at_level(logging.WARNING, logger="koordbus.up_simulation"):
        assert up_simulation.api_token(ApiSettings(api_tokens_file=str(tokens)), tmp_path) == ""
    assert f"no admin or quota-admin token in {tokens}:" in caplog.text
