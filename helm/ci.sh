#!/usr/bin/env bash
# Checks the Helm chart: lint (strict), render with the defaults and with every value set
# (ci/full-values.yaml), values the schema must refuse, the `restricted` Pod Security
# essentials of every pod, and every rendered manifest against the Kubernetes OpenAPI schema
# (kubernetes-validate, strict, offline). Installs helm from the Go module proxy into
# .tools/bin (built once, reused while its version matches) and kubernetes-validate into
# .venv-validate. Needs Go, Python 3 and, the first time, network access to both registries.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

helm_version=v3.22.0
kube_version=1.33.0   # the Kubernetes API the service is built against (k8s-openapi v1_33)
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
render defaults --set 'allowedNamespaces={spark}'
render full -f "$chart/ci/full-values.yaml"
render namespaces --set 'allowedNamespaces={spark-a,spark-b}' --set networkPolicy.enabled=true
render cluster-wide --set rbac.clusterWide=true
render no-auth --set 'allowedNamespaces={spark}' --set auth.mode=none \
  --set auth.allowUnauthenticatedRemote=true
render external-account --set serviceAccount.create=false --set serviceAccount.name=existing \
  --set rbac.create=false --set replicaCount=0 --set 'allowedNamespaces={spark}'

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
expect_refusal batchSize --set allocation.batchSize=-5
expect_refusal batchDelayMs --set allocation.batchDelayMs=100
expect_refusal maxPendingPods --set allocation.maxPendingPods=0
expect_refusal replicaCount --set replicaCount=2
expect_refusal requestAttempts --set kubernetes.requestAttempts=9
expect_refusal pullPolicy --set image.pullPolicy=Sometimes
expect_refusal allowedNamespaces --set 'allowedNamespaces={Bad_NS}'
expect_refusal imagePullSecrets --set imagePullSecrets=regcred
expect_refusal replicas --set replicas=3
expect_refusal podAnnotation --set podAnnotation.a=b
expect_refusal batch_size --set allocation.batch_size=5
expect_refusal format --set log.format=xml
expect_refusal driverNamespaceSelector --set networkPolicy.enabled=true --set rbac.clusterWide=true
expect_refusal serviceAccount.name --set serviceAccount.create=false --set 'allowedNamespaces={spark}'
expect_refusal allowedNamespaces --set rbac.clusterWide=false
expect_refusal mode --set auth.mode=ldap --set 'allowedNamespaces={spark}'
expect_refusal allowUnauthenticatedRemote --set auth.mode=none --set 'allowedNamespaces={spark}'
expect_refusal secretName --set tls.enabled=true --set 'allowedNamespaces={spark}'
expect_refusal reviewTimeoutMs --set auth.reviewTimeoutMs=5 --set 'allowedNamespaces={spark}'
if [ "$refused" -ne 0 ]; then
  echo "the chart accepted or misreported values it must refuse (see above)" >&2
  exit 1
fi

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

step "kubernetes-validate --strict -k $kube_version (every rendered manifest)"
.venv-validate/bin/kubernetes-validate --strict -k "$kube_version" "$out"/*.yaml

step "the service starts with the configuration each rendering gives it"
# The binary reads the rendered ConfigMap (its pod template at a local path) and serves a
# simulated cluster: a key the service does not know, or a value it refuses, fails here.
bin=${SPARK_POD_ALLOCATOR_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --bin spark-pod-allocator
  bin="$root/target/debug/spark-pod-allocator"
fi
.venv-validate/bin/python - "$out" <<'PY'
import os
import subprocess
import sys
import yaml

out = sys.argv[1]
for name in os.listdir(out):
    if not name.endswith(".yaml"):
        continue
    for doc in yaml.safe_load_all(open(os.path.join(out, name))):
        if not doc or doc.get("kind") != "ConfigMap":
            continue
        data = doc["data"]
        directory = os.path.join(out, "config-" + name[: -len(".yaml")])
        os.makedirs(directory)
        config = yaml.safe_load(data["config.yaml"])
        if "tls" in config:
            # The Secret's files, as mounted: a certificate made here stands in for them.
            cert = os.path.join(directory, "tls.crt")
            key = os.path.join(directory, "tls.key")
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                 "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=ci",
                 "-keyout", key, "-out", cert],
                check=True, stderr=subprocess.DEVNULL)
            config["tls"]["cert_file"] = cert
            config["tls"]["key_file"] = key
        if "executor-pod-template.yaml" in data:
            template = os.path.join(directory, "executor-pod-template.yaml")
            open(template, "w").write(data["executor-pod-template.yaml"])
            config["default_executor_pod_template"] = template
        yaml.safe_dump(config, open(os.path.join(directory, "config.yaml"), "w"))
PY
for config in "$out"/config-*/config.yaml; do
  log="${config%.yaml}.log"
  env -u RUST_LOG -u SPARK_POD_ALLOCATOR__LISTEN "$bin" --config "$config" \
    serve --simulate --listen 127.0.0.1:0 2>"$log" &
  pid=$!
  started=0
  for _ in $(seq 300); do
    if grep -q "serving gRPC" "$log"; then
      started=1
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    sleep 0.2
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  if [ "$started" -ne 1 ]; then
    echo "the service did not start with $config:" >&2
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
