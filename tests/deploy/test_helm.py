"""The Helm chart (deploy/helm/koordbus) rendered by Helm's own engine (helm-python-sdk) with its defaults and with a
production-like values file; every object validated against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: no unknown fields), and what the chart promises checked on the objects."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from agent.settings import AgentSettings, QosSettings
from bus import auth, server
from koordbus import cli
from services.common import observe
from services.common import settings as settings_loader

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "koordbus"
KUBERNETES = "1.30.0"
DEFAULTS: dict[str, Any] = {"database": {"url": "postgresql://koordbus:secret@postgres:5432/koordbus"}}
PRODUCTION: dict[str, Any] = {
    "image": {"repository": "registry.example.com/koordbus", "tag": "0.1.0", "pullPolicy": "Always"},
    "nats": {"url": "nats://nats.messaging:4222", "bundled": {"enabled": False}},
    "database": {"existingSecret": "koordbus-database"},
    "api": {"replicas": 3, "service": {"type": "LoadBalancer"}},
    "services": {"nodemetric": {"replicas": 2}, "noderesource": {"replicas": 2}, "quota": {"replicas": 2}},
    "agent": {"qosMode": "apply", "evictFeatures": "BEMemoryEvict,BECPUEvict", "resctrl": True},
    "podDisruptionBudget": {"minAvailable": 2},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = helm_python.Chart.load(CHART).render(values, name="prod", namespace="koordbus")
    objects = [obj for text in manifests.values() for obj in yaml.safe_load_all(text) if obj]
    assert objects, "the chart rendered nothing"
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("values", [DEFAULTS, PRODUCTION], ids=["defaults", "production"])
def test_every_object_is_valid_kubernetes(values: dict[str, Any]) -> None:
    for obj in render(values):
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_the_defaults_run_every_service_the_agent_nats_and_the_migration_hook() -> None:
    objects = render(DEFAULTS)
    deployments = by_kind(objects, "Deployment")
    components = {"nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "api"}
    assert {f"prod-koordbus-{c}" for c in (*components, "natsauth")} == set(deployments)
    for deployment in (deployments[f"prod-koordbus-{c}"] for c in components):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["KOORDBUS_NATS_URL"]["value"] == "nats://prod-koordbus-nats:4222"
        assert env["KOORDBUS_STREAM_REPLICAS"]["value"] == "3"
        assert env["KOORDBUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "prod-koordbus-database"
        assert container["securityContext"]["runAsNonRoot"] and container["readinessProbe"]
    nats = by_kind(objects, "StatefulSet")["prod-koordbus-nats"]
    assert nats["spec"]["replicas"] == 3
    config = by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    assert "sync_interval: always" in config and len(re.findall(r"\$ROUTE_\d", config)) == 3
    job = by_kind(objects, "Job")["prod-koordbus-db-upgrade"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]


def test_only_the_bridge_holds_cluster_rights_and_the_agent_only_its_kubelets() -> None:
    objects = render(DEFAULTS)
    bindings = by_kind(objects, "ClusterRoleBinding")
    subjects = {s["name"] for b in bindings.values() for s in b["subjects"]}
    assert subjects == {"prod-koordbus-k8s", "prod-koordbus-agent", "prod-koordbus-natsauth"}
    agent_rules = by_kind(objects, "ClusterRole")["prod-koordbus-agent"]["rules"]
    assert agent_rules == [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]
    callout_rules = by_kind(objects, "ClusterRole")["prod-koordbus-natsauth"]["rules"]
    review = {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    assert callout_rules == [review]
    for name, deployment in by_kind(objects, "Deployment").items():
        automount = deployment["spec"]["template"]["spec"].get("automountServiceAccountToken", True)
        assert automount is (name in ("prod-koordbus-k8s", "prod-koordbus-natsauth")), name


def test_the_agent_mounts_only_what_it_needs_read_only_unless_it_applies() -> None:
    for values, writable in ((DEFAULTS, False), (PRODUCTION, True)):
        agent = by_kind(render(values), "DaemonSet")["prod-koordbus-agent"]["spec"]["template"]["spec"]
        assert agent["hostPID"] is False
        paths = {v["name"]: v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
        expected = {
            "proc": "/proc",
            "cgroup": "/sys/fs/cgroup",
            "state": "/var/lib/koordbus",
            "kubelet": "/var/lib/kubelet",
        }
        assert paths == ({**expected, "resctrl": "/sys/fs/resctrl"} if writable else expected)
        mounts = {m["name"]: m.get("readOnly", False) for m in agent["containers"][0]["volumeMounts"]}
        assert mounts["proc"] is True and mounts["cgroup"] is (not writable) and mounts["kubelet"] is True
        # the topology report reads the kubelet's CPU manager state where the host's kubelet directory is mounted
        kubelet_mount = next(m for m in agent["containers"][0]["volumeMounts"] if m["name"] == "kubelet")
        env = {e["name"]: e["value"] for e in agent["containers"][0]["env"] if "value" in e}
        agent_settings = settings_loader.load(AgentSettings, {"node_name": "n1"}, env=env)
        assert agent_settings.kubelet_root_dir == kubelet_mount["mountPath"]
        args = agent["containers"][0]["args"]
        assert ("--apply" if writable else "--dry-run") in args


def _agent_container(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The agent DaemonSet's pod spec and container as `values` render them."""
    spec = by_kind(render(values), "DaemonSet")["prod-koordbus-agent"]["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def _kubelet_settings(container: dict[str, Any]) -> QosSettings:
    """What `koordbus agent` makes of the container's arguments and literal environment (as run_agent does)."""
    args = cli.build_parser().parse_args(container["args"])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    overrides = {
        "kubelet_pods_url": args.kubelet_pods_url,
        "kubelet_token_file": args.kubelet_token_file,
        "kubelet_ca_file": args.kubelet_ca_file,
        "kubelet_insecure": args.kubelet_insecure,
    }
    return settings_loader.load(QosSettings, overrides, env=env)


def test_the_agent_counts_cpi_only_when_asked_and_then_may_open_perf_events() -> None:
    _spec, plain = _agent_container(DEFAULTS)
    assert "--cpi" not in plain["args"]
    assert plain["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "KILL"]}
    values = {**DEFAULTS, "agent": {"cpi": True}}
    _spec, counting = _agent_container(values)
    assert cli.build_parser().parse_args(counting["args"]).cpi_collect is True
    assert counting["securityContext"]["capabilities"]["add"] == ["DAC_OVERRIDE", "KILL", "PERFMON"]
    daemonset = by_kind(render(values), "DaemonSet")["prod-koordbus-agent"]
    kubernetes_validate.validate(daemonset, KUBERNETES, strict=True)


SA = "/var/run/secrets/kubernetes.io/serviceaccount"


def test_the_agent_reads_its_kubelet_with_the_token_and_tls_the_values_give() -> None:
    """Each case: agent values → (token file, CA file, insecure) the agent ends up with; objects valid."""
    cases: list[tuple[dict[str, Any], tuple[str, str, bool]]] = [
        ({}, (f"{SA}/token", "", True)),  # the defaults: kubelets serve a self-signed certificate
        ({"kubeletInsecure": False, "kubeletCaFile": f"{SA}/ca.crt"}, (f"{SA}/token", f"{SA}/ca.crt", False)),
        (
            {"kubeletInsecure": False, "kubeletCaConfigMap": "kubelet-ca"},
            (f"{SA}/token", "/etc/koordbus/kubelet-ca/ca.crt", False),
        ),
        (
            {"kubeletPodsUrl": "http://$(NODE_IP):10255/pods", "kubeletTokenFile": "", "kubeletInsecure": False},
            ("", "", False),
        ),  # the read-only port: no token, no TLS
    ]
    for agent, expected in cases:
        values = {**DEFAULTS, "agent": agent}
        for obj in render(values):
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        spec, container = _agent_container(values)
        assert not [e for e in container["env"] if e["name"].startswith("KOORDBUS_KUBELET_")], agent
        settings = _kubelet_settings(container)
        got = (settings.kubelet_token_file, settings.kubelet_ca_file, settings.kubelet_insecure)
        assert got == expected, (agent, container["args"])
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        if agent.get("kubeletCaConfigMap"):
            mount = {"name": "kubelet-ca", "mountPath": "/etc/koordbus/kubelet-ca", "readOnly": True}
            assert mounts["kubelet-ca"] == mount
            assert volumes["kubelet-ca"]["configMap"] == {
                "name": "kubelet-ca",
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            }
        else:
            assert "kubelet-ca" not in mounts and "kubelet-ca" not in volumes


def test_a_kubelet_ca_with_kubelet_insecure_is_refused_with_a_clear_message() -> None:
    for agent in ({"kubeletCaFile": f"{SA}/ca.crt"}, {"kubeletCaConfigMap": "kubelet-ca"}):
        with pytest.raises(Exception, match=r"agent.kubeletCaFile \(.+\) and agent.kubeletInsecure exclude each other"):
            render({**DEFAULTS, "agent": agent})


def test_production_values_use_the_external_nats_and_database() -> None:
    objects = render(PRODUCTION)
    assert "prod-koordbus-nats" not in by_kind(objects, "StatefulSet")
    assert "prod-koordbus-database" not in by_kind(objects, "Secret")
    api = by_kind(objects, "Deployment")["prod-koordbus-api"]
    env = {e["name"]: e for e in api["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOORDBUS_NATS_URL"]["value"] == "nats://nats.messaging:4222"
    assert env["KOORDBUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "koordbus-database"
    assert by_kind(objects, "PodDisruptionBudget")["prod-koordbus-api"]["spec"]["minAvailable"] == 2


def test_a_missing_database_is_refused_with_a_clear_message() -> None:
    with pytest.raises(Exception, match=r"database.url \(or database.existingSecret, or database.bundled.enabled\)"):
        render({})
    with pytest.raises(Exception, match=r"database.bundled.password is required"):
        render({"database": {"bundled": {"enabled": True}}})


def test_a_bundled_postgresql_is_valid_and_wired() -> None:
    objects = render({"database": {"bundled": {"enabled": True, "password": "s3cret/+"}}})
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert by_kind(objects, "StatefulSet")["prod-koordbus-postgresql"]["spec"]["replicas"] == 1
    secret = by_kind(objects, "Secret")["prod-koordbus-database"]["stringData"]
    assert secret["database-url"] == "postgresql://koordbus:s3cret%2F%2B@prod-koordbus-postgresql:5432/koordbus"
    assert secret["postgres-password"] == "s3cret/+"


def test_helm_lint_finds_nothing_wrong() -> None:
    report = helm_python.lint(CHART, values=DEFAULTS)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > 1] == []  # 1: INFO (e.g. "icon is recommended")


def test_the_log_format_reaches_every_koordbus_container() -> None:
    for log_format in ("text", "json"):
        objects = render({**DEFAULTS, "logFormat": log_format})
        workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "Job")]
        containers = [
            c for o in workloads for c in o["spec"]["template"]["spec"]["containers"] if "koordbus" in c["image"]
        ]
        # six services, the API, the agent, the NATS auth callout, the migration Job and the NATS Secret's Job
        assert len(containers) == 11
        for container in containers:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["KOORDBUS_LOG_FORMAT"] == log_format, container["name"]


def test_monitoring_objects_and_the_dashboard_use_metrics_that_exist() -> None:
    objects = render({**DEFAULTS, "monitoring": {"serviceMonitor": True, "grafanaDashboard": True}})
    core = [o for o in objects if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    for obj in core:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    monitor = by_kind(objects, "ServiceMonitor")["prod-koordbus"]
    assert monitor["spec"]["endpoints"][0]["port"] == "http"  # every koordbus Service names its port http
    services = by_kind(objects, "Service")
    assert all(any(p["name"] == "http" for p in s["spec"]["ports"]) for n, s in services.items() if "nats" not in n)
    assert by_kind(objects, "PodMonitor")["prod-koordbus-agent"]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    dashboard = json.loads(by_kind(objects, "ConfigMap")["prod-koordbus-dashboard"]["data"]["koordbus.json"])
    charted = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"koordbus_[a-z0-9_]+", target["expr"])
    }
    names = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in charted}
    source = "\n".join(p.read_text() for d in ("services", "agent") for p in (ROOT / d).rglob("*.py"))
    consumer_families = {family.name: family.type for family in observe.ConsumerStatsCollector().describe()}
    defined = (
        set(re.findall(r'"(koordbus_[a-z0-9_]+)"', source))
        | set(consumer_families)
        | {f"koordbus_agent_{n}" for n in re.findall(r'^    "([a-z_]+)": "', source, flags=re.M)}
    )
    defined |= {"koordbus_agent_slo_revision", "koordbus_agent_slo_silent_seconds"}
    assert names and names <= defined, names - defined
    # A series suffix must fit the family's type: _bucket only of a histogram, _sum/_count of a histogram or summary,
    # _total of a counter; a counter or histogram is never charted by its bare name.
    kinds = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}
    constructed = r'\b(Counter|Gauge|Histogram|Summary)(?:MetricFamily)?\(\s*f?"(koordbus_[a-z0-9_]+)"'
    typed = {name: kinds[kind] for kind, name in re.findall(constructed, source)} | consumer_families
    assert {"koordbus_consumer_handle_seconds", "koordbus_api_request_seconds"} <= {
        name for name, kind in typed.items() if kind == "histogram"
    }
    for name in sorted(charted):
        base, _, suffix = name.rpartition("_")
        kind = typed.get(base) if suffix in ("total", "bucket", "sum", "count") else typed.get(name)
        match suffix:
            case "bucket":
                assert kind == "histogram", f"{name}: {base} is a {kind}, not a histogram"
            case "sum" | "count" if base in typed:
                assert kind in ("histogram", "summary"), f"{name}: {base} is a {kind}"
            case "total" if base in typed:
                assert kind == "counter", f"{name}: {base} is a {kind}, not a counter"
            case _ if name in typed:
                assert kind not in ("counter", "histogram"), f"{name} is a {kind}: chart one of its series"
    assert "prod-koordbus-dashboard" not in by_kind(render(DEFAULTS), "ConfigMap")  # off unless asked for


@pytest.mark.parametrize("service", ["nodemetric", "noderesource"])
def test_scaled_out_partitioned_replicas_get_an_instance_name_and_a_single_one_does_not(service: str) -> None:
    def instance_env(replicas: int) -> list[dict[str, Any]]:
        values = {**DEFAULTS, "services": {service: {"replicas": replicas}}}
        deployment = by_kind(render(values), "Deployment")[f"prod-koordbus-{service}"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert deployment["spec"]["replicas"] == replicas
        return [e for e in container["env"] if e["name"] == "KOORDBUS_INSTANCE"]

    assert instance_env(1) == []
    (env,) = instance_env(3)
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the pod name joins the members


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_nats_identities_are_wired_for_every_process() -> None:
    objects = render(DEFAULTS)
    secret = "prod-koordbus-nats-auth"
    users = ["api", "k8s", "migration", "nodemetric", "noderesource", "quota", "slo"]
    config = by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    assert "auth_callout" in config and "issuer: $ISSUER_PUBLIC_KEY" in config and "jetstream: enabled" in config
    for user in users:
        assert f'{{user: "service-{user}", password: $PASSWORD_{user.upper()}}}' in config
    nats_env = _env(by_kind(objects, "StatefulSet")["prod-koordbus-nats"]["spec"]["template"]["spec"]["containers"][0])
    for user in ("natsauth", *users):
        assert nats_env[f"PASSWORD_{user.upper()}"] == {"secretKeyRef": {"name": secret, "key": f"{user}-password"}}
    assert nats_env["ISSUER_PUBLIC_KEY"] == {"secretKeyRef": {"name": secret, "key": "issuer-public-key"}}

    deployments = by_kind(objects, "Deployment")
    for user in (*users, "natsauth"):
        pod = deployments[f"prod-koordbus-{user}"]["spec"]["template"]["spec"]
        assert _env(pod["containers"][0])["KOORDBUS_NATS_CREDS"] == "/etc/koordbus/nats/creds.json"
        (volume,) = [v for v in pod["volumes"] if v["name"] == "nats-creds"]
        assert volume["secret"]["secretName"] == secret
        assert {"key": f"{user}.creds.json", "path": "creds.json"} in volume["secret"]["items"]

    callout = deployments["prod-koordbus-natsauth"]["spec"]["template"]["spec"]
    callout_env = _env(callout["containers"][0])
    agent = by_kind(objects, "DaemonSet")["prod-koordbus-agent"]["spec"]["template"]["spec"]
    assert callout_env["KOORDBUS_AGENT_SERVICE_ACCOUNT"] == f"koordbus:{agent['serviceAccountName']}"
    (projected,) = [v["projected"] for v in agent["volumes"] if v["name"] == "nats-token"]
    token = projected["sources"][0]["serviceAccountToken"]
    assert token["audience"] == callout_env["KOORDBUS_TOKEN_AUDIENCE"] == "koordbus-nats"
    (mount,) = [m for m in agent["containers"][0]["volumeMounts"] if m["name"] == "nats-token"]
    assert _env(agent["containers"][0])["KOORDBUS_NATS_TOKEN_FILE"] == f"{mount['mountPath']}/{token['path']}"

    jobs = by_kind(objects, "Job")
    job = jobs["prod-koordbus-nats-auth-secret"]
    weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(jobs["prod-koordbus-db-upgrade"]["metadata"]["annotations"]["helm.sh/hook-weight"])
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["creds", "ensure-cluster-secret", secret]
    assert f"--services=natsauth,{','.join(users)}" in args
    role = by_kind(objects, "Role")["prod-koordbus-nats-auth-secret"]
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret],
                                "verbs": ["get", "update"]}  # fmt: skip


def _nats_environment(objects: list[dict[str, Any]], secret_data: dict[str, str], pod: str) -> dict[str, str]:
    """The environment the kubelet gives pod `pod` of the NATS StatefulSet: Secret keys from `secret_data`, the pod's
    name, and `$(VAR)` references in values expanded as Kubernetes does."""
    container = by_kind(objects, "StatefulSet")["prod-koordbus-nats"]["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for entry in container["env"]:
        source = entry.get("valueFrom", {})
        if "secretKeyRef" in source:
            env[entry["name"]] = secret_data[source["secretKeyRef"]["key"]]
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            env[entry["name"]] = pod
        else:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], entry["value"])
    return env


def test_the_rendered_nats_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    """nats-server itself parses the chart's config, its passwords, issuer and routes from the environment as the
    StatefulSet passes them (values as `koordbus creds ensure-cluster-secret` makes them)."""
    objects = render(DEFAULTS)
    config = by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    users = ["natsauth", "api", "k8s", "migration", "nodemetric", "noderesource", "slo", "quota"]
    data = auth.cluster_secret_additions({}, services=users, issuer_random=bytes(32))
    env = _nats_environment(objects, data, "prod-koordbus-nats-0")
    (tmp_path / "nats.conf").write_text(config.replace("store_dir: /data", f"store_dir: {tmp_path / 'data'}"))

    def check(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        command = [str(server.find_binary()), "-c", str(tmp_path / "nats.conf"), "-t"]
        return subprocess.run(command, env=extra_env, capture_output=True, text=True, timeout=30, check=False)

    accepted = check(env)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    refused = check({k: v for k, v in env.items() if k != "ISSUER_PUBLIC_KEY"})  # the check can fail
    assert refused.returncode != 0
    assert check({k: v for k, v in env.items() if k != "ROUTE_1"}).returncode != 0  # the routes are read too


def test_the_nats_routes_are_authenticated_and_the_monitoring_port_stays_in_the_pod() -> None:
    objects = render(DEFAULTS)
    config = by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    cluster = config[config.index("cluster {") :]
    assert "user: route" in cluster and "password: $ROUTE_PASSWORD" in cluster
    assert all(f"$ROUTE_{i}" in cluster for i in range(3)) and "nats://" not in cluster  # each URL with credentials
    data = {auth.ROUTE_PASSWORD_KEY: "kroute", auth.ISSUER_PUBLIC_KEY_KEY: "A"} | {
        auth.password_key(u): "k" for u in ("natsauth", "api", "k8s", "migration", "nodemetric", "noderesource",
                                            "slo", "quota")
    }  # fmt: skip
    env = _nats_environment(objects, data, "prod-koordbus-nats-1")
    assert env["ROUTE_2"] == "nats://route:kroute@prod-koordbus-nats-2.prod-koordbus-nats-cluster:6222"
    assert 'http: "127.0.0.1:8222"' in config and "http_port" not in config
    pod = by_kind(objects, "StatefulSet")["prod-koordbus-nats"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "monitor" not in {p["name"] for p in container["ports"]}
    assert container["readinessProbe"]["exec"]["command"][-1] == "http://127.0.0.1:8222/healthz?js-enabled-only=true"

    exposed = render({**DEFAULTS, "nats": {"bundled": {"monitoring": {"expose": True}}}})
    config = by_kind(exposed, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    assert 'http: "0.0.0.0:8222"' in config
    container = by_kind(exposed, "StatefulSet")["prod-koordbus-nats"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "monitor", "containerPort": 8222} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["port"] == "monitor"
    for obj in exposed:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)

    single = render({**DEFAULTS, "nats": {"bundled": {"replicas": 1}}})
    assert "cluster {" not in by_kind(single, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]


def test_the_nats_image_is_the_version_the_tests_run() -> None:
    image = by_kind(render(DEFAULTS), "StatefulSet")["prod-koordbus-nats"]["spec"]["template"]["spec"]["containers"]
    tag = image[0]["image"].rpartition(":")[2]
    version = subprocess.run(
        [str(server.find_binary()), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()  # "nats-server: v2.15.1"
    assert tag == f"{version.rpartition('v')[2]}-alpine", (tag, version)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["nats"]["image"] == image[0]["image"]


def test_nats_auth_off_or_with_an_existing_secret() -> None:
    objects = render({**DEFAULTS, "nats": {"auth": {"enabled": False}}})
    assert "auth_callout" not in by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    assert "prod-koordbus-natsauth" not in by_kind(objects, "Deployment")
    assert "prod-koordbus-nats-auth-secret" not in by_kind(objects, "Job")
    for deployment in by_kind(objects, "Deployment").values():
        assert "KOORDBUS_NATS_CREDS" not in _env(deployment["spec"]["template"]["spec"]["containers"][0])
    agent = by_kind(objects, "DaemonSet")["prod-koordbus-agent"]["spec"]["template"]["spec"]
    assert "KOORDBUS_NATS_TOKEN_FILE" not in _env(agent["containers"][0])

    objects = render({**DEFAULTS, "nats": {"auth": {"existingSecret": "my-nats-identities"}}})
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert "prod-koordbus-nats-auth-secret" not in by_kind(objects, "Job")
    callout = by_kind(objects, "Deployment")["prod-koordbus-natsauth"]["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in callout["volumes"]] == ["my-nats-identities"]


def test_the_loadaware_extender_is_wired_for_kube_scheduler() -> None:
    """Opt-in: its Deployment reads the args from the values, the ConfigMap carries the KubeSchedulerConfiguration
    snippet that registers it (verbs, weight, nodeCacheCapable, ignorable), and it gets a NATS identity."""
    from services.loadaware.args import load_args

    values = {
        **DEFAULTS,
        "services": {"loadaware": {"enabled": True}},
        "loadaware": {"args": {"usageThresholds": {"cpu": 70}, "prodUsageThresholds": {"cpu": 50}}},
    }
    objects = render(values)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    data = by_kind(objects, "ConfigMap")["prod-koordbus-loadaware"]["data"]
    args = load_args(data["args.yaml"])
    assert args.usage_thresholds == {"cpu": 70} and args.prod_usage_thresholds == {"cpu": 50}
    config = yaml.safe_load(data["scheduler-config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]
    assert extender == {
        "urlPrefix": "http://prod-koordbus-loadaware.koordbus.svc:9090", "filterVerb": "filter",
        "prioritizeVerb": "prioritize", "weight": 1, "enableHTTPS": False, "httpTimeout": "1s",
        "nodeCacheCapable": True, "ignorable": True,
    }  # fmt: skip
    service = by_kind(objects, "Service")["prod-koordbus-loadaware"]
    assert service["spec"]["ports"][0]["port"] == 9090
    pod = by_kind(objects, "Deployment")["prod-koordbus-loadaware"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["service", "loadaware", "--port", "9090"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert f"{mounts['loadaware-args']}/args.yaml" == _env(container)["KOORDBUS_ARGS_FILE"]
    nats = by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    assert '{user: "service-loadaware", password: $PASSWORD_LOADAWARE}' in nats
    assert not any(o["metadata"]["name"].endswith("-loadaware") for o in render(DEFAULTS))
    assert _env(container)["KOORDBUS_BIND_TIMEOUT_SECONDS"] == "0.8"


def test_the_webhook_is_opt_in_serves_its_certificate_and_the_bridge_reads_what_it_needs() -> None:
    values = {
        **DEFAULTS,
        "services": {"webhook": {"enabled": True, "replicas": 2}},
        "webhook": {"tls": {"secretName": "webhook-serving", "caBundle": "Y2E="}},  # configurations: test_helm_webhook
    }
    objects = render(values)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    pod = by_kind(objects, "Deployment")["prod-koordbus-webhook"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["service", "webhook", "--port", "9090"]
    env = _env(container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["KOORDBUS_WEBHOOK_TLS_CERT_FILE"] == f"{mounts['webhook-tls']}/tls.crt"
    assert env["KOORDBUS_WEBHOOK_TLS_KEY_FILE"] == f"{mounts['webhook-tls']}/tls.key"
    assert env["KOORDBUS_WEBHOOK_PORT"] == "9443" and env["KOORDBUS_WEBHOOK_SKIP_MUTATING_RESOURCES"] == "false"
    # the bridge's ServiceAccount, whose ElasticQuota writes are the mirror's (they pass without a command)
    bridge = by_kind(objects, "Deployment")["prod-koordbus-k8s"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert env["KOORDBUS_WEBHOOK_QUOTA_MIRROR_USERS"] == f"system:serviceaccount:koordbus:{bridge}"
    assert env["KOORDBUS_INSTANCE"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # replicas each keep the view
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "webhook-serving"
    assert {"name": "webhook", "containerPort": 9443} in container["ports"]
    ports = by_kind(objects, "Service")["prod-koordbus-webhook"]["spec"]["ports"]
    assert {"name": "webhook", "port": 443, "targetPort": "webhook"} in ports
    assert pod["automountServiceAccountToken"] is False  # it reads the cluster through the bridge's events
    nats = by_kind(objects, "ConfigMap")["prod-koordbus-nats"]["data"]["nats.conf"]
    assert '{user: "service-webhook", password: $PASSWORD_WEBHOOK}' in nats
    assert not any(o["metadata"]["name"].endswith("-webhook") for o in render(DEFAULTS))
    # no Secret of the user's: the one the chart's hook Job makes (or cert-manager: tests/deploy/test_helm_webhook.py)
    made = by_kind(render({**DEFAULTS, "services": {"webhook": {"enabled": True}}}), "Deployment")
    made = made["prod-koordbus-webhook"]
    (volume,) = [v for v in made["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "prod-koordbus-webhook-tls"
    rules = by_kind(render(DEFAULTS), "ClusterRole")["prod-koordbus-k8s"]["rules"]
    readable = {
        (g, r) for rule in rules if "watch" in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert {("", "namespaces"), ("config.koordinator.sh", "clustercolocationprofiles")} <= readable
    assert ("scheduling.k8s.io", "priorityclasses") in readable


def test_the_loadaware_extender_admits_only_kube_scheduler() -> None:
    """Issue #19 point 5: a NetworkPolicy lets only kube-scheduler's pods reach the verbs; with loadaware.tls the
    verbs move to an HTTPS port served to client certificates from the Secret's CA, and the snippet tells
    kube-scheduler to call it over HTTPS with its client certificate (tlsConfig)."""
    scheduler = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"component": "kube-scheduler"}},
    }
    objects = render({**DEFAULTS, "services": {"loadaware": {"enabled": True}}})
    policy = by_kind(objects, "NetworkPolicy")["prod-koordbus-loadaware"]
    kubernetes_validate.validate(policy, KUBERNETES, strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "loadaware"
    assert policy["spec"]["ingress"] == [{"from": [scheduler], "ports": [{"protocol": "TCP", "port": 9090}]}]
    pod = by_kind(objects, "Deployment")["prod-koordbus-loadaware"]["spec"]["template"]["spec"]
    assert _env(pod["containers"][0])["KOORDBUS_ASSUMED_TTL_SECONDS"] == "30"
    assert "KOORDBUS_TLS_CERT_FILE" not in _env(pod["containers"][0])

    values = {
        **DEFAULTS,
        "services": {"loadaware": {"enabled": True}},
        "loadaware": {"tls": {"enabled": True, "secretName": "extender-tls"}},
    }
    objects = render(values)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    data = by_kind(objects, "ConfigMap")["prod-koordbus-loadaware"]["data"]
    (extender,) = yaml.safe_load(data["scheduler-config.yaml"])["extenders"]
    assert extender["urlPrefix"] == "https://prod-koordbus-loadaware.koordbus.svc:9443"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "insecure": False,
        "certFile": "/etc/kubernetes/koordbus-extender/tls.crt",
        "keyFile": "/etc/kubernetes/koordbus-extender/tls.key",
        "caFile": "/etc/kubernetes/koordbus-extender/ca.crt",
    }
    pod = by_kind(objects, "Deployment")["prod-koordbus-loadaware"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _env(container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for variable, key in (("CERT_FILE", "tls.crt"), ("KEY_FILE", "tls.key"), ("CLIENT_CA_FILE", "ca.crt")):
        assert env[f"KOORDBUS_TLS_{variable}"] == f"{mounts['loadaware-tls']}/{key}"
    assert env["KOORDBUS_EXTENDER_PORT"] == "9443"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "loadaware-tls"]
    assert volume["secret"]["secretName"] == "extender-tls"
    assert {"name": "extender", "containerPort": 9443} in container["ports"]
    service = by_kind(objects, "Service")["prod-koordbus-loadaware"]
    assert {"name": "extender", "port": 9443, "targetPort": "extender"} in service["spec"]["ports"]
    policy = by_kind(objects, "NetworkPolicy")["prod-koordbus-loadaware"]
    assert policy["spec"]["ingress"] == [
        {"from": [scheduler], "ports": [{"protocol": "TCP", "port": 9443}]},
        {"ports": [{"protocol": "TCP", "port": 9090}]},  # probes and metrics: no verb there
    ]
    # the settings the chart sets are the ones the service reads
    from services.common import settings as settings_loader
    from services.loadaware.settings import LoadAwareSettings

    files = {k: v for k, v in env.items() if k.startswith("KOORDBUS_TLS_") or k == "KOORDBUS_EXTENDER_PORT"}
    loaded = settings_loader.load(LoadAwareSettings, env={**files, "KOORDBUS_ASSUMED_TTL_SECONDS": "30"})
    assert loaded.tls and loaded.extender_port == 9443 and loaded.assumed_ttl_seconds == 30

    with pytest.raises(Exception, match=r"loadaware\.tls\.enabled needs loadaware\.tls\.secretName"):
        render({**values, "loadaware": {"tls": {"enabled": True}}})
    with pytest.raises(Exception, match=r"loadaware\.networkPolicy\.from is empty"):
        render({**values, "loadaware": {"networkPolicy": {"from": []}}})
    opened = render({**values, "loadaware": {"networkPolicy": {"enabled": False}}})
    assert "prod-koordbus-loadaware" not in by_kind(opened, "NetworkPolicy")


def test_the_profile_mirror_is_opt_in_and_grants_the_bridge_the_writes() -> None:
    """webhook.mirrorProfiles: off, the bridge only reads clustercolocationprofiles and mirrors none; on, it may
    create, update and delete them and is told to mirror the REST API's profiles."""
    for mirror in (False, True):
        objects = render({**DEFAULTS, "webhook": {"mirrorProfiles": mirror}})
        for obj in objects:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        (rule,) = [
            r
            for r in by_kind(objects, "ClusterRole")["prod-koordbus-k8s"]["rules"]
            if r["resources"] == ["clustercolocationprofiles"]
        ]
        writes = {"create", "update", "delete"}
        assert (writes <= set(rule["verbs"])) is mirror and {"get", "list", "watch"} <= set(rule["verbs"])
        bridge = by_kind(objects, "Deployment")["prod-koordbus-k8s"]["spec"]["template"]["spec"]["containers"][0]
        assert _env(bridge)["KOORDBUS_K8S_MIRROR_PROFILES"] == str(mirror).lower()


def test_the_loadaware_bind_verb_is_opt_in_and_grants_the_bridge_pods_binding() -> None:
    """Off by default: no bindVerb, the bridge neither may nor does bind. On: kube-scheduler binds through the
    extender, the bridge's ClusterRole allows creating pods/binding and the bridge answers bind requests."""
    binding = {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}
    for bind in (False, True):
        values = {**DEFAULTS, "services": {"loadaware": {"enabled": True}}, "loadaware": {"bind": bind}}
        objects = render(values)
        for obj in objects:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        data = by_kind(objects, "ConfigMap")["prod-koordbus-loadaware"]["data"]
        (extender,) = yaml.safe_load(data["scheduler-config.yaml"])["extenders"]
        assert extender.get("bindVerb") == ("bind" if bind else None)
        assert (binding in by_kind(objects, "ClusterRole")["prod-koordbus-k8s"]["rules"]) is bind
        bridge = by_kind(objects, "Deployment")["prod-koordbus-k8s"]["spec"]["template"]["spec"]["containers"][0]
        assert _env(bridge)["KOORDBUS_BIND_PODS"] == str(bind).lower()
    # the bind must give up before kube-scheduler does
    for timeout in ("5s", "500ms", "0.5s"):
        too_long = {**DEFAULTS, "services": {"loadaware": {"enabled": True}}}
        too_long["loadaware"] = {"bind": True, "bindTimeoutSeconds": 5, "extender": {"httpTimeout": timeout}}
        with pytest.raises(Exception, match=r"loadaware.bindTimeoutSeconds \(5\) must be shorter than"):
            render(too_long)
    render(
        {
            **DEFAULTS,
            "services": {"loadaware": {"enabled": True}},
            "loadaware": {"bind": True, "bindTimeoutSeconds": 5, "extender": {"httpTimeout": "1m"}},
        }
    )
    # the extender disabled: nothing to bind for, whatever loadaware.bind says
    objects = render({**DEFAULTS, "loadaware": {"bind": True}})
    assert binding not in by_kind(objects, "ClusterRole")["prod-koordbus-k8s"]["rules"]
