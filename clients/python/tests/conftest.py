"""Starts real `spark-pod-allocator serve --simulate` processes for the tests."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _binary() -> pathlib.Path:
    """SPARK_POD_ALLOCATOR_BIN, else the debug build; a relative path that does not exist
    from here is taken from the repository root (`target/release/spark-pod-allocator`)."""
    given = os.environ.get("SPARK_POD_ALLOCATOR_BIN")
    if not given:
        return ROOT / "target" / "debug" / "spark-pod-allocator"
    path = pathlib.Path(given)
    if not path.is_absolute() and not path.exists():
        return ROOT / path
    return path


BINARY = _binary()

TEMPLATE = """
apiVersion: v1
kind: Pod
metadata:
  labels:
    team: data
spec:
  containers:
    - name: spark-kubernetes-executor
      image: spark:4.0.0
"""


def free_port() -> int:
    """A port free right now, for a test that must know it before the service binds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, what: str, deadline_s: float = 60.0):
    """Polls `condition` until it returns a truthy value; fails naming `what` after the deadline."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = condition()
        if last:
            return last
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what} (last value: {last!r})")


_SERVING_GRPC = re.compile(r'serving gRPC(?: address=|",.*"address":")127\.0\.0\.1:([0-9]+)')


@contextlib.contextmanager
def running_service(port: int = 0, config: "pathlib.Path | None" = None) -> Iterator[str]:
    """A `serve --simulate` process listening on 127.0.0.1:`port` (with the configuration
    file `config`, if given), SERVING when yielded; stopped with SIGTERM (and required to
    exit 0) afterwards. Port 0 (the default) takes the port the service binds and logs, so
    no other listener can take it between a choice made here and the service's bind."""
    if not BINARY.exists():
        pytest.fail(f"{BINARY} does not exist: run `cargo build` first or set SPARK_POD_ALLOCATOR_BIN")
    env = dict(os.environ, SPARK_POD_ALLOCATOR__LISTEN=f"127.0.0.1:{port}")
    # The service's log goes to a file, not a pipe nobody drains (a full pipe would block it).
    log = tempfile.TemporaryFile()
    config_args = ["--config", str(config)] if config is not None else []
    proc = subprocess.Popen(
        [str(BINARY), *config_args, "serve", "--simulate"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )

    def service_log() -> str:
        log.seek(0)
        return log.read().decode(errors="replace")

    def bound_port() -> int:
        if proc.poll() is not None:
            pytest.fail(f"service exited with {proc.returncode}: {service_log()}")
        found = _SERVING_GRPC.search(service_log())
        return int(found.group(1)) if found else 0

    if port == 0:
        port = wait_until(bound_port, "the service to log the address it serves gRPC on")
    target = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(target)
    health = health_pb2_grpc.HealthStub(channel)

    def serving():
        if proc.poll() is not None:
            pytest.fail(f"service exited with {proc.returncode}: {service_log()}")
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    try:
        wait_until(serving, "the service's health to be SERVING")
        yield target
    finally:
        channel.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("service did not stop within 20 s of SIGTERM")
    assert proc.returncode == 0, service_log()
    log.close()


@pytest.fixture(scope="module")
def service():
    with running_service() as target:
        yield target
