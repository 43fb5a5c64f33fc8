"""Checks the chart's safe defaults in every rendering of helm/ci.sh (OUT/<case>.yaml):

- TLS on (but in the `opted-out` case): the Secret the pod mounts is the chart's generated
  kubernetes.io/tls Secret, whose certificate verifies (openssl) against its CA for the
  Service's DNS name, and that CA is in the ConfigMap <fullname>-ca of the release's
  namespace and each allowed namespace; or cert-manager's (a Certificate) or the user's.
- the token audience `spark-pod-allocator` (with auth.mode kubernetes);
- the NetworkPolicy on, ingress to the gRPC port only from the allowed namespaces (and the
  test pod), egress only to the API server (ipBlock peers, TCP) and DNS (53 UDP and TCP);
- the probes: grpc on the health port, the configuration's health.listen, a container port
  named health and not in the Service;
- registrations in the release's namespace, their key Secret (32 bytes) readable by the
  service alone, by name;
- RBAC: exactly the rules of the chart README's RBAC table (resource, verb, where), so the
  table and the chart cannot drift; no wildcard; no list or watch of ConfigMaps outside the
  release's namespace; Secrets only by name.

Usage: check-defaults.py OUT RELEASE_NAMESPACE CHART_README
Exits 1 naming each problem."""
import base64
import os
import re
import subprocess
import sys
import tempfile

import yaml

out, release_ns, readme = sys.argv[1], sys.argv[2], sys.argv[3]
OPTED_OUT = {"opted-out"}
problems = []


def problem(case, text):
    problems.append(f"{case}: {text}")


def readme_rules():
    """{(resource, verb, where)} of the README's RBAC table (where: allowed, release, cluster)."""
    text = open(readme).read()
    section = text.split("\n## RBAC", 1)[1].split("\n## ", 1)[0]
    rules = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        resource, verb = cells[0].strip("`"), cells[1].strip("`")
        where = re.match(r"[a-z]+", cells[2]).group(0)
        rules.add((resource, verb, where))
    if not rules:
        sys.exit(f"{readme}: no RBAC table found")
    return rules


def rendered_rules(case, docs, cluster_wide):
    """{(resource, verb, where)} the rendering grants, where as the README says it."""
    rules = set()
    for doc in docs:
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        ns = doc["metadata"].get("namespace")
        for rule in doc.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                if "*" in rule.get(field, []):
                    problem(case, f"{doc['kind']} {doc['metadata']['name']}: a wildcard in {field}")
            for resource in rule.get("resources", []):
                if resource == "secrets" and (doc["kind"] != "Role" or ns != release_ns or not rule.get("resourceNames")):
                    problem(case, f"{doc['kind']} {doc['metadata']['name']}: secrets without resourceNames, or outside {release_ns}")
                for verb in rule.get("verbs", []):
                    if doc["kind"] == "ClusterRole":
                        reviews = resource in ("tokenreviews", "subjectaccessreviews")
                        where = "cluster" if reviews or resource == "namespaces" else "allowed"
                    elif ns == release_ns and doc["metadata"]["name"].endswith("-registrations"):
                        where = "release"
                    else:
                        where = "allowed"
                    if resource == "configmaps" and where == "allowed" and verb in ("list", "watch"):
                        problem(case, f"{doc['kind']} {doc['metadata']['name']} in {ns}: {verb} configmaps in a tenant namespace")
                    rules.add((resource, verb, where))
    return rules


def check_tls(case, docs, config, deployment, services):
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    if "tls" not in config:
        if case not in OPTED_OUT:
            problem(case, "TLS is off")
        return
    secret_name = volumes["tls"]["secret"]["secretName"]
    secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == secret_name]
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    if certificates:
        return  # validate-monitoring.py checks it against cert-manager's CRD and the mount
    if not secrets:
        if case == "defaults":
            problem(case, f"no generated TLS Secret {secret_name} by default")
        return  # the user's own Secret
    secret = secrets[0]
    if secret.get("type") != "kubernetes.io/tls":
        problem(case, f"Secret {secret_name} is of type {secret.get('type')}")
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    missing = {"tls.crt", "tls.key", "ca.crt"} - set(data)
    if missing:
        problem(case, f"Secret {secret_name} lacks {sorted(missing)}")
        return
    grpc_service = [s for s in services if s["spec"]["ports"][0]["name"] == "grpc"][0]
    host = f"{grpc_service['metadata']['name']}.{release_ns}.svc"
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("tls.crt", "ca.crt"):
            open(os.path.join(tmp, key), "wb").write(data[key])
        verify = subprocess.run(
            ["openssl", "verify", "-purpose", "sslserver", "-verify_hostname", host,
             "-CAfile", os.path.join(tmp, "ca.crt"), os.path.join(tmp, "tls.crt")],
            capture_output=True, text=True)
        if verify.returncode != 0:
            problem(case, f"the certificate does not verify against its CA for {host}: {verify.stdout}{verify.stderr}")
    namespaces = {release_ns, *config.get("allowed_namespaces", [])}
    for ns in sorted(namespaces):
        found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-ca")
                 and d["metadata"].get("namespace") == ns]
        if not found:
            problem(case, f"no CA ConfigMap in namespace {ns}")
        elif found[0]["data"]["ca.crt"].strip() != data["ca.crt"].decode().strip():
            problem(case, f"the CA ConfigMap in {ns} is not the Secret's ca.crt")
    test_pods = [d for d in docs if d["kind"] == "Pod"]
    for pod in test_pods:
        args = pod["spec"]["containers"][0]["args"]
        if "-tls-no-verify" in args or not any(a.startswith("-tls-ca-cert=") for a in args):
            problem(case, f"the test pod does not verify the certificate: {args}")


def check_network_policy(case, docs, config):
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if not policies:
        if case not in OPTED_OUT:
            problem(case, "no NetworkPolicy")
        return
    spec = policies[0]["spec"]
    if sorted(spec.get("policyTypes", [])) != ["Egress", "Ingress"]:
        problem(case, f"policyTypes {spec.get('policyTypes')}")
    egress = spec.get("egress", [])
    if len(egress) != 3:
        problem(case, f"{len(egress)} egress rules, not 3 (API server, DNS, the other replicas)")
    deployment = next((d for d in docs if d["kind"] == "Deployment"), None)
    replicas = [{"podSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}}] \
        if deployment else None
    for rule in egress:
        if not rule.get("to") or not rule.get("ports"):
            problem(case, f"an egress rule open to every destination or port: {rule}")
            continue
        ports = {(p.get("port"), p.get("protocol")) for p in rule["ports"]}
        if rule["to"] == replicas:
            # The other replicas' gRPC port only (forwarded calls).
            if ports != {("grpc", "TCP")}:
                problem(case, f"the replicas' rule admits {ports}")
        elif all("ipBlock" in peer for peer in rule["to"]):
            if any(protocol != "TCP" for _, protocol in ports):
                problem(case, f"the API server rule admits {ports}")
        elif ports != {(53, "UDP"), (53, "TCP")}:
            problem(case, f"the DNS rule admits {ports}")
    for rule in spec.get("ingress", []):
        if not rule.get("ports") or not rule.get("from"):
            problem(case, f"an ingress rule open to every source or port: {rule}")
    grpc = [r for r in spec.get("ingress", []) if {p["port"] for p in r.get("ports", [])} == {"grpc"}]
    allowed = config.get("allowed_namespaces", [])
    for peer in grpc[0]["from"] if grpc else []:
        selector = peer.get("namespaceSelector")
        if selector == {} and allowed:
            problem(case, "the gRPC port admits every namespace, though allowedNamespaces is set")
        for expression in (selector or {}).get("matchExpressions", []):
            if expression["key"] == "kubernetes.io/metadata.name" and expression["values"] != allowed:
                problem(case, f"the gRPC port admits {expression['values']}, not {allowed}")
    if not grpc:
        problem(case, "no ingress rule for the gRPC port")


def check_probes(case, config, deployment, services):
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    listen = (config.get("health") or {}).get("listen")
    if not listen:
        if case not in OPTED_OUT:
            problem(case, "no health listener")
        return
    port = int(listen.rsplit(":", 1)[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if (container[probe].get("grpc") or {}).get("port") != port:
            problem(case, f"{probe} is not a gRPC probe of the health port {port}: {container[probe]}")
    if {"name": "health", "containerPort": port, "protocol": "TCP"} not in container["ports"]:
        problem(case, f"no container port health {port}")
    for service in services:
        if any(p.get("targetPort") in ("health", port) for p in service["spec"]["ports"]):
            problem(case, f"Service {service['metadata']['name']} exposes the health port")


def check_registrations(case, docs, config):
    registrations = config.get("registrations") or {}
    if registrations.get("namespace") != release_ns:
        problem(case, f"registrations.namespace is {registrations.get('namespace')!r}, not {release_ns}")
    name = registrations.get("key_secret")
    granted = [
        rule for d in docs if d["kind"] == "Role" and d["metadata"].get("namespace") == release_ns
        for rule in d.get("rules", []) if "secrets" in rule.get("resources", [])
    ]
    if any(d["kind"] in ("Role", "ClusterRole") for d in docs) and (
            len(granted) != 1 or granted[0].get("resourceNames") != [name] or granted[0]["verbs"] != ["get"]):
        problem(case, f"the key Secret {name} is not granted as get by name alone: {granted}")
    secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    if secrets and len(base64.b64decode(secrets[0]["data"]["key"])) != 32:
        problem(case, f"Secret {name}: the key is not 32 bytes")
    if case == "defaults" and not secrets:
        problem(case, f"no key Secret {name} by default")


documented = readme_rules()
for name in sorted(os.listdir(out)):
    if not name.endswith(".yaml"):
        continue
    case = name[: -len(".yaml")]
    docs = [d for d in yaml.safe_load_all(open(os.path.join(out, name))) if d]
    config_maps = [d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in (d.get("data") or {})]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    if not config_maps or not deployments:
        continue
    config = yaml.safe_load(config_maps[0]["data"]["config.yaml"])
    deployment = deployments[0]
    services = [d for d in docs if d["kind"] == "Service"]
    check_tls(case, docs, config, deployment, services)
    check_network_policy(case, docs, config)
    check_probes(case, config, deployment, services)
    check_registrations(case, docs, config)
    auth = config["auth"]
    if auth["mode"] == "kubernetes" and case not in OPTED_OUT and auth["audiences"] != ["spark-pod-allocator"]:
        problem(case, f"auth.audiences is {auth['audiences']}")
    if any(d["kind"] in ("Role", "ClusterRole") for d in docs):
        cluster_wide = any(d["kind"] == "ClusterRole" and not d["metadata"]["name"].endswith("-reviews") for d in docs)
        granted = rendered_rules(case, docs, cluster_wide)
        expected = {
            (resource, verb, where) for resource, verb, where in documented
            if (where != "cluster" or resource != "namespaces" or cluster_wide)
            and (auth["mode"] == "kubernetes" or resource not in ("tokenreviews", "subjectaccessreviews"))
        }
        for rule in sorted(granted - expected):
            problem(case, f"grants {rule}, which the README's RBAC table does not list")
        for rule in sorted(expected - granted):
            problem(case, f"the README's RBAC table lists {rule}, which the chart does not grant")
    print(f"{case}: checked")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
