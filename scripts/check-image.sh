#!/usr/bin/env bash
# Checks the Dockerfile and .dockerignore statically (scripts/build-image.sh builds the
# image with podman, scripts/run-image.sh runs it): the build context holds what the Dockerfile copies and none of target/, .git,
# .venv*, .tools, clients/; base images are pinned; the final stage runs as non-root,
# listens on 0.0.0.0:50051, EXPOSEs it and carries OCI labels; dependencies are cached.
# With --build, also builds the release binary and checks that it is stripped.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - <<'PY'
import os
import re
import subprocess
import sys

problems = []

def pattern_regex(pattern):
    """A .dockerignore pattern as a regex (Go filepath.Match, plus ** for any depth)."""
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out += "/?"
                i += 1
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + r"\Z")

rules = []
for line in open(".dockerignore"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    negated = line.startswith("!")
    pattern = os.path.normpath(line.lstrip("!").strip("/"))
    rules.append((negated, pattern_regex(pattern)))

def excluded(path):
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for negated, regex in rules:
        if any(regex.match(p) for p in prefixes):
            verdict = not negated
    return verdict

tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
for must_go in ["target/release/spark-pod-allocator", ".git/HEAD", ".venv/bin/python",
                ".venv-validate/bin/python", ".tools/bin/helm", "clients/spark/target/x.jar",
                "clients/python/.venv/bin/python", "docs/grpc.md", "tests/grpc_cli.rs",
                "helm/spark-pod-allocator/Chart.yaml"]:
    if not excluded(must_go):
        problems.append(f".dockerignore lets {must_go} into the build context")

dockerfile = open("Dockerfile").read()
copied = []
for line in dockerfile.splitlines():
    m = re.match(r"COPY\s+(?!--from)(.*)", line.strip())
    if m:
        copied += m.group(1).split()[:-1]
for source in copied:
    files = [f for f in tracked if f == source or f.startswith(source.rstrip("/") + "/")]
    if not files:
        problems.append(f"the Dockerfile copies {source}, which git does not track")
    for f in files:
        if excluded(f):
            problems.append(f".dockerignore keeps out {f}, which the Dockerfile copies")
# Cargo needs every declared bench target to read the manifest.
for name in re.findall(r'\[\[bench\]\]\s*name\s*=\s*"([^"]+)"', open("Cargo.toml").read()):
    if excluded(f"benches/{name}.rs") or "benches" not in copied:
        problems.append(f"benches/{name}.rs (declared in Cargo.toml) is not in the image build")
# Cargo reads every workspace member's manifest, even to build one binary.
workspace = re.search(r'^\[workspace\][^\[]*?^members\s*=\s*\[([^\]]*)\]', open("Cargo.toml").read(), re.M | re.S)
for member in re.findall(r'"([^"]+)"', workspace.group(1)) if workspace else []:
    if member == ".":
        continue
    if excluded(f"{member}/Cargo.toml") or not any(member == c.rstrip("/") or member.startswith(c.rstrip("/") + "/") for c in copied):
        problems.append(f"the workspace member {member} (Cargo.toml) is not in the image build")
context = [f for f in tracked if not excluded(f)]

args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", dockerfile, re.M))
stages = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
stage_names = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", dockerfile, re.M | re.I))
for image in stages:
    image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
    if image in stage_names or "@sha256:" in image:
        continue
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    if not tag or tag == "latest" or ("distroless" not in image and not re.search(r"\d+\.\d+\.\d+", tag)):
        problems.append(f"base image {image} is not pinned to a version or digest")
final = dockerfile[dockerfile.rindex("\nFROM"):]
if "distroless" not in args.get("RUNTIME_IMAGE", "") or not args.get("RUNTIME_IMAGE", "").endswith(":nonroot"):
    problems.append("the runtime base is not distroless :nonroot")
user = re.search(r"^USER\s+(\S+)", final, re.M)
if not user or user.group(1).split(":")[0] in ("0", "root"):
    problems.append("the final stage does not run as a non-root user")
if not re.search(r"^ENV\s+SPARK_POD_ALLOCATOR__LISTEN=0\.0\.0\.0:50051\s*$", final, re.M):
    problems.append("the image does not listen on 0.0.0.0:50051")
if not re.search(r"^EXPOSE\s+50051\s*$", final, re.M):
    problems.append("no EXPOSE 50051")
for label in ["title", "description", "version", "revision", "licenses"]:
    if f"org.opencontainers.image.{label}=" not in final:
        problems.append(f"no OCI label org.opencontainers.image.{label}")
for cache in ["/usr/local/cargo/registry", "/src/target"]:
    if f"--mount=type=cache,id=spark-pod-allocator-" not in dockerfile or f"target={cache}" not in dockerfile:
        problems.append(f"no cache mount of {cache}")
if "--locked" not in dockerfile:
    problems.append("cargo build without --locked")

if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"Dockerfile and .dockerignore: ok ({len(context)} tracked files in the build context)")
PY

if [ "${1:-}" = "--build" ]; then
  cargo build --release --locked --bin spark-pod-allocator
  binary=target/release/spark-pod-allocator
  description=$(file "$binary")
  case "$description" in
    *", stripped"*) ;;
    *) echo "not stripped: $description" >&2; exit 1 ;;
  esac
  size=$(stat -c %s "$binary")
  echo "release binary: stripped, $((size / 1024 / 1024)) MiB"
fi
