"""`koordbus certs webhook`, the chart's hook Job: when a pair is kept and why one is replaced (koordbus.certs
.reissue_reason), the real command writing a pair that Python's ssl serves and verifies for the Service's name, the
Job's whole life against a fake API server holding the chart's own rendered configurations (pre-install, post-install,
an upgrade, a broken Secret), and Go's crypto/x509 and crypto/tls — what kube-apiserver verifies webhooks with —
accepting the chain (nats-server, a Go program, as a TLS client of a leaf node connection).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from bus import server
from bus.cluster import free_ports
from koordbus import certs, cli
from services.common import x509
from services.k8s import webhook_certs
from tests.deploy.test_helm import KUBERNETES, by_kind, render
from tests.deploy.test_helm_webhook import MODES, NAME, RELEASE_NAMESPACE, SECRET
from tests.fakes.kube_api import FakeKubeApi

SERVICE_NAME = f"{NAME}.{RELEASE_NAMESPACE}.svc"
"""The name kube-apiserver calls the webhook's Service by."""
YEAR = timedelta(days=365)


def issued(*, now: datetime | None = None, days: int = 3650, names: list[str] | None = None) -> dict[str, str]:
    now = now or datetime.now(UTC)
    pair = certs.new_pair(NAME, RELEASE_NAMESPACE, now=now, days=days)
    if names is not None:
        pair = x509.issue_serving_pair(
            dns_names=names, now=now, days=days, ca_seed=os.urandom(32), serving_seed=os.urandom(32), ca_serial=1,
            serving_serial=2,
        )  # fmt: skip
    return pair.secret_data()


def verdict(data: dict[str, str], *, renew_before: timedelta = timedelta(days=90)) -> certs.Verdict:
    return certs.reissue_reason(data, dns_name=SERVICE_NAME, now=datetime.now(UTC), renew_before=renew_before)


def test_a_good_pair_is_kept_and_each_bad_one_replaced_with_the_reason() -> None:
    good = issued()
    kept = verdict(good)
    assert kept.reissue is None and kept.not_after is not None
    assert 9 * YEAR < kept.not_after - datetime.now(UTC) <= 10 * YEAR
    other = issued()
    cases = {
        "no tls.key": {k: v for k, v in good.items() if k != "tls.key"},
        "no ca.crt, tls.crt": {"tls.key": good["tls.key"]},
        "tls.crt and tls.key do not load": {**good, "tls.key": other["tls.key"]},  # another certificate's key
        f"tls.crt does not verify for {SERVICE_NAME} against ca.crt: unable to get local issuer": {
            **good,
            "ca.crt": other["ca.crt"],
        },
        f"tls.crt does not verify for {SERVICE_NAME} against ca.crt: Hostname mismatch": issued(names=["other.svc"]),
        "tls.crt does not verify for .+ certificate has expired": issued(now=datetime.now(UTC) - 3 * YEAR, days=365),
        "ca.crt does not load": {**good, "ca.crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
        "it expires .+ UTC, within 90 days": issued(days=60),
    }
    for reason, data in cases.items():
        found = verdict(data).reissue
        assert found is not None, reason
        assert re.match(reason, found), (reason, found)
    assert verdict(issued(days=60), renew_before=timedelta(days=30)).reissue is None


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "koordbus.cli", "certs", "webhook", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_command_writes_a_pair_ssl_serves_and_verifies_for_the_service(tmp_path: Path) -> None:
    out = tmp_path / "pair"
    made = _run("--service", NAME, "--namespace", RELEASE_NAMESPACE, "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert f"wrote ca.crt, tls.crt, tls.key for {SERVICE_NAME}" in made.stdout
    assert (out / "tls.key").stat().st_mode & 0o777 == 0o600
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(out / "tls.crt", out / "tls.key")
    client = ssl.create_default_context(cafile=out / "ca.crt")  # hostname checked, as kube-apiserver does
    seen = certs._handshake(server_context, client, SERVICE_NAME)
    assert ("DNS", SERVICE_NAME) in seen["subjectAltName"]
    with pytest.raises(ssl.SSLCertVerificationError):
        certs._handshake(server_context, ssl.create_default_context(), SERVICE_NAME)  # the system's CAs: no
    files = {p.name: p.read_text() for p in out.iterdir()}

    again = _run("--service", NAME, "--namespace", RELEASE_NAMESPACE, "--out", str(out))
    assert again.returncode == 0 and f"kept (valid for {SERVICE_NAME} until" in again.stdout
    assert {p.name: p.read_text() for p in out.iterdir()} == files
    renamed = _run("--service", "renamed", "--namespace", RELEASE_NAMESPACE, "--out", str(out))
    assert "Hostname mismatch" in renamed.stdout and (out / "tls.crt").read_text() != files["tls.crt"]

    for refused, message in (
        (["--days", "30", "--renew-before-days", "30"], "--days must be at least 1 and more than"),
        (["--mutating", "x"], "--mutating and --validating need --secret"),
    ):
        done = _run("--service", NAME, "--out", str(out), *refused)
        assert done.returncode != 0 and message in done.stderr
    assert _run("--service", NAME).returncode == 2  # --secret or --out


def _bundle(kube_api: FakeKubeApi, kind: str) -> dict[str, list[str]]:
    configuration = kube_api.get(kind, NAME)
    assert configuration is not None
    return {
        w["name"]: x509.pem_certificates(base64.b64decode(w["clientConfig"].get("caBundle", "")).decode())
        for w in configuration["webhooks"]
    }


async def test_the_hook_job_makes_the_secret_then_trusts_it_and_keeps_both_across_upgrades(
    kube_api: FakeKubeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = render(MODES["job"])
    job = by_kind(objects, "Job")["prod-koordbus-webhook-certs"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]  # the chart's own arguments
    kubeconfig = kube_api.kubeconfig(tmp_path / "kubeconfig")
    kinds = (webhook_certs.MUTATING, webhook_certs.VALIDATING)

    async def hook(*, real: bool = False) -> str:
        """One run of the Job: the real command, or (faster) the same arguments through its entry in this process."""
        if not real:
            parsed = cli.build_parser().parse_args([*args, f"--kubeconfig={kubeconfig}"])
            assert await certs._run_cluster(parsed, now=datetime.now(UTC)) == 0
            return capsys.readouterr().out
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "koordbus.cli", *args, f"--kubeconfig={kubeconfig}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output = (await process.communicate())[0].decode()
        assert process.returncode == 0, output
        return output

    def secret() -> dict[str, str]:
        found = kube_api.get("Secret", SECRET, RELEASE_NAMESPACE)
        assert found is not None and found["type"] == "kubernetes.io/tls"
        return {k: base64.b64decode(v).decode() for k, v in found["data"].items()}

    # pre-install: the configurations are not there yet
    output = await hook(real=True)
    assert f"Secret {RELEASE_NAMESPACE}/{SECRET}: a new CA and certificate for {SERVICE_NAME}" in output
    assert output.count("not there (yet") == 2
    first = secret()
    assert verdict(first).reissue is None

    # Helm creates the release's objects, then post-install: each webhook trusts the CA
    for kind in kinds:
        kube_api.put(kind, by_kind(objects, kind)[NAME])
    output = await hook()
    assert f"Secret {RELEASE_NAMESPACE}/{SECRET}: kept (valid for {SERVICE_NAME}" in output
    assert "MutatingWebhookConfiguration prod-koordbus-webhook: caBundle set on mutate-pods.koordbus.io" in output
    assert "caBundle set on validate-configmaps.koordbus.io, validate-elasticquotas.koordbus.io" in output
    assert secret() == first
    for kind in kinds:
        assert set(map(tuple, _bundle(kube_api, kind).values())) == {(first["ca.crt"],)}
        stored = kube_api.get(kind, NAME)
        assert stored is not None
        kubernetes_validate.validate(stored, KUBERNETES, strict=True)

    # an upgrade (pre and post): nothing to do, nothing written
    writes = len(kube_api.bodies)
    output = await hook()
    assert output.count("trusts the CA already") == 2 and len(kube_api.bodies) == writes

    # a Secret that no longer serves (a key from elsewhere): a new pair, trusted next to the old CA
    broken = {**first, "tls.key": issued()["tls.key"]}
    kube_api.put(
        "Secret",
        {"metadata": {"name": SECRET, "namespace": RELEASE_NAMESPACE}, "type": "kubernetes.io/tls",
         "data": {k: base64.b64encode(v.encode()).decode() for k, v in broken.items()}},
    )  # fmt: skip
    output = await hook()
    assert "a new CA and certificate for" in output and "tls.crt and tls.key do not load" in output
    second = secret()
    assert second["ca.crt"] != first["ca.crt"] and verdict(second).reissue is None
    for kind in kinds:
        for bundle in _bundle(kube_api, kind).values():
            assert bundle == [second["ca.crt"], first["ca.crt"]]  # the pods still serving the old pair stay trusted
    assert "trusts the CA already" in await hook()
    patches = [b for b in kube_api.bodies if b.verb == "patch"]
    assert patches and all(op["op"] in ("test", "add") for b in patches for op in b.body)


def test_ca_bundle_patch_changes_only_what_lacks_the_ca_and_guards_each_index() -> None:
    old, new = issued()["ca.crt"], issued()["ca.crt"]

    def webhook(name: str, *bundle: str) -> dict[str, Any]:
        encoded = base64.b64encode("".join(bundle).encode()).decode()
        return {"name": name, "clientConfig": {"service": {"name": NAME}, **({"caBundle": encoded} if bundle else {})}}

    configuration = {"webhooks": [webhook("a", new), webhook("b"), webhook("c", old), webhook("d", new, old)]}
    operations, changed = webhook_certs.ca_bundle_patch(configuration, ca=new)
    assert changed == ["b", "c"]
    assert [op["op"] for op in operations] == ["test", "add", "test", "add"]
    assert operations[0] == {"op": "test", "path": "/webhooks/1/name", "value": "b"}
    assert operations[1]["path"] == "/webhooks/1/clientConfig/caBundle"
    assert x509.pem_certificates(base64.b64decode(operations[1]["value"]).decode()) == [new]
    operations, changed = webhook_certs.ca_bundle_patch(configuration, ca=new, keep=[old])
    assert changed == ["a", "b", "c"]  # d trusts both already
    assert x509.pem_certificates(base64.b64decode(operations[1]["value"]).decode()) == [new, old]
    assert webhook_certs.ca_bundle_patch(configuration, ca=new, keep=[new, "not a certificate"])[1] == ["b", "c"]
    with pytest.raises(ValueError, match="not a PEM certificate"):
        webhook_certs.ca_bundle_patch(configuration, ca="garbage")


def test_go_crypto_tls_verifies_the_chain_as_kube_apiserver_would(tmp_path: Path) -> None:
    """kube-apiserver is a Go program: its webhook client verifies the serving certificate with crypto/x509 against
    the caBundle. nats-server (Go too) serves a pair as a leaf node hub, and leaf nodes connect to it over TLS
    trusting a CA file: with the pair's CA the connection is made; with another CA, or to a name the certificate does
    not hold, Go refuses it."""
    now = datetime.now(UTC)
    names = [*x509.service_dns_names(NAME, RELEASE_NAMESPACE), "localhost"]  # the leaf calls the hub "localhost"
    good = issued(now=now, days=2, names=names)
    other_ca = issued(now=now, days=2, names=names)["ca.crt"]
    wrong_name = issued(now=now, days=2, names=x509.service_dns_names(NAME, RELEASE_NAMESPACE))
    for prefix, data in (("good", good), ("wrong-name", wrong_name)):
        for key, text in data.items():
            (tmp_path / f"{prefix}-{key}").write_text(text)
    (tmp_path / "other-ca.crt").write_text(other_ca)

    binary = str(server.find_binary())
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, config: str) -> Path:
        (tmp_path / f"{name}.conf").write_text(config)
        log = tmp_path / f"{name}.log"
        processes.append(subprocess.Popen([binary, "-c", str(tmp_path / f"{name}.conf"), "-l", str(log)]))
        return log

    def hub(name: str, pair: str) -> tuple[int, int]:
        leaf_port, http_port = free_ports(2)
        tls = f'tls {{ cert_file: "{tmp_path}/{pair}-tls.crt", key_file: "{tmp_path}/{pair}-tls.key" }}'
        start(name, f"port: -1\nhttp: {http_port}\nleafnodes {{ port: {leaf_port}, {tls} }}\n")
        return leaf_port, http_port

    def leaf(name: str, port: int, ca_file: str) -> Path:
        remote = f'url: "tls://localhost:{port}", tls {{ ca_file: "{tmp_path}/{ca_file}" }}'
        return start(name, f"port: -1\nleafnodes {{ remotes [ {{ {remote} }} ] }}\n")

    def leafnodes(http_port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/leafz", timeout=2) as answer:
                return int(json.load(answer)["leafnodes"])
        except OSError:
            return -1

    try:
        good_port, good_http = hub("hub", "good")
        wrong_port, wrong_http = hub("hub-wrong-name", "wrong-name")
        time.sleep(0.5)
        leaf("trusting", good_port, "good-ca.crt")
        refused_ca = leaf("other-ca", good_port, "other-ca.crt")
        refused_name = leaf("wrong-name", wrong_port, "wrong-name-ca.crt")

        def settled() -> bool:
            return leafnodes(good_http) == 1 and all(
                "handshake error" in log.read_text(errors="replace") for log in (refused_ca, refused_name)
            )

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not settled():
            time.sleep(0.2)
        assert leafnodes(good_http) == 1  # the trusting leaf, and only it
        assert "x509: certificate signed by unknown authority" in refused_ca.read_text()
        refused = refused_name.read_text()
        assert "x509: certificate is valid for" in refused and "not localhost" in refused
        assert leafnodes(wrong_http) == 0
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)
