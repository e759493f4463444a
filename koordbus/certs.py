"""`koordbus certs webhook`: the admission webhook's CA and serving certificate, in a cluster's Secret (then trusted
by the webhook configurations' caBundle) or in a directory.

The Helm chart runs it as a hook Job before and after every install and upgrade when neither cert-manager nor a
certificate of the user's is configured (deploy/helm/koordbus/templates/webhook-certs.yaml, docs/webhook.md). A
pair is made by services.common.x509 (Ed25519, no openssl needed in the image) and kept while it is good:
`reissue_reason` has OpenSSL load it and shake hands with it in memory, as a client trusting only its ca.crt and
calling the Service by the name kube-apiserver uses, and asks for a new pair when that fails or when it expires
within --renew-before-days. The Secret and the caBundles are written by services.k8s.webhook_certs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import ssl
import tempfile
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from services.common import x509

KEYS = ("ca.crt", "tls.crt", "tls.key")
HANDSHAKE_ROUNDS = 8


def add_parser(sub: Any) -> None:
    certs = sub.add_parser(
        "certs",
        help="the admission webhook's CA and serving certificate, in a cluster's Secret or a directory",
        description="webhook: make a CA and a serving certificate for the Service --service in --namespace (its "
        "names <service>, <service>.<namespace>, <service>.<namespace>.svc and …svc.cluster.local; Ed25519), and "
        "keep an existing pair while it verifies for <service>.<namespace>.svc against its ca.crt and has more than "
        "--renew-before-days left. --secret NAME: in that Secret of --namespace (keys ca.crt, tls.crt, tls.key), "
        "then trust its CA in the caBundle of each --mutating / --validating webhook configuration (a new CA is "
        "added to the one it replaces; a configuration not there yet is skipped). The Helm chart's hook Job runs "
        "this; needs a cluster. --out DIR: as files in DIR (tls.key mode 0600).",
    )
    certs.add_argument("action", choices=["webhook"], help="what to make")
    certs.add_argument("--service", required=True, help="the webhook's Service name")
    certs.add_argument("--namespace", default="default", help="the Service's (and the Secret's) namespace")
    where = certs.add_mutually_exclusive_group(required=True)
    where.add_argument("--secret", default=None, help="the Secret to keep the pair in")
    where.add_argument("--out", default=None, help="a directory to keep the pair in instead")
    certs.add_argument(
        "--mutating", action="append", default=[], help="a MutatingWebhookConfiguration to trust the CA (repeatable)"
    )
    certs.add_argument(
        "--validating",
        action="append",
        default=[],
        help="a ValidatingWebhookConfiguration to trust the CA (repeatable)",
    )
    certs.add_argument("--days", type=int, default=3650, help="validity of a new CA and certificate (3650)")
    certs.add_argument(
        "--renew-before-days", type=int, default=90, help="make a new pair when the one there expires sooner (90)"
    )
    certs.add_argument("--kubeconfig", default=None, help="--secret: the cluster (default: in-cluster)")
    certs.set_defaults(run=run_certs)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    reissue: str | None
    """Why the pair must be replaced, or None: it is good."""
    not_after: datetime | None = None
    """When the serving certificate expires (for a pair that loads and verifies)."""


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> dict[str, Any]:
    """A TLS handshake between the two contexts through memory; the server's certificate as the client saw it.
    ssl.SSLError (ssl.SSLCertVerificationError with its verify_message) when it fails."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(to_client, to_server, server_hostname=name)
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(HANDSHAKE_ROUNDS):
        for side, connection in (("client", client_side), ("server", server_side)):
            if not done[side]:
                try:
                    connection.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        if all(done.values()):
            return client_side.getpeercert() or {}
    raise ssl.SSLError("the handshake did not finish")


def reissue_reason(data: Mapping[str, str], *, dns_name: str, now: datetime, renew_before: timedelta) -> Verdict:
    """Whether `data` (ca.crt, tls.crt, tls.key) can keep serving kube-apiserver's calls to `dns_name`: the pair
    loads, the certificate verifies against ca.crt for that name now, and it expires more than `renew_before` after
    `now`. OpenSSL judges (any key type: a pair someone else made is judged the same)."""
    missing = [key for key in KEYS if not data.get(key, "").strip()]
    if missing:
        return Verdict(reissue=f"no {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="koordbus-certs-") as directory:
        cert_file, key_file = Path(directory, "tls.crt"), Path(directory, "tls.key")
        cert_file.write_text(data["tls.crt"])
        key_file.touch(mode=0o600)
        key_file.write_text(data["tls.key"])
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            server.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as err:
            return Verdict(reissue=f"tls.crt and tls.key do not load: {err.reason or err}")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        client.load_verify_locations(cadata=data["ca.crt"])
    except ssl.SSLError as err:
        return Verdict(reissue=f"ca.crt does not load: {err.reason or err}")
    try:
        peer = _handshake(server, client, dns_name)
    except ssl.SSLCertVerificationError as err:
        return Verdict(reissue=f"tls.crt does not verify for {dns_name} against ca.crt: {err.verify_message}")
    except ssl.SSLError as err:
        return Verdict(reissue=f"no TLS handshake with the pair: {err.reason or err}")
    not_after = datetime.fromtimestamp(ssl.cert_time_to_seconds(peer["notAfter"]), UTC)
    if not_after - now <= renew_before:
        return Verdict(reissue=f"it expires {not_after:%Y-%m-%d %H:%M} UTC, within {renew_before.days} days")
    return Verdict(reissue=None, not_after=not_after)


def new_pair(service: str, namespace: str, *, now: datetime, days: int) -> x509.ServingPair:
    return x509.issue_serving_pair(
        dns_names=x509.service_dns_names(service, namespace),
        now=now,
        days=days,
        ca_seed=secrets.token_bytes(x509.SEED_BYTES),
        serving_seed=secrets.token_bytes(x509.SEED_BYTES),
        ca_serial=1 + secrets.randbits(127),
        serving_serial=1 + secrets.randbits(127),
    )


def run_certs(args: argparse.Namespace) -> int:
    if args.days < 1 or args.renew_before_days < 0 or args.renew_before_days >= args.days:
        raise SystemExit("koordbus certs: --days must be at least 1 and more than --renew-before-days (≥ 0)")
    if args.out is not None:
        if args.mutating or args.validating:
            raise SystemExit("koordbus certs: --mutating and --validating need --secret (a cluster)")
        return _run_files(args, now=datetime.now(UTC))
    return asyncio.run(_run_cluster(args, now=datetime.now(UTC)))


class _Judge:
    """`reissue_reason` for the Service's name kube-apiserver calls, at `now`; remembers the expiry of a good pair."""

    def __init__(self, args: argparse.Namespace, now: datetime) -> None:
        self.name = x509.service_dns_names(args.service, args.namespace)[2]
        self.now = now
        self.renew_before = timedelta(days=args.renew_before_days)
        self.not_after: datetime | None = None

    def __call__(self, data: Mapping[str, str]) -> str | None:
        verdict = reissue_reason(data, dns_name=self.name, now=self.now, renew_before=self.renew_before)
        self.not_after = verdict.not_after
        return verdict.reissue

    def kept(self, where: str) -> str:
        return f"koordbus certs: {where}: kept (valid for {self.name} until {self.not_after:%Y-%m-%d})"


def _run_files(args: argparse.Namespace, *, now: datetime) -> int:
    directory = Path(args.out)
    directory.mkdir(parents=True, exist_ok=True)
    existing = {key: (directory / key).read_text() for key in KEYS if (directory / key).is_file()}
    judge = _Judge(args, now)
    reason = judge(existing)
    if reason is None:
        print(judge.kept(str(directory)), flush=True)
        return 0
    for key, text in new_pair(args.service, args.namespace, now=now, days=args.days).secret_data().items():
        staged = directory / f".{key}.new"
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if key == "tls.key" else 0o644)
        with os.fdopen(descriptor, "w") as f:
            f.write(text)
        staged.replace(directory / key)
    print(f"koordbus certs: {directory}: wrote ca.crt, tls.crt, tls.key for {judge.name} ({reason})", flush=True)
    return 0


async def _run_cluster(args: argparse.Namespace, *, now: datetime) -> int:
    from koordbus.common import kube_client
    from services.k8s import webhook_certs

    what = f"Secret {args.namespace}/{args.secret}"
    judge = _Judge(args, now)
    async with AsyncExitStack() as stack:
        client = await kube_client(stack, args.kubeconfig, "certs webhook")
        outcome = await webhook_certs.ensure_secret(
            client,
            namespace=args.namespace,
            name=args.secret,
            reissue=judge,
            issue=lambda: new_pair(args.service, args.namespace, now=now, days=args.days).secret_data(),
            labels={"app.kubernetes.io/name": "koordbus", "app.kubernetes.io/component": "webhook-tls"},
        )
        if outcome.issued is None:
            print(judge.kept(what), flush=True)
        else:
            print(f"koordbus certs: {what}: a new CA and certificate for {judge.name} ({outcome.issued})", flush=True)
        keep = [outcome.replaced.get("ca.crt", "")] if outcome.replaced else []
        targets = [(webhook_certs.MUTATING, n) for n in args.mutating]
        targets += [(webhook_certs.VALIDATING, n) for n in args.validating]
        for kind, configuration in targets:
            changed = await webhook_certs.ensure_ca_bundle(
                client, kind=kind, name=configuration, ca=outcome.data["ca.crt"], keep=keep
            )
            if changed is None:
                shown = "not there (yet: the run before an install creates it); skipped"
            elif changed:
                shown = f"caBundle set on {', '.join(changed)}"
            else:
                shown = "trusts the CA already"
            print(f"koordbus certs: {kind} {configuration}: {shown}", flush=True)
    return 0
