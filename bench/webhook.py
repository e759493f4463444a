"""Admission webhook benchmark: Pod mutation (or, with --quotas, ElasticQuota validation) latency at a steady request
rate (200/s) over TLS, against the real `koordbus service webhook` process.

Run as `python bench/webhook.py [flags]` (see --help) and, at toy size, by tests/e2e/test_bench_webhook_smoke.py. It
starts nats-server, publishes P ClusterColocationProfiles, N Namespaces and the koord PriorityClasses exactly as the
bridge's observer publishes them (services.k8s.observer.observed_message), makes a throwaway CA and serving
certificate with openssl, and starts the webhook pinned to one CPU (--service-cpu; everything else avoids it). Then
it plays kube-apiserver: an open-loop schedule of AdmissionReview v1 bodies for a Job's Pod (CREATE, a fresh uid
each, a namespace picked round robin, --match of them matching a batch profile) POSTed to /mutate-pods over
keep-alive TLS connections trusting only that CA, each request's latency counted from its scheduled send time (so a
stall shows up in every request it delays). Every answer is checked: HTTP 200, the request's uid, allowed, a
patch exactly for the matching Pods.

With --quotas it measures POST /validate-elasticquotas instead (bench/webhook_quotas.py): `koordbus service quota`
runs too, pinned with the webhook to the same CPU; a parent and --teams team quotas are created through the webhook
first, then the load is kubectl-shaped UPDATEs of the teams in turn, each raising a team's spec.max.cpu: every
request is a change the quota service validates against the tree and appends to its log before the webhook answers
(PatchQuota by kubernetes/alice). Every answer is checked (200, its uid, allowed) and so is the log: it must have
grown by exactly one event per request.

Exactly one JSON line goes to stdout: p50/p99/max latency of the measured period (after --warmup), the rate
achieved, errors, the service's CPU (and the quota service's), and the target (p99 < 10 ms at 200 requests/s for
the Pod mutation, < 25 ms for quota changes, which wait for the append); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import shlex
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import msgspec

from bench import measure, processes
from bus.cluster import free_ports

log = logging.getLogger("bench.webhook")

TARGET_P99_MS = 10.0
TARGET_QUOTA_P99_MS = 25.0
TARGET_RATE = 200.0
MIRROR_USER = "system:serviceaccount:koordbus:koordbus-koordbus-k8s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Start nats-server and `koordbus service webhook` (pinned to one CPU) with P profiles and N "
        "namespaces, POST Pod AdmissionReviews to /mutate-pods over TLS at a steady rate and print one JSON line: "
        "latency p50/p99/max, achieved rate, errors, service CPU and whether p99 < 10 ms held at 200 requests/s.",
    )
    p.add_argument("--rate", type=float, default=TARGET_RATE, help="requests per second (200)")
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds, after the warm-up (60)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load excluded from the figures (5)")
    p.add_argument("--profiles", type=int, default=20, help="ClusterColocationProfiles (20; one matches batch Pods)")
    p.add_argument("--namespaces", type=int, default=200, help="Namespaces the Pods are spread over (200)")
    p.add_argument("--match", type=float, default=0.8, help="fraction of Pods the batch profile matches (0.8)")
    p.add_argument("--connections", type=int, default=8, help="keep-alive TLS connections at most (8)")
    p.add_argument(
        "--quotas",
        action="store_true",
        help="measure the ElasticQuota validation (POST /validate-elasticquotas, the quota service appending each "
        "change) instead of the Pod mutation; target p99 < 25 ms",
    )
    p.add_argument("--teams", type=int, default=50, help="--quotas: team quotas under one parent (50)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (NATS store, logs, certificates)")
    p.add_argument(
        "--service-cpu",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="CPU the webhook process is pinned to; the rest of the benchmark avoids it (default: the last CPU)",
    )
    args = p.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0:
        p.error("--rate and --duration must be positive, --warmup not negative")
    if min(args.profiles, args.namespaces, args.connections, args.teams) < 1 or not 0 <= args.match <= 1:
        p.error("--profiles, --namespaces, --connections and --teams must be at least 1, --match within 0..1")
    if args.service_cpu not in os.sched_getaffinity(0):
        p.error(f"--service-cpu {args.service_cpu} is not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/webhook.py", "--rate", f"{args.rate:g}", "--duration", f"{args.duration:g}"]
    parts += ["--warmup", f"{args.warmup:g}"]
    if args.quotas:
        parts += ["--quotas", "--teams", str(args.teams)]
    else:
        parts += ["--profiles", str(args.profiles), "--namespaces", str(args.namespaces), "--match", f"{args.match:g}"]
    parts += ["--connections", str(args.connections), "--service-cpu", str(args.service_cpu)]
    return shlex.join(parts)


# --- certificates (the openssl command-line tool, as a cluster's cert-manager or a script would make them)


def _openssl(*arguments: str) -> None:
    subprocess.run(["openssl", *arguments], check=True, capture_output=True)


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, serving certificate, serving key) for 127.0.0.1."""
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert, ext = (directory / f"webhook.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(ca_key),
        "-out", str(ca_cert), "-days", "2", "-subj", "/CN=bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
    )  # fmt: skip
    ext.write_text("basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n")
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(csr), "-subj", "/CN=webhook",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    return ca_cert, cert, key


# --- the cluster the webhook sees


def cluster_objects(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(observer kind, object): the profiles (the batch one and others matching no bench Pod), the namespaces, the
    PriorityClasses."""
    from services.k8s.observer import KIND_NAMESPACE, KIND_PRIORITY_CLASS, KIND_PROFILE

    objects: list[tuple[str, dict[str, Any]]] = [
        (
            KIND_PROFILE,
            {
                "metadata": {"name": "colocation-batch"},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
                    "selector": {"matchLabels": {"app": "spark"}},
                    "qosClass": "BE",
                    "priorityClassName": "koord-batch",
                    "schedulerName": "koord-scheduler",
                    "labels": {"koordinator.sh/mutated": "true"},
                },
            },
        )
    ]
    for i in range(args.profiles - 1):
        spec = {"selector": {"matchLabels": {"app": f"other-{i}"}}, "qosClass": "LS", "labels": {"profile": str(i)}}
        objects.append((KIND_PROFILE, {"metadata": {"name": f"profile-{i:03d}"}, "spec": spec}))
    for i in range(args.namespaces):
        labels = {"koordinator.sh/enable-colocation": "true", "team": f"team-{i}"}
        objects.append((KIND_NAMESPACE, {"metadata": {"name": f"ns-{i:04d}", "labels": labels}}))
    for name, value in (("koord-prod", 9000), ("koord-mid", 7000), ("koord-batch", 5000), ("koord-free", 3000)):
        objects.append((KIND_PRIORITY_CLASS, {"metadata": {"name": name}, "value": value}))
    return objects


async def publish_cluster(bus: Any, objects: list[tuple[str, dict[str, Any]]]) -> None:
    from services.k8s import core
    from services.k8s.observer import observed_message

    for version, (kind, obj) in enumerate(objects, start=1):
        name = obj["metadata"]["name"]
        change = core.Change(
            key=("", name), seen=core.Seen(resource_version=str(version)), raw=msgspec.json.encode(obj)
        )
        subject, data, identity = observed_message(kind, change, observed_at=time.time())
        await bus.publish(subject, data, msg_id=identity)


def pod_review(index: int, args: argparse.Namespace) -> tuple[bytes, str, bool]:
    """(body, uid, whether the batch profile matches) of the index-th AdmissionReview."""
    matches = int((index + 1) * args.match) > int(index * args.match)  # spread evenly, exactly --match of them
    uid = str(uuid.uuid4())
    namespace = f"ns-{index % args.namespaces:04d}"
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": f"job-{index}-",
            "namespace": namespace,
            "labels": {"app": "spark" if matches else "web", "job-name": f"job-{index}"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{index}", "uid": uid, "controller": True}
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "spark:3.5",
                    "resources": {
                        "limits": {"cpu": "2", "memory": "4Gi"},
                        "requests": {"cpu": "1500m", "memory": "4Gi"},
                    },
                    "env": [{"name": "SPARK_MODE", "value": "executor"}],
                    "volumeMounts": [{"name": "token", "mountPath": "/var/run/secrets/token"}],
                },
                {"name": "sidecar", "image": "log:1", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            ],
            "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
        },
        "status": {},
    }
    gvk, gvr = {"group": "", "version": "v1", "kind": "Pod"}, {"group": "", "version": "v1", "resource": "pods"}
    review = {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }
    return msgspec.json.encode(review), uid, matches


# --- the load


class _Answer(msgspec.Struct):
    uid: str
    allowed: bool
    patch: str | None = None


class _Review(msgspec.Struct):
    response: _Answer


def total_requests(args: argparse.Namespace) -> int:
    return int((args.warmup + args.duration) * args.rate)


async def load(
    args: argparse.Namespace, url: str, trust: Path, bodies: list[tuple[bytes, str, bool]]
) -> tuple[list[float], int, int, float]:
    """`bodies` (body, uid, whether a patch is expected) POSTed on schedule: (latencies in ms of the measured
    requests, errors, patched answers, seconds from the first measured request's send to the last measured
    answer)."""
    total = len(bodies)
    warmup_count = int(args.warmup * args.rate)
    gc.collect()
    gc.freeze()  # the prepared bodies stay to the end: the load generator's full collections must not scan them
    context = ssl.create_default_context(cafile=str(trust))
    connector = aiohttp.TCPConnector(ssl=context, limit=args.connections)
    latencies: list[float] = []
    errors = patched = 0
    last_done = 0.0
    decoder = msgspec.json.Decoder(_Review)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:

        async def one(index: int, at: float) -> None:
            nonlocal errors, patched, last_done
            body, uid, matches = bodies[index]
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                    raw = await response.read()
                    done = time.perf_counter()
                    answer = decoder.decode(raw).response if response.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as err:
                errors += 1
                log.warning("request %d failed: %s", index, err)
                return
            ok = answer is not None and answer.uid == uid and answer.allowed and (answer.patch is not None) == matches
            if not ok:
                errors += 1
                log.warning("request %d: unexpected answer %s", index, raw[:300])
            if index >= warmup_count:
                latencies.append((done - at) * 1000)
                last_done = max(last_done, done)
                patched += int(answer is not None and answer.patch is not None)

        loop_start = time.perf_counter() + 0.1
        tasks = []
        for index in range(total):
            at = loop_start + index / args.rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index, at)))
        await asyncio.gather(*tasks)
    measured_from = loop_start + warmup_count / args.rate
    return latencies, errors, patched, max(last_done - measured_from, 1e-9)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    if args.quotas:
        return await run_quotas(args, workdir)
    from bus import streams
    from bus.jetstream import JetStreamBus
    from bus.server import EmbeddedNatsServer

    trust, cert, key = certificates(workdir)
    objects = cluster_objects(args)
    async with EmbeddedNatsServer(workdir / "nats", log_file=workdir / "nats-server.log") as server:
        bus = await JetStreamBus.connect(server.url, name="bench")
        try:
            await bus.ensure_streams(streams.all_streams())
            await publish_cluster(bus, objects)
        finally:
            await bus.close()
        https_port, plain_port = free_ports(2)
        env = {
            "KOORDBUS_WEBHOOK_TLS_CERT_FILE": str(cert),
            "KOORDBUS_WEBHOOK_TLS_KEY_FILE": str(key),
            "KOORDBUS_WEBHOOK_PORT": str(https_port),
        }
        arguments = ["webhook", "--nats-url", server.url, "--port", str(plain_port)]
        service_log = workdir / "webhook.log"
        with processes.pinned_service(arguments, cpu=args.service_cpu, log_path=service_log, env=env) as service:
            started = time.monotonic()
            await _wait_ready(f"http://127.0.0.1:{plain_port}/readyz", service, service_log)
            startup_seconds = time.monotonic() - started
            log.info(
                "webhook ready in %.1f s; %g requests/s for %g + %g s",
                startup_seconds,
                args.rate,
                args.warmup,
                args.duration,
            )
            before, began = measure.read_proc(service.pid), time.monotonic()
            url = f"https://127.0.0.1:{https_port}/mutate-pods"
            reviews = [pod_review(i, args) for i in range(total_requests(args))]
            latencies, errors, patched, seconds = await load(args, url, trust, reviews)
            after, elapsed = measure.read_proc(service.pid), time.monotonic() - began
            if service.poll() is not None:
                raise RuntimeError(f"the webhook died during the run:\n{processes.tail(service_log)}")
    p99 = measure.quantile(latencies, 0.99) or 0.0
    achieved = len(latencies) / seconds
    misses = []
    if p99 >= TARGET_P99_MS:
        misses.append(f"p99 {p99:.2f} ms ≥ {TARGET_P99_MS:g} ms")
    if args.rate < TARGET_RATE:
        misses.append(f"offered {args.rate:g} requests/s < {TARGET_RATE:g}")
    if errors:
        misses.append(f"{errors} errors")
    return {
        "bench": "webhook",
        "rate": args.rate,
        "duration_seconds": args.duration,
        "profiles": args.profiles,
        "namespaces": args.namespaces,
        "connections": args.connections,
        "requests": len(latencies),
        "achieved_rate": round(achieved, 1),
        "patched_fraction": round(patched / len(latencies), 3) if latencies else 0.0,
        "errors": errors,
        "p50_ms": round(measure.quantile(latencies, 0.5) or 0.0, 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(max(latencies, default=0.0), 2),
        "service_cpu_cores": round(measure.rate(after.cpu_seconds, before.cpu_seconds, elapsed), 3),
        "service_rss_peak_mib": round(after.rss_peak_bytes / 2**20, 1),
        "startup_seconds": round(startup_seconds, 2),
        "target": f"p99 < {TARGET_P99_MS:g} ms at {TARGET_RATE:g} requests/s over TLS",
        "target_held": not misses,
        "target_misses": misses,
        "command": command_line(args),
    }


async def run_quotas(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """--quotas: the webhook and the quota service pinned to --service-cpu, the teams created through the webhook,
    then the UPDATE load; the quota log must grow by one event per request."""
    from bench import webhook_quotas
    from bus import streams
    from bus.jetstream import JetStreamBus
    from bus.server import EmbeddedNatsServer

    trust, cert, key = certificates(workdir)
    async with EmbeddedNatsServer(workdir / "nats", log_file=workdir / "nats-server.log") as server:
        bus = await JetStreamBus.connect(server.url, name="bench")
        try:
            await bus.ensure_streams(streams.all_streams())
            https_port, plain_port, quota_port = free_ports(3)
            env = {
                "KOORDBUS_WEBHOOK_TLS_CERT_FILE": str(cert),
                "KOORDBUS_WEBHOOK_TLS_KEY_FILE": str(key),
                "KOORDBUS_WEBHOOK_PORT": str(https_port),
                "KOORDBUS_WEBHOOK_QUOTA_MIRROR_USERS": MIRROR_USER,
            }
            arguments = ["webhook", "--nats-url", server.url, "--port", str(plain_port)]
            service_log, quota_log = workdir / "webhook.log", workdir / "quota.log"
            with (
                webhook_quotas.quota_service(server.url, workdir, port=quota_port, cpu=args.service_cpu) as quota,
                processes.pinned_service(arguments, cpu=args.service_cpu, log_path=service_log, env=env) as service,
            ):
                started = time.monotonic()
                await _wait_ready(f"http://127.0.0.1:{quota_port}/readyz", quota, quota_log)
                await _wait_ready(f"http://127.0.0.1:{plain_port}/readyz", service, service_log)
                startup_seconds = time.monotonic() - started
                url = f"https://127.0.0.1:{https_port}/validate-elasticquotas"
                created = await _send_in_order(url, trust, webhook_quotas.create_reviews(args.teams))
                if created:
                    raise RuntimeError(f"creating the quotas through the webhook failed: {created}")
                log.info("webhook and quota service ready in %.1f s; %d quotas created", startup_seconds, args.teams)
                reviews = [
                    (body, uid, False) for body, uid in webhook_quotas.update_reviews(args.teams, total_requests(args))
                ]
                events_before, _ = await bus.stream_info(streams.KOORD_QUOTA)
                before, quota_before = measure.read_proc(service.pid), measure.read_proc(quota.pid)
                began = time.monotonic()
                latencies, errors, _, seconds = await load(args, url, trust, reviews)
                after, quota_after = measure.read_proc(service.pid), measure.read_proc(quota.pid)
                elapsed = time.monotonic() - began
                events_after, _ = await bus.stream_info(streams.KOORD_QUOTA)
                for process, path in ((service, service_log), (quota, quota_log)):
                    if process.poll() is not None:
                        raise RuntimeError(f"a service died during the run:\n{processes.tail(path)}")
        finally:
            await bus.close()
    p99 = measure.quantile(latencies, 0.99) or 0.0
    appended = events_after - events_before
    misses = []
    if p99 >= TARGET_QUOTA_P99_MS:
        misses.append(f"p99 {p99:.2f} ms ≥ {TARGET_QUOTA_P99_MS:g} ms")
    if args.rate < TARGET_RATE:
        misses.append(f"offered {args.rate:g} requests/s < {TARGET_RATE:g}")
    if errors:
        misses.append(f"{errors} errors")
    if appended != len(reviews):
        misses.append(f"{appended} events appended for {len(reviews)} changes")
    return {
        "bench": "webhook-quotas",
        "rate": args.rate,
        "duration_seconds": args.duration,
        "teams": args.teams,
        "connections": args.connections,
        "requests": len(latencies),
        "achieved_rate": round(len(latencies) / seconds, 1),
        "appended": appended,
        "errors": errors,
        "p50_ms": round(measure.quantile(latencies, 0.5) or 0.0, 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(max(latencies, default=0.0), 2),
        "service_cpu_cores": round(measure.rate(after.cpu_seconds, before.cpu_seconds, elapsed), 3),
        "quota_service_cpu_cores": round(measure.rate(quota_after.cpu_seconds, quota_before.cpu_seconds, elapsed), 3),
        "service_rss_peak_mib": round(after.rss_peak_bytes / 2**20, 1),
        "quota_service_rss_peak_mib": round(quota_after.rss_peak_bytes / 2**20, 1),
        "startup_seconds": round(startup_seconds, 2),
        "target": f"p99 < {TARGET_QUOTA_P99_MS:g} ms at {TARGET_RATE:g} quota changes/s over TLS",
        "target_held": not misses,
        "target_misses": misses,
        "command": command_line(args),
    }


async def _send_in_order(url: str, trust: Path, reviews: list[tuple[bytes, str]]) -> list[str]:
    """POST each review after the previous one's answer; what went wrong, if anything."""
    context = ssl.create_default_context(cafile=str(trust))
    problems = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        for body, uid in reviews:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                raw = await response.read()
            answer = msgspec.json.decode(raw, type=_Review).response if response.status == 200 else None
            if answer is None or answer.uid != uid or not answer.allowed:
                problems.append(raw[:300].decode(errors="replace"))
    return problems


async def _wait_ready(url: str, service: subprocess.Popen[bytes], service_log: Path) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            if service.poll() is not None:
                raise RuntimeError(f"the webhook exited during start-up:\n{processes.tail(service_log)}")
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the webhook was not ready after 60 s:\n{processes.tail(service_log)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return processes.run_pinned_bench(args, run)


if __name__ == "__main__":
    sys.exit(main())
