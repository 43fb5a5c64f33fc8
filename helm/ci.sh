#!/usr/bin/env bash
# Checks the Helm chart: lint (strict), render with the defaults and with every value set
# (ci/full-values.yaml), values the schema must refuse, the safe defaults (TLS with a
# certificate that verifies against the published CA, the token audience, the NetworkPolicy
# and its egress, probes on the health port, RBAC limited as the chart README's table says),
# the `restricted` Pod Security essentials of every pod, and every rendered manifest against
# the Kubernetes OpenAPI schema (kubernetes-validate, strict, offline), the
# prometheus-operator objects and cert-manager's Certificate against their CRDs' schemas,
# the alerts' unit tests (promtool), and the service started with each rendered
# configuration. Installs helm from the Go module proxy into .tools/bin (built once, reused
# while its version matches), promtool from Debian's prometheus package into .tools/bin
# (the binary only) and kubernetes-validate into .venv-validate; reads the CRDs from the
# prometheus-operator and cert-manager Go modules (in Go's module cache). Needs Go,
# Python 3, OpenSSL, apt and, the first time, network access to the registries.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

helm_version=v3.22.0
kube_version=1.33.0   # the Kubernetes API the service is built against (k8s-openapi v1_33)
# The CRDs of PodMonitor, ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1).
prometheus_operator_version=v0.85.0
# The CRD of Certificate (cert-manager.io/v1).
cert_manager_version=v1.19.1
chart=helm/spark-pod-allocator
helm="$root/.tools/bin/helm"

step() { printf '\n==> %s\n' "$*"; }

step "helm $helm_version"
# A `go install`ed helm reports only its minor version; the module version is in the build
# information of the binary.
build_info=""
if [ -x "$helm" ]; then
  build_info=$(go version -m "$helm" 2>/dev/null || true)
fi
case "$build_info" in
  *$'\tmod\thelm.sh/helm/v3\t'"$helm_version"$'\t'*) installed=yes ;;
  *) installed=no ;;
esac
if [ "$installed" = no ]; then
  echo "building helm $helm_version from the Go module proxy (takes minutes)"
  GOBIN="$root/.tools/bin" GOFLAGS=-buildvcs=false go install "helm.sh/helm/v3/cmd/helm@$helm_version"
fi
echo "helm $helm_version: $helm"

step "kubernetes-validate"
if [ ! -x .venv-validate/bin/kubernetes-validate ]; then
  python3 -m venv .venv-validate
  .venv-validate/bin/pip install --quiet --disable-pip-version-check kubernetes-validate
fi

step "promtool (Debian's prometheus package)"
promtool="$root/.tools/bin/promtool"
if [ ! -x "$promtool" ]; then
  # Only the promtool binary is taken from the package: no server is installed or started.
  deb_dir=$(mktemp -d)
  chmod 755 "$deb_dir"
  if ! (cd "$deb_dir" && apt-get download prometheus); then
    apt-get update -qq
    (cd "$deb_dir" && apt-get download prometheus)
  fi
  dpkg-deb -x "$deb_dir"/prometheus_*.deb "$deb_dir/package"
  mkdir -p "$root/.tools/bin"
  cp "$deb_dir/package/usr/bin/promtool" "$promtool"
  rm -rf "$deb_dir"
fi
promtool_version=$("$promtool" --version 2>&1)
printf '%s\n' "${promtool_version%%$'\n'*}"

step "prometheus-operator $prometheus_operator_version CRDs (Go module)"
# `go mod download` fetches the module once into Go's module cache; only its CRD files are read.
module_json=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$prometheus_operator_version")
module_dir=$(printf '%s' "$module_json" | .venv-validate/bin/python -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
crd_dir="$module_dir/example/prometheus-operator-crd"
ls "$crd_dir"/monitoring.coreos.com_{podmonitors,servicemonitors,prometheusrules}.yaml

step "cert-manager $cert_manager_version Certificate CRD (Go module)"
module_json=$(go mod download -json "github.com/cert-manager/cert-manager@$cert_manager_version")
module_dir=$(printf '%s' "$module_json" | .venv-validate/bin/python -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
cert_manager_crd_dir="$module_dir/deploy/crds"
ls "$cert_manager_crd_dir"/cert-manager.io_certificates.yaml

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

step "helm lint --strict (defaults, full values)"
"$helm" lint --strict "$chart" --set 'allowedNamespaces={spark}'
"$helm" lint --strict "$chart" -f "$chart/ci/full-values.yaml"

step "helm template (defaults, full values, a Role per namespace)"
render() {
  local name=$1
  shift
  "$helm" template ci "$chart" --namespace spark-system --kube-version "$kube_version" "$@" \
    >"$out/$name.yaml"
  echo "$name: rendered"
}
# allowedNamespaces is the one value without a default (unless rbac.clusterWide).
# With metrics on, the default NetworkPolicy needs to know who scrapes.
scraper=(--set-json 'metrics.networkPolicy.scraperPodSelector={"matchLabels":{"app.kubernetes.io/name":"prometheus"}}')
render defaults --set 'allowedNamespaces={spark}'
render full -f "$chart/ci/full-values.yaml"
render namespaces --set 'allowedNamespaces={spark-a,spark-b}'
render cluster-wide --set rbac.clusterWide=true
render cert-manager --set 'allowedNamespaces={spark}' --set tls.certManager.enabled=true \
  --set tls.certManager.issuerRef.name=spark-ca
# Every safe default turned off: plaintext, no separate health listener, no NetworkPolicy.
render one-replica --set 'allowedNamespaces={spark}' --set replicaCount=1
render opted-out --set 'allowedNamespaces={spark}' --set tls.enabled=false --set health.port=null \
  --set networkPolicy.enabled=false --set-json 'config.auth.audiences=[]'
render no-auth --set 'allowedNamespaces={spark}' --set config.auth.mode=none \
  --set config.auth.allow_unauthenticated_remote=true
render external-account --set serviceAccount.create=false --set serviceAccount.name=existing \
  --set rbac.create=false --set replicaCount=0 --set 'allowedNamespaces={spark}'
# Metrics with the default NetworkPolicy and no scraper named: the metrics port is open to
# every namespace (the metrics name no application), as `helm lint --strict` lets through.
render metrics-network-policy --set 'allowedNamespaces={spark}' --set metrics.enabled=true \
  --set metrics.serviceMonitor.enabled=true
render pod-monitor --set 'allowedNamespaces={spark}' --set metrics.enabled=true \
  --set metrics.podMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
  --set metrics.dashboard.enabled=true "${scraper[@]}"

step "an upgrade keeps the generated certificate and the registrations' key (lookup answered from the first rendering)"
# helm template has no cluster, so `lookup` finds nothing. In a copy of the chart, each
# `lookup "v1" "Secret" …` answers the Secret of that name from the defaults' rendering, as
# the cluster would after the install: an upgrade must render them unchanged, and a new
# certificate (only) when the certificate's names change.
upgrade="$out/upgrade"
mkdir "$upgrade"
cp -r "$chart" "$upgrade/chart"
sed -i 's|lookup "v1" "Secret" \.Release\.Namespace \(\$[A-Za-z]*\)|(.Files.Get (printf "installed/%s.yaml" \1) \| fromYaml)|' \
  "$upgrade/chart/templates/tls.yaml" "$upgrade/chart/templates/registration-key.yaml"
missing=$(grep -L 'installed/%s.yaml' "$upgrade/chart/templates/tls.yaml" \
  "$upgrade/chart/templates/registration-key.yaml" || true)
if [ -n "$missing" ]; then
  echo "no lookup of a Secret replaced in: $missing" >&2
  exit 1
fi
.venv-validate/bin/python - "$out/defaults.yaml" "$upgrade/chart/installed" <<'PY'
import os
import sys
import yaml

os.makedirs(sys.argv[2])
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc["kind"] == "Secret":
        yaml.safe_dump(doc, open(os.path.join(sys.argv[2], doc["metadata"]["name"] + ".yaml"), "w"))
PY
"$helm" template ci "$upgrade/chart" --namespace spark-system --kube-version "$kube_version" \
  --set 'allowedNamespaces={spark}' >"$upgrade/same.yaml"
"$helm" template ci "$upgrade/chart" --namespace spark-system --kube-version "$kube_version" \
  --set 'allowedNamespaces={spark}' --set 'tls.dnsNames={allocator.example.com}' >"$upgrade/renamed.yaml"
.venv-validate/bin/python - "$out/defaults.yaml" "$upgrade" <<'PY'
import sys
import yaml


def secrets(path):
    return {d["metadata"]["name"]: d["data"] for d in yaml.safe_load_all(open(path)) if d and d["kind"] == "Secret"}


installed = secrets(sys.argv[1])
same, renamed = secrets(f"{sys.argv[2]}/same.yaml"), secrets(f"{sys.argv[2]}/renamed.yaml")
tls = [name for name in installed if name.endswith("-tls")]
key = [name for name in installed if name.endswith("-registration-key")]
if len(tls) != 1 or len(key) != 1:
    sys.exit(f"the defaults render {sorted(installed)}, not one TLS and one key Secret")
problems = []
if same != installed:
    problems.append("an upgrade with the same values changed a Secret")
if renamed[key[0]] != installed[key[0]]:
    problems.append("an upgrade with new certificate names changed the registrations' key")
if renamed[tls[0]]["tls.crt"] == installed[tls[0]]["tls.crt"]:
    problems.append("an upgrade with new certificate names kept the old certificate")
if problems:
    sys.exit("\n".join(problems))
print("upgrade: the certificate, its CA and the key kept; new names make a new certificate")
PY

step "values the chart must refuse"
refused=0
expect_refusal() {
  local expected=$1
  shift
  local output
  if output=$("$helm" template ci "$chart" --kube-version "$kube_version" "$@" 2>&1); then
    echo "ACCEPTED (should fail): $*" >&2
    refused=1
    return
  fi
  case "$output" in
    *"$expected"*) echo "refused as expected: $* ($expected)" ;;
    *)
      echo "refused, but without naming $expected: $*" >&2
      printf '%s\n' "$output" >&2
      refused=1
      ;;
  esac
}
# The configuration block is checked against the service's types (values.schema.json's
# generated definitions): unknown keys, the chart's former names among them, and wrong types.
expect_refusal batch_size --set config.allocation.batch_size=-5
expect_refusal batchSize --set config.allocation.batchSize=5 --set 'allowedNamespaces={spark}'
expect_refusal allocation --set allocation.batchSize=5 --set 'allowedNamespaces={spark}'
expect_refusal max_executors --set-json 'config.budgets=[{"namespace":"spark","max_executors":"many"}]' --set 'allowedNamespaces={spark}'
expect_refusal maxExecutors --set-json 'config.budgets=[{"namespace":"spark","maxExecutors":5}]' --set 'allowedNamespaces={spark}'
expect_refusal "config.listen is set by the chart from service.port" --set config.listen=0.0.0.0:1 --set 'allowedNamespaces={spark}'
expect_refusal "config.tls.cert_file is set by the chart" --set config.tls.cert_file=/x --set 'allowedNamespaces={spark}'
expect_refusal replicaCount --set replicaCount=16
expect_refusal "minAvailable must be below replicaCount" --set replicaCount=2 --set podDisruptionBudget.minAvailable=2 \
  --set 'allowedNamespaces={spark}'
expect_refusal in_cluster --set-json 'config.kubernetes.in_cluster=[1]' --set 'allowedNamespaces={spark}'
expect_refusal pullPolicy --set image.pullPolicy=Sometimes
expect_refusal allowedNamespaces --set 'allowedNamespaces={Bad_NS}'
expect_refusal imagePullSecrets --set imagePullSecrets=regcred
expect_refusal replicas --set replicas=3
expect_refusal podAnnotation --set podAnnotation.a=b
expect_refusal format --set-json 'config.log.format=7' --set 'allowedNamespaces={spark}'
expect_refusal serviceAccount.name --set serviceAccount.create=false --set 'allowedNamespaces={spark}'
# The first message a user meets (the defaults set no namespace) says what to set, from the
# schema (so `helm lint` refuses too) and from the template without it.
expect_refusal "allowedNamespaces is empty: set allowedNamespaces to the namespaces of your Spark drivers" \
  --set rbac.clusterWide=false
expect_refusal "allowedNamespaces is empty: set allowedNamespaces to the namespaces of your Spark drivers" \
  --skip-schema-validation
expect_refusal allow_unauthenticated_remote --set config.auth.mode=none --set 'allowedNamespaces={spark}'
expect_refusal issuerRef --set tls.certManager.enabled=true --set 'allowedNamespaces={spark}'
expect_refusal cidrs --set 'networkPolicy.apiServer.cidrs={10.0.0.1}' --set 'allowedNamespaces={spark}'
expect_refusal ports --set 'networkPolicy.apiServer.ports={}' --set 'allowedNamespaces={spark}'
expect_refusal health --set health.port=70000 --set 'allowedNamespaces={spark}'
expect_refusal "health.port must differ" --set health.port=50051 --set 'allowedNamespaces={spark}'
expect_refusal keySecretName --set registrations.keySecretName=Bad_Name --set 'allowedNamespaces={spark}'
expect_refusal review_timeout_ms --set config.auth.review_timeout_ms=soon --set 'allowedNamespaces={spark}'
expect_refusal "needs metrics.enabled" --set metrics.serviceMonitor.enabled=true --set 'allowedNamespaces={spark}'
expect_refusal "needs metrics.enabled" --set metrics.dashboard.enabled=true --set 'allowedNamespaces={spark}'
expect_refusal "scrapes the pod twice" --set metrics.enabled=true --set 'allowedNamespaces={spark}' \
  --set metrics.podMonitor.enabled=true --set metrics.serviceMonitor.enabled=true "${scraper[@]}"
expect_refusal "metrics.port must differ" --set metrics.enabled=true --set metrics.port=50051 --set 'allowedNamespaces={spark}' \
  "${scraper[@]}"
expect_refusal "set metrics.networkPolicy.scraperNamespaceSelector or scraperPodSelector to say who may scrape them" \
  --set metrics.enabled=true --set config.metrics.application_labels=true --set 'allowedNamespaces={spark-a}'
expect_refusal "POD_NAME is set by the chart" --set 'allowedNamespaces={spark}' \
  --set-json 'extraEnv=[{"name":"POD_NAME","value":"x"}]'
expect_refusal interval --set metrics.podMonitor.interval=30 --set 'allowedNamespaces={spark}'
expect_refusal "must not exceed its interval" --set metrics.enabled=true --set 'allowedNamespaces={spark}' \
  --set metrics.serviceMonitor.enabled=true --set metrics.serviceMonitor.interval=1m \
  --set metrics.serviceMonitor.scrapeTimeout=1m30s "${scraper[@]}"
expect_refusal disabledAlerts --set 'metrics.prometheusRule.disabledAlerts={NoSuchAlert}' --set 'allowedNamespaces={spark}'
# `helm lint` neuters a template's `fail`: what only a template refuses passes lint. These
# refusals are the schema's, so lint refuses them too, with the same sentence.
expect_lint_refusal() {
  local expected=$1
  shift
  local output
  if output=$("$helm" lint --strict "$chart" "$@" 2>&1); then
    echo "LINT ACCEPTED (should fail): $*" >&2
    refused=1
    return
  fi
  case "$output" in
    *"$expected"*) echo "lint refused as expected: $* ($expected)" ;;
    *)
      echo "lint refused, but without saying $expected: $*" >&2
      printf '%s\n' "$output" >&2
      refused=1
      ;;
  esac
}
expect_lint_refusal "set allowedNamespaces to the namespaces of your Spark drivers"
expect_lint_refusal "to say who may scrape them" --set metrics.enabled=true --set config.metrics.application_labels=true \
  --set 'allowedNamespaces={spark}'
if [ "$refused" -ne 0 ]; then
  echo "the chart accepted or misreported values it must refuse (see above)" >&2
  exit 1
fi

step "safe defaults: TLS, token audience, NetworkPolicy, health port, RBAC (every rendering)"
.venv-validate/bin/python helm/check-defaults.py "$out" spark-system "$chart/README.md"

step "restricted Pod Security essentials of every pod"
.venv-validate/bin/python - "$out"/*.yaml <<'PY'
import sys
import yaml

problems = []
pods = 0
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        kind = doc.get("kind")
        if kind == "Pod":
            spec = doc["spec"]
        elif kind == "Deployment":
            spec = doc["spec"]["template"]["spec"]
        else:
            continue
        pods += 1
        where = f"{path}: {kind} {doc['metadata']['name']}"
        pod_sc = spec.get("securityContext") or {}
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            sc = container.get("securityContext") or {}
            name = f"{where} container {container['name']}"
            seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                problems.append(f"{name}: seccompProfile {seccomp!r}")
            if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
                problems.append(f"{name}: runAsNonRoot not set")
            if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
                problems.append(f"{name}: runs as user 0")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: allowPrivilegeEscalation is not false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                problems.append(f"{name}: capabilities do not drop ALL")
            if ((sc.get("capabilities") or {}).get("add") or []) not in ([], ["NET_BIND_SERVICE"]):
                problems.append(f"{name}: adds capabilities")
            if sc.get("privileged"):
                problems.append(f"{name}: privileged")
        if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
            problems.append(f"{where}: host namespaces")
        for volume in spec.get("volumes", []):
            if "hostPath" in volume:
                problems.append(f"{where}: hostPath volume")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
if pods == 0:
    print("no pod found in the rendered manifests", file=sys.stderr)
    sys.exit(1)
print(f"{pods} pod specs pass")
PY

step "kubernetes-validate --strict -k $kube_version (every rendered manifest of a built-in kind)"
# kubernetes-validate knows only the built-in kinds (it merely warns on others): the
# monitoring.coreos.com and cert-manager.io objects go to their own check below, any other kind fails here.
mkdir "$out/builtin"
.venv-validate/bin/python - "$out" <<'PY'
import os
import sys

import yaml

out = sys.argv[1]
builtin = {
    "v1", "apps/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1", "policy/v1",
    "flowcontrol.apiserver.k8s.io/v1",
}
crds = {"monitoring.coreos.com/v1", "cert-manager.io/v1"}
unknown = []
for name in sorted(os.listdir(out)):
    if not name.endswith(".yaml"):
        continue
    kept = []
    for doc in yaml.safe_load_all(open(os.path.join(out, name))):
        if not doc:
            continue
        what = f"{name}: {doc['kind']} {doc['metadata']['name']} ({doc['apiVersion']})"
        if doc["apiVersion"] in builtin:
            kept.append(doc)
        elif doc["apiVersion"] in crds:
            print(f"{what}: not for kubernetes-validate; checked against its CRD below")
        else:
            unknown.append(what)
    yaml.safe_dump_all(kept, open(os.path.join(out, "builtin", name), "w"))
if unknown:
    print("kinds no check here knows:\n" + "\n".join(unknown), file=sys.stderr)
    sys.exit(1)
PY
# The chart's example driver pod template (the README's projected token and CA) too.
cp "$chart/examples/driver-pod-template.yaml" "$out/builtin/example-driver-pod-template.yaml"
validate_log=$(.venv-validate/bin/kubernetes-validate --strict -k "$kube_version" "$out"/builtin/*.yaml 2>&1) || {
  printf '%s\n' "$validate_log" >&2
  exit 1
}
printf '%s\n' "$validate_log"
case "$validate_log" in
  *"Couldn't find schema"*)
    echo "kubernetes-validate has no schema for a kind above" >&2
    exit 1
    ;;
esac

step "PodMonitor, ServiceMonitor, PrometheusRule, Certificate against the prometheus-operator and cert-manager CRDs"
.venv-validate/bin/python helm/validate-monitoring.py "$crd_dir" "$cert_manager_crd_dir" "$out"/*.yaml

step "the alerts: promtool check rules, and their unit tests (helm/alerts-test.yaml)"
"$promtool" check rules "$chart/files/prometheus-rules.yaml"
"$promtool" test rules helm/alerts-test.yaml

step "the rendered alerts and dashboard are the chart's files, as tests/metrics_endpoint.rs checks them"
.venv-validate/bin/python - "$chart" "$out"/*.yaml <<'PY'
import json
import sys

import yaml

chart, rendered = sys.argv[1], sys.argv[2:]
source_rules = {
    rule["alert"]: rule
    for group in yaml.safe_load(open(f"{chart}/files/prometheus-rules.yaml"))["groups"]
    for rule in group["rules"]
}
source_dashboard = json.load(open(f"{chart}/dashboards/spark-pod-allocator.json"))
problems = []
checked = 0
for path in rendered:
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        if doc["kind"] == "PrometheusRule":
            checked += 1
            for group in doc["spec"]["groups"]:
                for rule in group["rules"]:
                    source = source_rules.get(rule["alert"])
                    if source is None:
                        problems.append(f"{path}: {rule['alert']} is not in files/prometheus-rules.yaml")
                        continue
                    # Only the labels may differ (alertLabels are merged in).
                    same = {k: v for k, v in rule.items() if k != "labels"}
                    if same != {k: v for k, v in source.items() if k != "labels"}:
                        problems.append(f"{path}: {rule['alert']} differs from files/prometheus-rules.yaml")
                    for key, value in (source.get("labels") or {}).items():
                        if key not in rule["labels"]:
                            problems.append(f"{path}: {rule['alert']} lost its label {key}")
        elif doc["kind"] == "ConfigMap" and "spark-pod-allocator.json" in (doc.get("data") or {}):
            checked += 1
            if json.loads(doc["data"]["spark-pod-allocator.json"]) != source_dashboard:
                problems.append(f"{path}: the dashboard differs from dashboards/spark-pod-allocator.json")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
if checked == 0:
    sys.exit("no PrometheusRule or dashboard rendered")
print(f"{checked} rendered PrometheusRules and dashboards match the chart's files")
PY

step "replicas: a PodDisruptionBudget and spreading with more than one, POD_IP for forwarding, the NetworkPolicy letting replicas reach each other"
.venv-validate/bin/python - "$out" <<'PY'
import os
import sys

import yaml

out = sys.argv[1]
problems = []
for name in sorted(os.listdir(out)):
    if not name.endswith(".yaml"):
        continue
    docs = [d for d in yaml.safe_load_all(open(os.path.join(out, name))) if d]
    deployment = next((d for d in docs if d["kind"] == "Deployment"), None)
    if deployment is None:
        continue
    replicas = deployment["spec"]["replicas"]
    pod = deployment["spec"]["template"]["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if replicas > 1:
        if len(budgets) != 1 or budgets[0]["spec"]["selector"]["matchLabels"] != selector:
            problems.append(f"{name}: {replicas} replicas without a PodDisruptionBudget selecting them")
        if not pod.get("topologySpreadConstraints"):
            problems.append(f"{name}: {replicas} replicas not spread")
    elif budgets:
        problems.append(f"{name}: a PodDisruptionBudget for {replicas} replica(s) (it could only block drains)")
    if deployment["spec"]["strategy"].get("rollingUpdate", {}).get("maxUnavailable") != 0:
        problems.append(f"{name}: a rolling update may take a replica down before its successor is ready")
    env = {e["name"]: e for e in pod["containers"][0].get("env", [])}
    if env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
        problems.append(f"{name}: no POD_IP from the downward API (ha.advertise_address)")
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        peers = [{"podSelector": {"matchLabels": selector}}]
        grpc = [{"port": "grpc", "protocol": "TCP"}]
        if not any(rule.get("ports") == grpc and all(p in rule.get("from", []) for p in peers)
                   for rule in policy["spec"]["ingress"]):
            problems.append(f"{name}: the NetworkPolicy keeps the replicas' forwards out")
        if not any(rule.get("ports") == grpc and rule.get("to") == peers
                   for rule in policy["spec"]["egress"]):
            problems.append(f"{name}: the NetworkPolicy keeps the replicas from forwarding")
if problems:
    sys.exit("\n".join(problems))
print("replicas, budgets, spreading, POD_IP and the peers' NetworkPolicy rules as expected")
PY

step "the service starts with the configuration each rendering gives it"
# The binary reads the rendered ConfigMap (its pod template at a local path) and serves a
# simulated cluster: a key the service does not know, or a value it refuses, fails here.
# Where the rendering turns metrics on, the service must serve them (on a loopback port
# the service picks and logs, instead of 0.0.0.0:metrics.port). Where it generates the
# certificate, the service serves that certificate, and a TLS client holding only the CA
# ConfigMap's ca.crt verifies it for the Service's name (ALPN h2), as a driver does; the
# health listener (health.listen, on a loopback port the service picks and logs) answers
# HTTP/2 in plaintext, as the kubelet's gRPC probe needs. The metric names of the alerts
# and the dashboard are checked by tests/metrics_endpoint.rs, against a scrape after a
# scale-up with failed creates and a 410 (a family appears in a scrape only once it has a
# sample).
bin=${SPARK_POD_ALLOCATOR_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --bin spark-pod-allocator
  bin="$root/target/debug/spark-pod-allocator"
fi
.venv-validate/bin/python - "$out" <<'PY'
import base64
import os
import subprocess
import sys
import yaml

out = sys.argv[1]


for name in os.listdir(out):
    if not name.endswith(".yaml"):
        continue
    directory = os.path.join(out, "config-" + name[: -len(".yaml")])
    config = None
    docs = [doc for doc in yaml.safe_load_all(open(os.path.join(out, name))) if doc]
    tls_secrets = {d["metadata"]["name"]: d for d in docs if d.get("type") == "kubernetes.io/tls"}
    for doc in docs:
        data = doc.get("data") or {}
        # The service's ConfigMap (the dashboard's has no config.yaml).
        if doc["kind"] == "ConfigMap" and "config.yaml" in data:
            os.makedirs(directory)
            config = yaml.safe_load(data["config.yaml"])
            if "tls" in config:
                cert = os.path.join(directory, "tls.crt")
                key = os.path.join(directory, "tls.key")
                deployment = next(d for d in docs if d["kind"] == "Deployment")
                volumes = deployment["spec"]["template"]["spec"]["volumes"]
                mounted = next(v["secret"]["secretName"] for v in volumes if v["name"] == "tls")
                if mounted in tls_secrets:
                    # The chart's generated Secret, as mounted.
                    for file in ("tls.crt", "tls.key", "ca.crt"):
                        open(os.path.join(directory, file), "wb").write(
                            base64.b64decode(tls_secrets[mounted]["data"][file]))
                    service = next(d for d in docs if d["kind"] == "Service"
                                   and d["spec"]["ports"][0]["name"] == "grpc")
                    open(os.path.join(directory, "tls-host"), "w").write(
                        f"{service['metadata']['name']}.{doc['metadata'].get('namespace', 'spark-system')}.svc")
                else:
                    # cert-manager's or the user's Secret: a certificate made here stands in.
                    subprocess.run(
                        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                         "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=ci",
                         "-keyout", key, "-out", cert],
                        check=True, stderr=subprocess.DEVNULL)
                config["tls"]["cert_file"] = cert
                config["tls"]["key_file"] = key
                # The replicas verify each other with the published CA, else the Secret's.
                if config.get("ha", {}).get("peer_ca_file"):
                    published = [d for d in docs if d["kind"] == "ConfigMap"
                                 and "ca.crt" in (d.get("data") or {})]
                    peer_ca = os.path.join(directory, "peer-ca.crt")
                    if published:
                        open(peer_ca, "w").write(published[0]["data"]["ca.crt"])
                    else:
                        open(peer_ca, "wb").write(open(cert, "rb").read())
                    config["ha"]["peer_ca_file"] = peer_ca
            if "executor-pod-template.yaml" in data:
                template = os.path.join(directory, "executor-pod-template.yaml")
                open(template, "w").write(data["executor-pod-template.yaml"])
                config["default_executor_pod_template"] = template
    if config is None:
        continue
    # Port 0: the service binds what the kernel gives and logs it, so no port chosen here
    # can be taken by another listener before the service binds it.
    if config.get("metrics", {}).get("listen"):
        config["metrics"]["listen"] = "127.0.0.1:0"
        open(os.path.join(directory, "metrics-wanted"), "w").write("")
    if config.get("health", {}).get("listen"):
        config["health"]["listen"] = "127.0.0.1:0"
        open(os.path.join(directory, "health-wanted"), "w").write("")
    yaml.safe_dump(config, open(os.path.join(directory, "config.yaml"), "w"))
PY
for config in "$out"/config-*/config.yaml; do
  log="${config%.yaml}.log"
  env -u RUST_LOG -u SPARK_POD_ALLOCATOR__LISTEN "$bin" --config "$config" \
    serve --simulate --listen 127.0.0.1:0 2>"$log" &
  pid=$!
  started=0
  # Started: the gRPC address logged, and the health listener's too where one is wanted
  # (it is bound after the gRPC listener). The log is text or JSON, as the rendering says.
  for _ in $(seq 300); do
    if grep -Eq 'serving gRPC( address=|",)' "$log" && { [ ! -f "${config%/*}/health-wanted" ] ||
      grep -q "serving gRPC health for probes" "$log"; }; then
      started=1
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    sleep 0.2
  done
  scraped=0
  if [ "$started" -eq 1 ] && [ -f "${config%/*}/metrics-wanted" ]; then
    .venv-validate/bin/python - "$log" <<'PY' && scraped=1
import re
import sys
import time
import urllib.request

line = next(l for l in open(sys.argv[1]) if "serving metrics at /metrics" in l)
address = re.search(r'address(?:=|":")([0-9.]+:[0-9]+)', line).group(1)
url = f"http://{address}/metrics"
for _ in range(50):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            kind, text = response.headers["Content-Type"], response.read().decode()
        break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit(f"no answer from {url}")
if not kind.startswith("application/openmetrics-text") or "\nspark_pod_allocator_build_info{" not in text:
    sys.exit(f"{url} does not serve the service's metrics ({kind}):\n{text}")
print(f"{url}: the service's metrics")
PY
  fi
  connected=1
  if [ "$started" -eq 1 ]; then
    .venv-validate/bin/python - "${config%/*}" "$log" <<'PY' || connected=0
import os
import re
import socket
import ssl
import sys

directory, log = sys.argv[1], sys.argv[2]


def logged_port(message):
    """The port of the address logged with `message` (a text or a JSON log line)."""
    line = next(l for l in open(log) if re.search(message, l))
    return int(re.search(r'address(?:=|":")127\.0\.0\.1:([0-9]+)', line).group(1))


grpc_port = logged_port(r'serving gRPC(?: address=|",)')
if os.path.exists(f"{directory}/tls-host"):
    host = open(f"{directory}/tls-host").read()
    context = ssl.create_default_context(cafile=f"{directory}/ca.crt")
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", grpc_port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            if tls.selected_alpn_protocol() != "h2":
                sys.exit(f"ALPN {tls.selected_alpn_protocol()!r}, not h2")
    print(f"TLS on :{grpc_port}: the generated certificate verifies against the CA ConfigMap for {host}")
if os.path.exists(f"{directory}/health-wanted"):
    port = logged_port("serving gRPC health for probes")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as health:
        # The HTTP/2 preface and an empty SETTINGS frame; the server's first frame is its SETTINGS.
        health.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        header = b""
        while len(header) < 9:
            chunk = health.recv(9 - len(header))
            if not chunk:
                sys.exit(f"the health listener :{port} closed the connection")
            header += chunk
        if header[3] != 4:
            sys.exit(f"the health listener :{port} answered frame type {header[3]}, not SETTINGS")
    print(f"health listener :{port}: plaintext HTTP/2")
PY
  fi
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  if [ "$started" -ne 1 ]; then
    echo "the service did not start with $config:" >&2
    cat "$log" >&2
    exit 1
  fi
  if [ "$connected" -ne 1 ]; then
    echo "the service started with $config does not serve TLS or health as the chart expects:" >&2
    cat "$log" >&2
    exit 1
  fi
  if [ -f "${config%/*}/metrics-wanted" ] && [ "$scraped" -ne 1 ]; then
    echo "the metrics of the service started with $config are not what the chart expects:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "$config: accepted"
done

step "the chart README's values table matches the schema and values.yaml"
table=$(.venv-validate/bin/python helm/values-table.py "$chart")
readme=$(cat "$chart/README.md")
case "$readme" in
  *"$table"*) echo "values table: current" ;;
  *)
    echo "$chart/README.md: the values table is stale; replace it with the output of" >&2
    echo "  python3 helm/values-table.py $chart" >&2
    exit 1
    ;;
esac
