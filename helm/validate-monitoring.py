"""Checks the chart's custom resources, which kubernetes-validate has no schema for: the
prometheus-operator objects (monitoring.coreos.com/v1) and cert-manager's Certificate
(cert-manager.io/v1). helm/ci.sh passes it every rendered manifest file; it validates each
PodMonitor, ServiceMonitor and PrometheusRule against the openAPIV3Schema of its
CustomResourceDefinition (from CRD_DIR, the prometheus-operator module's
example/prometheus-operator-crd) and each Certificate against cert-manager's (from
CERT_MANAGER_CRD_DIR, the cert-manager module's deploy/crds), strictly: a field the schema
does not declare fails, as kubernetes-validate --strict does for built-in kinds. A monitor
must also select the rendered metrics Service or allocator pod, by a port name that one
declares; a Certificate must write the Secret the pod mounts and cover the Service's name.

Usage: validate-monitoring.py CRD_DIR CERT_MANAGER_CRD_DIR MANIFEST...
Prints one line per object checked; exits 1 naming each problem."""
import os
import sys

import jsonschema
import yaml

GROUP_VERSION = "monitoring.coreos.com/v1"
CRD_FILES = {
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}
CERT_MANAGER_VERSION = "cert-manager.io/v1"
CERT_MANAGER_FILES = {"Certificate": "cert-manager.io_certificates.yaml"}


def strict(schema):
    """The schema with additionalProperties: false on every object that lists its
    properties and neither allows other keys nor preserves unknown fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        schema.get("type") == "object"
        and isinstance(schema.get("properties"), dict)
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schema(crd_dir, kind, files=CRD_FILES):
    crd = yaml.safe_load(open(os.path.join(crd_dir, files[kind])))
    for version in crd["spec"]["versions"]:
        if version["name"] == "v1":
            return strict(version["schema"]["openAPIV3Schema"])
    raise SystemExit(f"{files[kind]}: no v1 version")


def selects(selector, labels):
    wanted = (selector or {}).get("matchLabels") or {}
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def main():
    crd_dir, cert_manager_dir, manifests = sys.argv[1], sys.argv[2], sys.argv[3:]
    schemas = {kind: crd_schema(crd_dir, kind) for kind in CRD_FILES}
    cert_manager = {
        kind: crd_schema(cert_manager_dir, kind, CERT_MANAGER_FILES) for kind in CERT_MANAGER_FILES
    }
    problems = []
    checked = 0
    for path in manifests:
        docs = [doc for doc in yaml.safe_load_all(open(path)) if doc]
        services = [d for d in docs if d.get("kind") == "Service"]
        pod_templates = [
            d["spec"]["template"] for d in docs if d.get("kind") == "Deployment"
        ]
        for doc in docs:
            group_version = doc.get("apiVersion")
            if group_version not in (GROUP_VERSION, CERT_MANAGER_VERSION):
                continue
            known = schemas if group_version == GROUP_VERSION else cert_manager
            kind = doc.get("kind")
            where = f"{path}: {kind} {doc.get('metadata', {}).get('name')}"
            if kind not in known:
                problems.append(f"{where}: no CRD schema known for this kind")
                continue
            checked += 1
            before = len(problems)
            validator = jsonschema.Draft7Validator(known[kind])
            for error in sorted(validator.iter_errors(doc), key=str):
                field = ".".join(str(p) for p in error.absolute_path) or "(root)"
                problems.append(f"{where}: {field}: {error.message}")
            spec = doc.get("spec") or {}
            if kind == "ServiceMonitor":
                matched = [s for s in services if selects(spec.get("selector"), s["metadata"].get("labels") or {})]
                if len(matched) != 1:
                    problems.append(f"{where}: selects {len(matched)} of the rendered Services, not 1")
                    continue
                ports = {p.get("name") for p in matched[0]["spec"]["ports"]}
                for endpoint in spec.get("endpoints", []):
                    if endpoint.get("port") not in ports:
                        problems.append(f"{where}: port {endpoint.get('port')!r} is not a port of Service {matched[0]['metadata']['name']}")
            elif kind == "PodMonitor":
                matched = [t for t in pod_templates if selects(spec.get("selector"), t["metadata"].get("labels") or {})]
                if len(matched) != 1:
                    problems.append(f"{where}: selects {len(matched)} of the rendered pod templates, not 1")
                    continue
                ports = {p.get("name") for c in matched[0]["spec"]["containers"] for p in c.get("ports", [])}
                for endpoint in spec.get("podMetricsEndpoints", []):
                    if endpoint.get("port") not in ports:
                        problems.append(f"{where}: port {endpoint.get('port')!r} is not a container port of the selected pod")
            elif kind == "Certificate":
                mounted = {
                    v["secret"]["secretName"]
                    for t in pod_templates
                    for v in t["spec"].get("volumes", [])
                    if v.get("name") == "tls" and "secret" in v
                }
                if spec.get("secretName") not in mounted:
                    problems.append(f"{where}: writes Secret {spec.get('secretName')!r}, the pod mounts {sorted(mounted)}")
                for service in services:
                    name = f"{service['metadata']['name']}.{doc['metadata']['namespace']}.svc"
                    if service["spec"].get("ports", [{}])[0].get("name") == "grpc" and name not in spec.get("dnsNames", []):
                        problems.append(f"{where}: dnsNames lack the Service's name {name}")
            elif kind == "PrometheusRule":
                rules = [r for g in spec.get("groups", []) for r in g.get("rules", [])]
                if not rules:
                    problems.append(f"{where}: no rule")
            if len(problems) == before:
                print(f"{where}: valid against its CRD schema")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print(f"{checked} monitoring.coreos.com and cert-manager.io objects checked")


main()
