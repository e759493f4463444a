"""The chart's admission webhook configurations and their certificate (issue 24 point 4), rendered by Helm's own
engine like the rest of the chart (tests/deploy/test_helm.py): off by default; on with each certificate mode (the
hook Job, cert-manager, a Secret of the user's); every object validated against the Kubernetes 1.30 schemas, except
cert-manager's Issuer and Certificate, which are not in them: those are checked against the small schema below of the
fields the chart sets (cert-manager.io/v1), and their metadata against Kubernetes' ObjectMeta.

What the configurations promise is checked on the objects: which namespaces they leave out (the selectors are
evaluated), timeouts, failure policies, and that each call reaches the Deployment's HTTPS port on a route the webhook
serves (the paths are the webhook's own constants).
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest

from koordbus import cli
from services.common import settings as settings_loader
from services.common import x509
from services.common.metrics import CollectorRegistry
from services.webhook import service as webhook_service
from services.webhook.settings import WebhookSettings
from tests.deploy.test_helm import CHART, DEFAULTS, KUBERNETES, by_kind, render

VALIDATE_ELASTICQUOTAS = webhook_service.VALIDATE_ELASTICQUOTAS
"""The ElasticQuota route (issue 24 point 2); until the webhook has its constant, the chart's default path."""
RELEASE_NAMESPACE = "koordbus"
NAME = "prod-koordbus-webhook"
SECRET = "prod-koordbus-webhook-tls"
CONFIGURATION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
CERT_MANAGER_KINDS = ("Issuer", "Certificate")

PAIR = x509.issue_serving_pair(
    dns_names=x509.service_dns_names(NAME, RELEASE_NAMESPACE),
    now=datetime(2025, 1, 1, tzinfo=UTC),
    days=3650,
    ca_seed=bytes(range(32)),
    serving_seed=bytes(range(1, 33)),
    ca_serial=1,
    serving_serial=2,
)
ON: dict[str, Any] = {
    **DEFAULTS,
    "services": {"webhook": {"enabled": True}},
    "webhook": {"elasticquotas": {"enabled": True}},  # every webhook, to check them all
}
MODES: dict[str, dict[str, Any]] = {
    "job": ON,
    "cert-manager": {**ON, "webhook": {**ON["webhook"], "certManager": {"enabled": True}}},
    "secret": {**ON, "webhook": {**ON["webhook"], "tls": {"secretName": "my-webhook-tls", "caBundle": PAIR.ca_crt}}},
}

# --- cert-manager's kinds: the fields the chart uses, as cert-manager.io/v1 declares them

_STRING = {"type": "string"}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
_ISSUER_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {"name": _STRING, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": _STRING},
}
_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement", "data encipherment",
    "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth", "client auth", "code signing",
    "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
]  # fmt: skip
CERT_MANAGER_SPECS: dict[str, dict[str, Any]] = {
    "Issuer": {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,  # exactly one issuer type
        "additionalProperties": False,
        "properties": {
            "selfSigned": {"type": "object", "additionalProperties": False, "properties": {}},
            "ca": {
                "type": "object",
                "required": ["secretName"],
                "additionalProperties": False,
                "properties": {"secretName": _STRING},
            },
        },
    },
    "Certificate": {
        "type": "object",
        "required": ["secretName", "issuerRef"],
        "additionalProperties": False,
        "properties": {
            "secretName": _STRING,
            "commonName": {"type": "string", "maxLength": 64},
            "dnsNames": {"type": "array", "minItems": 1, "items": _STRING},
            "duration": _DURATION,
            "renewBefore": _DURATION,
            "isCA": {"type": "boolean"},
            "usages": {"type": "array", "items": {"enum": _USAGES}},
            "privateKey": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                    "size": {"type": "integer"},
                    "encoding": {"enum": ["PKCS1", "PKCS8"]},
                    "rotationPolicy": {"enum": ["Never", "Always"]},
                },
            },
            "issuerRef": _ISSUER_REF,
        },
    },
}


def validate(obj: dict[str, Any]) -> None:
    """Kubernetes' own kinds against the 1.30 schemas (strict); cert-manager's against CERT_MANAGER_SPECS."""
    if obj["kind"] in CERT_MANAGER_KINDS:
        assert obj["apiVersion"] == "cert-manager.io/v1" and set(obj) == {"apiVersion", "kind", "metadata", "spec"}
        meta_only = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        kubernetes_validate.validate(meta_only, KUBERNETES, strict=True)
        jsonschema.validate(obj["spec"], CERT_MANAGER_SPECS[obj["kind"]])
    else:
        assert not obj["apiVersion"].startswith("cert-manager.io/"), obj["kind"]
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) evaluated as kube-apiserver does; {} selects everything."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def namespace(name: str) -> dict[str, str]:
    """A Namespace's labels as kube-apiserver sets them (kubernetes.io/metadata.name, since 1.21)."""
    return {"kubernetes.io/metadata.name": name}


def webhooks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every webhook of the release's configurations by name."""
    return {
        w["name"]: w for kind in CONFIGURATION_KINDS for c in by_kind(objects, kind).values() for w in c["webhooks"]
    }


def webhook_container(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], WebhookSettings]:
    """The webhook Deployment's container, and the settings the process makes of its (literal) environment."""
    (container,) = by_kind(objects, "Deployment")[NAME]["spec"]["template"]["spec"]["containers"]
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return container, settings_loader.load(WebhookSettings, env=literal)


def test_webhooks_off_render_no_webhook_object() -> None:
    for values in (DEFAULTS, {**DEFAULTS, "webhook": {"certManager": {"enabled": True}}}):
        objects = render(values)
        assert not [o for o in objects if o["kind"] in (*CONFIGURATION_KINDS, *CERT_MANAGER_KINDS)]
        assert not [o for o in objects if "webhook" in o["metadata"]["name"]]
    # the service on, every webhook off: the Deployment and its certificate, no configuration to call it
    off = {"pods": {"enabled": False}, "configmaps": {"enabled": False}, "elasticquotas": {"enabled": False}}
    objects = render({**ON, "webhook": off})
    for obj in objects:
        validate(obj)
    assert not [o for o in objects if o["kind"] in CONFIGURATION_KINDS]
    args = by_kind(objects, "Job")["prod-koordbus-webhook-certs"]["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = cli.build_parser().parse_args(args)
    assert (parsed.secret, parsed.mutating, parsed.validating) == (SECRET, [], [])
    assert "prod-koordbus-webhook-certs" not in by_kind(objects, "ClusterRole")  # nothing cluster-wide to patch


@pytest.mark.parametrize("mode", MODES)
def test_every_object_is_valid_with_the_webhooks_on(mode: str) -> None:
    objects = render(MODES[mode])
    for obj in objects:
        validate(obj)
    assert set(webhooks(objects)) == {
        "mutate-pods.koordbus.io",
        "validate-configmaps.koordbus.io",
        "validate-elasticquotas.koordbus.io",
    }
    assert set(by_kind(objects, "MutatingWebhookConfiguration")) == {NAME}
    assert set(by_kind(objects, "ValidatingWebhookConfiguration")) == {NAME}
    assert bool(by_kind(objects, "Certificate")) is (mode == "cert-manager")
    assert ("prod-koordbus-webhook-certs" in by_kind(objects, "Job")) is (mode == "job")


@pytest.mark.parametrize("mode", MODES)
def test_each_webhook_calls_the_deployments_https_port_on_a_route_the_webhook_serves(mode: str) -> None:
    objects = render(MODES[mode])
    pod = by_kind(objects, "Deployment")[NAME]["spec"]["template"]
    container, settings = webhook_container(objects)
    service = by_kind(objects, "Service")[NAME]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # the routes a webhook process with this environment serves (the constructor only builds the table)
    process = webhook_service.WebhookService(None, settings, registry=CollectorRegistry())  # type: ignore[arg-type]
    served = set(process.routes)
    served.add(VALIDATE_ELASTICQUOTAS)  # given by the composition root once the quota service answers (point 2)
    paths = {}
    for name, webhook in webhooks(objects).items():
        called = webhook["clientConfig"]["service"]
        assert (called["name"], called["namespace"]) == (NAME, RELEASE_NAMESPACE), name
        assert "url" not in webhook["clientConfig"]
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == called["port"]]
        assert container_ports[port["targetPort"]] == settings.webhook_port == 9443, name
        paths[name] = called["path"]
    assert paths == {
        "mutate-pods.koordbus.io": webhook_service.MUTATE_PODS,
        "validate-configmaps.koordbus.io": webhook_service.VALIDATE_CONFIGMAPS,
        "validate-elasticquotas.koordbus.io": VALIDATE_ELASTICQUOTAS,
    }
    assert set(paths.values()) <= served
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == ("my-webhook-tls" if mode == "secret" else SECRET)


def test_the_namespaces_and_objects_each_webhook_is_sent() -> None:
    hooks = webhooks(render(ON))
    for name in ("mutate-pods.koordbus.io", "validate-elasticquotas.koordbus.io"):
        selector = hooks[name]["namespaceSelector"]
        assert not selects(selector, namespace("kube-system")), name
        assert not selects(selector, namespace(RELEASE_NAMESPACE)), name  # the webhook's own pods never wait for it
        assert selects(selector, namespace("spark")) and selects(selector, namespace("koordinator-system")), name
    pods = hooks["mutate-pods.koordbus.io"]
    assert pods["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
         "scope": "Namespaced"},
    ]  # fmt: skip
    assert pods["reinvocationPolicy"] == "Never"
    assert selects(pods["objectSelector"], {"job-name": "pi"})
    assert not selects(pods["objectSelector"], {"koordbus.io/skip-admission": "true"})  # a Pod opts out

    configmaps = hooks["validate-configmaps.koordbus.io"]
    assert configmaps["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert configmaps["rules"][0]["resources"] == ["configmaps"]
    selector = configmaps["namespaceSelector"]
    assert [
        n for n in ("koordinator-system", "kube-system", RELEASE_NAMESPACE, "spark") if selects(selector, namespace(n))
    ] == ["koordinator-system"]
    assert configmaps["matchConditions"] == [
        {"name": "slo-controller-config", "expression": "object.metadata.name == 'slo-controller-config'"}
    ]

    quotas = hooks["validate-elasticquotas.koordbus.io"]
    assert quotas["rules"] == [
        {"apiGroups": ["scheduling.sigs.k8s.io"], "apiVersions": ["v1alpha1"],
         "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["elasticquotas"], "scope": "Namespaced"},
    ]  # fmt: skip
    mirror = f"system:serviceaccount:{RELEASE_NAMESPACE}:prod-koordbus-k8s"
    assert quotas["matchConditions"] == [  # the bridge's own writes are what the quota log already holds
        {"name": "not-the-quota-mirror", "expression": f"request.userInfo.username != '{mirror}'"}
    ]
    deployment = by_kind(render(ON), "Deployment")[NAME]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOORDBUS_WEBHOOK_QUOTA_MIRROR_USERS"] == mirror  # the webhook lets the same user through
    quota_crd = (CHART / "crds" / "scheduling.sigs.k8s.io_elasticquotas.yaml").read_text()
    assert "group: scheduling.sigs.k8s.io" in quota_crd and "name: v1alpha1" in quota_crd


def test_timeouts_and_failure_policies_are_the_documented_ones() -> None:
    """Ignore for Pods (an outage must not stop Pod creation cluster-wide), Fail for the slo-controller-config and
    ElasticQuotas (a broken config, an edit the quota log never saw, are kept out); every timeout well under
    kube-apiserver's maximum of 30 s."""
    hooks = webhooks(render(ON))
    policies = {name: hook["failurePolicy"] for name, hook in hooks.items()}
    assert policies == {
        "mutate-pods.koordbus.io": "Ignore",
        "validate-configmaps.koordbus.io": "Fail",
        "validate-elasticquotas.koordbus.io": "Fail",
    }
    side_effects = {name: hook["sideEffects"] for name, hook in hooks.items()}
    assert side_effects == {  # the quota webhook appends the change to the quota log, a dry run only checks it
        "mutate-pods.koordbus.io": "None",
        "validate-configmaps.koordbus.io": "None",
        "validate-elasticquotas.koordbus.io": "NoneOnDryRun",
    }
    for name, hook in hooks.items():
        assert 1 <= hook["timeoutSeconds"] <= 10, name
        assert hook["admissionReviewVersions"] == ["v1"], name
        assert hook["matchPolicy"] == "Equivalent", name
    assert not by_kind(render(MODES["job"]), "ValidatingWebhookConfiguration")[NAME]["webhooks"][0]["clientConfig"].get(
        "caBundle"
    )  # the hook Job patches it in
    # all three on by default once the webhook runs
    assert set(webhooks(render({**DEFAULTS, "services": ON["services"]}))) == set(policies)


def test_each_webhook_is_toggled_and_tuned_in_values() -> None:
    values = {
        **ON,
        "webhook": {
            "pods": {"failurePolicy": "Fail", "timeoutSeconds": 3, "reinvocationPolicy": "IfNeeded", "path": "/p"},
            "configmaps": {"enabled": False},
            "elasticquotas": {"enabled": True, "path": "/validate-quotas", "failurePolicy": "Ignore"},
            "excludeNamespaces": ["kube-system", "monitoring"],
        },
    }
    objects = render(values)
    for obj in objects:
        validate(obj)
    hooks = webhooks(objects)
    assert set(hooks) == {"mutate-pods.koordbus.io", "validate-elasticquotas.koordbus.io"}
    pods = hooks["mutate-pods.koordbus.io"]
    assert (pods["failurePolicy"], pods["timeoutSeconds"], pods["reinvocationPolicy"]) == ("Fail", 3, "IfNeeded")
    assert pods["clientConfig"]["service"]["path"] == "/p"
    assert not selects(pods["namespaceSelector"], namespace("monitoring"))
    quotas = hooks["validate-elasticquotas.koordbus.io"]
    assert (quotas["clientConfig"]["service"]["path"], quotas["failurePolicy"]) == ("/validate-quotas", "Ignore")
    assert not selects(quotas["namespaceSelector"], namespace(RELEASE_NAMESPACE))

    only_pods = render({**ON, "webhook": {"configmaps": {"enabled": False}, "elasticquotas": {"enabled": False}}})
    assert not by_kind(only_pods, "ValidatingWebhookConfiguration")
    role = by_kind(only_pods, "ClusterRole")["prod-koordbus-webhook-certs"]
    assert role["rules"][0]["resources"] == ["mutatingwebhookconfigurations"]
    job = by_kind(only_pods, "Job")["prod-koordbus-webhook-certs"]
    args = cli.build_parser().parse_args(job["spec"]["template"]["spec"]["containers"][0]["args"])
    assert (args.mutating, args.validating) == ([NAME], [])


def test_the_configmap_webhook_and_the_webhook_check_the_same_configmap() -> None:
    values = {**ON, "webhook": {"configmaps": {"namespace": "koordbus-config", "name": "colocation"}}}
    objects = render(values)
    hook = webhooks(objects)["validate-configmaps.koordbus.io"]
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["koordbus-config"]
    assert hook["matchConditions"][0]["expression"] == "object.metadata.name == 'colocation'"
    _container, settings = webhook_container(objects)
    assert (settings.configmap_namespace, settings.configmap_name) == ("koordbus-config", "colocation")
    _container, default = webhook_container(render(ON))
    assert (default.configmap_namespace, default.configmap_name) == ("koordinator-system", "slo-controller-config")


def test_the_hook_job_makes_the_secret_and_may_patch_only_the_two_configurations() -> None:
    objects = render(MODES["job"])
    jobs = by_kind(objects, "Job")
    job = jobs["prod-koordbus-webhook-certs"]
    hooks = job["metadata"]["annotations"]["helm.sh/hook"].split(",")
    # before the Deployment starts (it mounts the Secret) and after the configurations exist (to patch them)
    assert {"pre-install", "pre-upgrade", "post-install", "post-upgrade"} == set(hooks)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        container["image"] == by_kind(objects, "Deployment")[NAME]["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    args = cli.build_parser().parse_args(container["args"])
    assert (args.command, args.action, args.service, args.namespace) == ("certs", "webhook", NAME, RELEASE_NAMESPACE)
    assert (args.secret, args.mutating, args.validating) == (SECRET, [NAME], [NAME])
    assert args.days == 3650 and args.renew_before_days == 90
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]  # tempfile's directory
    account = pod["serviceAccountName"]
    assert pod.get("automountServiceAccountToken", True) is True

    role = by_kind(objects, "Role")[account]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    cluster_role = by_kind(objects, "ClusterRole")[account]
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "resourceNames": [NAME],
            "verbs": ["get", "patch"],
        }
    ]
    for kind, ref_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = by_kind(objects, kind)[account]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind, "name": account}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}]
    for obj in objects:
        if obj["metadata"]["name"] == account:
            annotations = obj["metadata"]["annotations"]
            assert annotations["helm.sh/hook"] == job["metadata"]["annotations"]["helm.sh/hook"], obj["kind"]
            assert int(annotations["helm.sh/hook-weight"]) <= int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    for configuration in (by_kind(objects, kind)[NAME] for kind in CONFIGURATION_KINDS):
        assert "annotations" not in configuration["metadata"]
        assert not [w for w in configuration["webhooks"] if "caBundle" in w["clientConfig"]]


def test_cert_manager_makes_the_certificate_and_injects_its_ca() -> None:
    objects = render(MODES["cert-manager"])
    certificates, issuers = by_kind(objects, "Certificate"), by_kind(objects, "Issuer")
    serving = certificates[NAME]["spec"]
    assert serving["secretName"] == SECRET
    assert serving["dnsNames"] == x509.service_dns_names(NAME, RELEASE_NAMESPACE)
    assert "server auth" in serving["usages"]
    # the chart's own chain: self-signed Issuer → CA Certificate → CA Issuer → the serving Certificate
    ca_issuer = issuers[serving["issuerRef"]["name"]]
    (ca,) = [c for c in certificates.values() if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert ca["spec"]["isCA"] is True
    assert issuers[ca["spec"]["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}
    for kind in CONFIGURATION_KINDS:
        configuration = by_kind(objects, kind)[NAME]
        injected = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert injected == f"{RELEASE_NAMESPACE}/{NAME}"  # the serving Certificate: its Secret's ca.crt
        assert not [w for w in configuration["webhooks"] if "caBundle" in w["clientConfig"]]
    assert not [o for o in objects if o["metadata"]["name"] == "prod-koordbus-webhook-certs"]

    issuer_ref = {"name": "corporate-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    values = {**ON, "webhook": {"certManager": {"enabled": True, "issuerRef": issuer_ref}}}
    objects = render(values)
    for obj in objects:
        validate(obj)
    assert set(by_kind(objects, "Certificate")) == {NAME} and not by_kind(objects, "Issuer")
    assert by_kind(objects, "Certificate")[NAME]["spec"]["issuerRef"] == issuer_ref


def test_a_certificate_of_the_users_comes_with_its_ca_as_pem_or_base64() -> None:
    encoded = base64.b64encode(PAIR.ca_crt.encode()).decode()
    for given in (PAIR.ca_crt, PAIR.ca_crt.strip(), encoded):
        values = {**ON, "webhook": {"tls": {"secretName": "my-webhook-tls", "caBundle": given}}}
        objects = render(values)
        for hook in webhooks(objects).values():
            assert x509.pem_certificates(base64.b64decode(hook["clientConfig"]["caBundle"]).decode()) == [PAIR.ca_crt]
        assert not by_kind(objects, "Certificate") and "prod-koordbus-webhook-certs" not in by_kind(objects, "Job")
        assert not [o for o in objects if "annotations" in o["metadata"] and o["kind"] in CONFIGURATION_KINDS]


def test_what_cannot_work_is_refused_at_render_with_the_reason() -> None:
    refused = {
        r"webhook.tls.secretName needs webhook.tls.caBundle": {"tls": {"secretName": "mine"}},
        r"webhook.certManager.enabled and webhook.tls.secretName exclude each other": {
            "certManager": {"enabled": True},
            "tls": {"secretName": "mine", "caBundle": PAIR.ca_crt},
        },
        r"webhook.pods.timeoutSeconds must be 1–30": {"pods": {"timeoutSeconds": 31}},
        r"webhook.configmaps.timeoutSeconds must be 1–30": {"configmaps": {"timeoutSeconds": 0}},
        r"webhook.elasticquotas.failurePolicy must be Ignore or Fail, got Retry": {
            "elasticquotas": {"enabled": True, "failurePolicy": "Retry"}
        },
        r"webhook.pods.reinvocationPolicy must be Never or IfNeeded": {"pods": {"reinvocationPolicy": "Always"}},
    }
    for message, webhook in refused.items():
        with pytest.raises(Exception, match=message):
            render({**ON, "webhook": webhook})


def test_helm_lint_finds_nothing_wrong_with_the_webhooks_on() -> None:
    for values in MODES.values():
        report = helm_python.lint(CHART, values=values)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] > 1] == []
