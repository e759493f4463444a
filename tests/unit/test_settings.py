"""Settings loading: defaults, then KOORDBUS_<SERVICE>_* and the shared KOORDBUS_* environment variables, then
explicit overrides."""

import dataclasses
from pathlib import Path

import pytest

from agent.settings import AgentSettings, QosSettings
from bus import streams
from koordbus.parts import migration_settings
from koordbus.settings import CommonSettings, EmbeddedStreamSettings
from services.api.settings import ApiSettings
from services.common.settings import SettingsError, env_names, load
from services.k8s.settings import K8sSettings
from services.loadaware.settings import LoadAwareSettings
from services.migration.settings import MigrationSettings
from services.natsauth.settings import NatsAuthSettings
from services.nodemetric.settings import NodeMetricSettings
from services.noderesource.settings import NodeResourceSettings
from services.quota.settings import QuotaSettings
from services.webhook.settings import WebhookSettings

SERVICE_SETTINGS: dict[type, str] = {
    NodeMetricSettings: "KOORDBUS_NODEMETRIC_",
    NodeResourceSettings: "KOORDBUS_NODERESOURCE_",
    QuotaSettings: "KOORDBUS_QUOTA_",
    MigrationSettings: "KOORDBUS_MIGRATION_",
    LoadAwareSettings: "KOORDBUS_LOADAWARE_",
    WebhookSettings: "KOORDBUS_WEBHOOK_",
    K8sSettings: "KOORDBUS_K8S_",
    NatsAuthSettings: "KOORDBUS_NATSAUTH_",
    ApiSettings: "KOORDBUS_API_",
    AgentSettings: "KOORDBUS_AGENT_",
    QosSettings: "KOORDBUS_AGENT_",
}
SHARED_SETTINGS = (CommonSettings, EmbeddedStreamSettings)
DIRECT = (
    "KOORDBUS_API_URL",
    "KOORDBUS_API_TOKEN",
    "KOORDBUS_API_TOKEN_FILE",
    "KOORDBUS_LOADAWARE_URL",
    "KOORDBUS_TOKEN_REVIEW_ROLES",
    "KOORDBUS_MIGRATION_ARGS_FILE",
)


def test_defaults_env_and_overrides_in_that_order() -> None:
    assert load(ApiSettings, env={}).port == 8080
    assert load(ApiSettings, env={"KOORDBUS_PORT": "9000"}).port == 9000
    assert load(ApiSettings, {"port": 7000}, env={"KOORDBUS_PORT": "9000"}).port == 7000
    assert load(ApiSettings, {"port": None}, env={"KOORDBUS_PORT": "9000"}).port == 9000


def test_tuples_and_floats_from_env() -> None:
    s = load(
        NodeMetricSettings,
        env={"KOORDBUS_AGGREGATE_DURATIONS_SECONDS": "60, 120", "KOORDBUS_STALE_AFTER_SECONDS": "90.5"},
    )
    assert s.aggregate_durations_seconds == (60, 120)
    assert s.stale_after_seconds == 90.5


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="KOORDBUS_PORT"):
        load(ApiSettings, env={"KOORDBUS_PORT": "eighty"})
    with pytest.raises(SettingsError, match="not a TCP port"):
        load(ApiSettings, env={"KOORDBUS_PORT": "70000"})
    with pytest.raises(SettingsError, match="node_memory_collect_policy"):
        load(NodeMetricSettings, {"node_memory_collect_policy": "everything"})


def test_up_caps_its_streams_from_the_environment() -> None:
    caps = load(EmbeddedStreamSettings, env={"KOORDBUS_NODEMETRIC_STREAM_MAX_BYTES": "-1"}).caps()
    assert caps == streams.SizeCaps(node=1536 * 2**20, nodemetric=-1, noderesource=256 * 2**20)
    assert load(EmbeddedStreamSettings, env={"KOORDBUS_NODE_STREAM_MAX_BYTES": "4096"}).caps().node == 4096
    for bad in ("0", "-2"):
        with pytest.raises(SettingsError, match="KOORDBUS_NODERESOURCE_STREAM_MAX_BYTES: expected a positive number"):
            load(EmbeddedStreamSettings, env={"KOORDBUS_NODERESOURCE_STREAM_MAX_BYTES": bad})
    with pytest.raises(SettingsError, match="KOORDBUS_NODE_STREAM_MAX_BYTES"):
        load(EmbeddedStreamSettings, env={"KOORDBUS_NODE_STREAM_MAX_BYTES": "1.5GiB"})


def test_migration_settings_come_from_the_args_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "args.yaml"
    path.write_text("maxMigratingPerNode: 1\nlowNodeLoad: {enabled: true}\n", encoding="utf-8")
    monkeypatch.setenv("KOORDBUS_INSTANCE", "migration-1")
    monkeypatch.setenv("KOORDBUS_CATCH_UP_TIMEOUT_SECONDS", "2.5")
    settings = migration_settings(str(path))
    assert settings.args.max_migrating_per_node == 1 and settings.low_node_load.enabled
    assert settings.instance == "migration-1" and settings.catch_up_timeout_seconds == 2.5
    assert migration_settings(None) == load(MigrationSettings)
    path.write_text("maxMigratingPerNode: lots\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"migration args: .*maxMigratingPerNode"):
        migration_settings(str(path))
    monkeypatch.setenv("KOORDBUS_STARTUP_TIMEOUT_SECONDS", "soon")
    with pytest.raises(SystemExit, match="KOORDBUS_STARTUP_TIMEOUT_SECONDS"):
        migration_settings(None)


def test_loadaware_settings_from_the_environment() -> None:
    settings = load(LoadAwareSettings, env={"KOORDBUS_ARGS_FILE": "/etc/args.yaml", "KOORDBUS_EXTENDER_PORT": "8443"})
    assert (settings.args_file, settings.extender_port, settings.tls) == ("/etc/args.yaml", 8443, False)
    with pytest.raises(SettingsError, match="tls_cert_file needs"):
        load(LoadAwareSettings, env={"KOORDBUS_TLS_CERT_FILE": "/tls/cert.pem"})


def test_the_webhook_needs_its_certificate_and_reads_its_port() -> None:
    with pytest.raises(SettingsError, match="tls_cert_file and tls_key_file are required"):
        load(WebhookSettings, env={})
    env = {"KOORDBUS_WEBHOOK_TLS_CERT_FILE": "/c", "KOORDBUS_TLS_KEY_FILE": "/k", "KOORDBUS_WEBHOOK_PORT": "8443"}
    settings = load(WebhookSettings, env=env)
    assert (settings.tls_cert_file, settings.tls_key_file, settings.webhook_port) == ("/c", "/k", 8443)
    assert env_names(WebhookSettings, "webhook_port") == ("KOORDBUS_WEBHOOK_PORT",)
    with pytest.raises(SettingsError, match="tls_reload_seconds must be positive"):
        load(WebhookSettings, {"tls_reload_seconds": 0}, env=env)
    users = "system:serviceaccount:koordbus:koordbus-koordbus-k8s, bridge-admin"
    quota_env = {**env, "KOORDBUS_WEBHOOK_QUOTA_MIRROR_USERS": users, "KOORDBUS_WEBHOOK_QUOTA_TIMEOUT_SECONDS": "5"}
    settings = load(WebhookSettings, env=quota_env)
    assert settings.quota_mirror_users == ("system:serviceaccount:koordbus:koordbus-koordbus-k8s", "bridge-admin")
    assert (settings.quota_timeout_seconds, load(WebhookSettings, env=env).quota_mirror_users) == (5.0, ())


def test_a_services_own_variable_wins_over_the_shared_one() -> None:
    env = {"KOORDBUS_QUOTA_INSTANCE": "quota-a", "KOORDBUS_INSTANCE": "shared"}
    assert load(QuotaSettings, env=env).instance == "quota-a"
    assert load(QuotaSettings, env={"KOORDBUS_INSTANCE": "shared"}).instance == "shared"  # the documented name
    assert load(QuotaSettings, {"instance": "flag"}, env=env).instance == "flag"  # overrides still win
    assert load(QuotaSettings, {"instance": None}, env=env).instance == "quota-a"


def test_services_in_one_process_read_their_own_values_of_the_same_field() -> None:
    """`koordbus up` builds every service's settings from one environment."""
    env = {
        "KOORDBUS_QUOTA_INSTANCE": "q",
        "KOORDBUS_NODEMETRIC_INSTANCE": "nm",
        "KOORDBUS_INSTANCE": "everyone-else",
        "KOORDBUS_QUOTA_STARTUP_TIMEOUT_SECONDS": "5",
        "KOORDBUS_STARTUP_TIMEOUT_SECONDS": "30",
        "KOORDBUS_NODERESOURCE_BATCH_SIZE": "64",
        "KOORDBUS_QUOTA_BATCH_SIZE": "128",
        "KOORDBUS_API_STALE_AFTER_SECONDS": "60",
        "KOORDBUS_STALE_AFTER_SECONDS": "90",
    }
    quota, nodemetric = load(QuotaSettings, env=env), load(NodeMetricSettings, env=env)
    noderesource, migration = load(NodeResourceSettings, env=env), load(MigrationSettings, env=env)
    assert (quota.instance, nodemetric.instance, noderesource.instance, migration.instance) == (
        "q",
        "nm",
        "everyone-else",
        "everyone-else",
    )
    assert (quota.startup_timeout_seconds, noderesource.startup_timeout_seconds) == (5.0, 30.0)
    assert (quota.batch_size, noderesource.batch_size) == (128, 64)
    assert load(ApiSettings, env=env).stale_after_seconds == 60.0
    assert nodemetric.stale_after_seconds == 90.0


def test_a_refused_value_names_the_variable_it_was_read_from() -> None:
    env = {"KOORDBUS_QUOTA_BATCH_SIZE": "many", "KOORDBUS_BATCH_SIZE": "512"}
    with pytest.raises(SettingsError, match=r"^KOORDBUS_QUOTA_BATCH_SIZE: expected a int"):
        load(QuotaSettings, env=env)
    assert load(NodeResourceSettings, env=env).batch_size == 512  # its neighbour is not affected
    with pytest.raises(SettingsError, match=r"must be positive \(from KOORDBUS_QUOTA_STARTUP_TIMEOUT_SECONDS\)"):
        load(
            QuotaSettings, env={"KOORDBUS_QUOTA_STARTUP_TIMEOUT_SECONDS": "0", "KOORDBUS_STARTUP_TIMEOUT_SECONDS": "9"}
        )
    with pytest.raises(SettingsError, match=r"must be positive \(from KOORDBUS_STARTUP_TIMEOUT_SECONDS\)"):
        load(QuotaSettings, env={"KOORDBUS_STARTUP_TIMEOUT_SECONDS": "0"})
    with pytest.raises(SettingsError, match=r"not a TCP port \(from KOORDBUS_API_PORT\)"):
        load(ApiSettings, env={"KOORDBUS_API_PORT": "70000"})
    with pytest.raises(SettingsError, match="KOORDBUS_AGENT_COLLECT_INTERVAL"):
        load(AgentSettings, {"node_name": "n1"}, env={"KOORDBUS_AGENT_COLLECT_INTERVAL": "-1"})


def test_every_service_has_its_prefix_and_no_name_means_two_things() -> None:
    """Each documented unprefixed name still reaches its field; no service's own name is another one's shared name."""
    owner: dict[str, tuple[type, str]] = {}
    for cls, prefix in SERVICE_SETTINGS.items():
        assert prefix == cls.ENV_PREFIX  # type: ignore[attr-defined]
        for field in dataclasses.fields(cls):
            names = env_names(cls, field.name)
            assert names[0].startswith(prefix) and names[-1] == "KOORDBUS_" + field.name.upper()
            for name in names:
                assert owner.setdefault(name, (cls, field.name))[1] == field.name, name
    for cls in SHARED_SETTINGS:
        for field in dataclasses.fields(cls):
            (name,) = env_names(cls, field.name)
            assert name == "KOORDBUS_" + field.name.upper()
            assert name not in owner or owner[name][1] == field.name, name
    # the variables the CLI reads itself (flags' defaults of clients and of the migration args file) mean nothing else
    for name in DIRECT:
        assert name not in owner, name
    # a field already named after its service keeps its one name
    assert env_names(ApiSettings, "api_tokens_file") == ("KOORDBUS_API_TOKENS_FILE",)
    assert env_names(NatsAuthSettings, "agent_service_account") == (
        "KOORDBUS_NATSAUTH_AGENT_SERVICE_ACCOUNT",
        "KOORDBUS_AGENT_SERVICE_ACCOUNT",
    )


def test_the_migration_args_file_is_migrations_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "args.yaml"
    path.write_text("maxMigratingPerNode: 3\n", encoding="utf-8")
    monkeypatch.setenv("KOORDBUS_MIGRATION_ARGS_FILE", str(path))
    monkeypatch.setenv("KOORDBUS_ARGS_FILE", str(tmp_path / "loadaware.yaml"))  # the extender's, never read here
    assert migration_settings(None).args.max_migrating_per_node == 3
    assert load(LoadAwareSettings).args_file == str(tmp_path / "loadaware.yaml")
    monkeypatch.setenv("KOORDBUS_LOADAWARE_ARGS_FILE", "/etc/own.yaml")
    assert load(LoadAwareSettings).args_file == "/etc/own.yaml"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"psi_suppress_threshold": 1.5}, "psi_suppress_threshold must be a stall ratio"),
        ({"psi_suppress_threshold": -0.1}, "psi_suppress_threshold must be a stall ratio"),
        ({"psi_suppress_step_percent": 0}, "psi_suppress_step_percent must be in"),
        ({"psi_suppress_step_percent": 150}, "psi_suppress_step_percent must be in"),
    ],
)
def test_the_psi_suppress_rule_settings_are_checked(fields: dict[str, float], message: str) -> None:
    assert QosSettings().psi_suppress_threshold == 0.0  # off by default
    with pytest.raises(ValueError, match=message):
        QosSettings(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topology_interval_seconds": 0}, "topology_interval_seconds must be a positive number of seconds"),
        ({"topology_refresh_seconds": -1}, "topology_refresh_seconds must be a positive number of seconds"),
        ({"topology_interval_seconds": 120, "topology_refresh_seconds": 60}, "must be between"),
        ({"topology_refresh_seconds": 7200}, "must be between topology_interval_seconds 60.0 and 3600.0"),
        ({"kubelet_root_dir": "var/lib/kubelet"}, "kubelet_root_dir must be an absolute path"),
    ],
)
def test_the_topology_report_settings_are_checked(fields: dict[str, object], message: str) -> None:
    defaults = AgentSettings(node_name="n1")
    assert (defaults.topology_report, defaults.kubelet_root_dir) == (True, "/var/lib/kubelet")
    assert (defaults.topology_interval_seconds, defaults.topology_refresh_seconds) == (60.0, 600.0)
    with pytest.raises(ValueError, match=message):
        AgentSettings(node_name="n1", **fields)  # type: ignore[arg-type]
    env = {"KOORDBUS_AGENT_TOPOLOGY_REPORT": "false", "KOORDBUS_KUBELET_ROOT_DIR": "/host/var/lib/kubelet"}
    loaded = load(AgentSettings, {"node_name": "n1"}, env=env)
    assert (loaded.topology_report, loaded.kubelet_root_dir) == (False, "/host/var/lib/kubelet")


def test_cpi_collection_is_off_by_default_and_its_window_fits_its_interval() -> None:
    default = AgentSettings(node_name="n1")
    assert (default.cpi_collect, default.cpi_interval, default.cpi_window) == (False, 60.0, 10.0)  # koordlet's
    env = {"KOORDBUS_AGENT_CPI_COLLECT": "true", "KOORDBUS_CPI_WINDOW": "5"}
    on = load(AgentSettings, {"node_name": "n1"}, env=env)
    assert on.cpi_collect and on.cpi_window == 5.0
    with pytest.raises(ValueError, match=r"cpi_window must be more than 0 seconds and at most cpi_interval \(60\)"):
        AgentSettings(node_name="n1", cpi_window=61.0)
    with pytest.raises(ValueError, match="cpi_window must be more than 0"):
        AgentSettings(node_name="n1", cpi_window=0.0)
    with pytest.raises(ValueError, match="and 3600"):
        AgentSettings(node_name="n1", cpi_interval=7200.0, cpi_window=4000.0)
    with pytest.raises(ValueError, match="cpi_interval must be a positive number of seconds"):
        AgentSettings(node_name="n1", cpi_interval=0.0)
