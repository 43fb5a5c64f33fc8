"""The package's own behaviour: exceptions per code, the asyncio client, retries on
UNAVAILABLE, the bearer token sent; against the real service, or (for what the service
does not look at) a small in-process gRPC server recording what it receives."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
import pytest

import spark_pod_allocator
from spark_pod_allocator import (
    AllocatorClient,
    AllocatorError,
    AsyncAllocatorClient,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RetryPolicy,
    Unavailable,
    pb,
    pb_grpc,
)

from conftest import TEMPLATE, free_port, running_service, wait_until

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, max_elapsed=10)


def test_the_package_is_self_contained_and_typed():
    import importlib.util
    import pathlib

    assert importlib.util.find_spec("spark") is None, "no top-level spark package"
    root = pathlib.Path(spark_pod_allocator.__file__).parent
    assert (root / "py.typed").exists()
    assert (root / "v1" / "allocator_pb2.pyi").exists()
    assert spark_pod_allocator.__version__


def test_every_setting_of_the_api_is_accepted_and_an_unknown_one_is_refused():
    from spark_pod_allocator import _requests

    settings = {"stuck_pending_timeout_ms": 30_000, "min_executors_at_once": 4, "batch_size": 2}
    request = _requests.start("app-1", "ns", TEMPLATE, "", "", settings, None)
    assert request.settings.stuck_pending_timeout_ms == 30_000
    assert request.settings.min_executors_at_once == 4
    assert request.settings.batch_size == 2
    with pytest.raises(ValueError, match="batch_sise"):
        _requests.start("app-1", "ns", TEMPLATE, "", "", {"batch_sise": 2}, None)


def test_errors_have_a_class_per_code_and_keep_code_and_details(service):
    with AllocatorClient(service) as client:
        with pytest.raises(NotFound) as err:
            client.get_status("never-started")
        assert isinstance(err.value, AllocatorError)
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        assert err.value.method == "GetStatus"

        with pytest.raises(InvalidArgument) as err:
            client.start("bad id!", "default", executor_pod_template=TEMPLATE)
        assert err.value.details.startswith("application_id")

        client.start("pkg-app-1", "default", executor_pod_template=TEMPLATE)
        with pytest.raises(FailedPrecondition) as err:
            client.start(
                "pkg-app-1", "default", executor_pod_template=TEMPLATE, settings={"batch_size": 3}
            )
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "settings.batch_size" in err.value.details
        assert client.stop("pkg-app-1") == 0


def test_async_client_allocates_and_streams_events(service):
    kinds = pb.ExecutorEventKind

    async def scenario():
        async with AsyncAllocatorClient(service) as client:
            with pytest.raises(NotFound):
                await client.get_status("never-started")
            with pytest.raises(NotFound):
                async for _ in client.watch_executors("never-started"):
                    pass
            started = await client.start(
                "pkg-async", "default", executor_pod_template=TEMPLATE, settings={"batch_delay_ms": 200}
            )
            assert started.resumed is False
            await client.set_total_expected("pkg-async", {0: 1})
            running = set()
            events = client.watch_executors("pkg-async")
            async for event in events:
                if event.kind in (kinds.EXECUTOR_EVENT_KIND_SNAPSHOT, kinds.EXECUTOR_EVENT_KIND_UPDATED):
                    if event.executor.state == pb.EXECUTOR_POD_STATE_RUNNING:
                        running.add(event.executor.executor_id)
                if running == {1}:
                    break
            await events.aclose()
            await client.update_registered_executors("pkg-async", [1])
            assert await client.is_deleted("pkg-async", 1) is False
            status = await client.get_status("pkg-async")
            assert [(p.resource_profile_id, p.target) for p in status.profiles] == [(0, 1)]
            assert status.last_executor_id == 1
            assert await client.stop("pkg-async") == 1

    asyncio.run(asyncio.wait_for(scenario(), 60))


@dataclass(frozen=True)
class _SignallingRetry(RetryPolicy):
    """Signals `failed` when an attempt has failed with UNAVAILABLE."""

    failed: threading.Event = threading.Event()

    def next_delay(self, attempt, started):
        self.failed.set()
        return super().next_delay(attempt, started)


def test_a_call_made_before_the_service_is_up_is_retried_until_it_answers():
    port = free_port()
    policy = _SignallingRetry(
        max_attempts=1000, initial_backoff=0.02, max_backoff=0.2, max_elapsed=60,
        failed=threading.Event(),
    )
    outcome = {}

    def call():
        with AllocatorClient(f"127.0.0.1:{port}", retry=policy, timeout=5) as client:
            try:
                client.get_status("nobody")
            except AllocatorError as err:
                outcome["error"] = err

    caller = threading.Thread(target=call)
    caller.start()
    assert policy.failed.wait(30), "the first attempt never failed"
    with running_service(port):
        caller.join(60)
        assert not caller.is_alive()
    # The service itself answered: NOT_FOUND, not UNAVAILABLE.
    assert isinstance(outcome.get("error"), NotFound), outcome


class _Recorder(pb_grpc.ExecutorAllocatorServicer):
    """Answers GetStatus with UNAVAILABLE `unavailable` times then OK (or `code` always),
    Stop with UNAVAILABLE; records every call's metadata."""

    def __init__(self, unavailable: int = 0, code=None):
        self.unavailable = unavailable
        self.code = code
        self.calls = []
        self.targets = []
        self.lock = threading.Lock()

    def _record(self, method, context):
        with self.lock:
            self.calls.append((method, dict(context.invocation_metadata())))
            return len([c for c in self.calls if c[0] == method])

    def GetStatus(self, request, context):
        n = self._record("GetStatus", context)
        if self.code is not None:
            context.abort(self.code, "application_id: refused by the recorder")
        if n <= self.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        return pb.ApplicationStatus(last_executor_id=n)

    def WatchExecutors(self, request, context):
        """UNAVAILABLE `unavailable` times, then two events and UNAVAILABLE mid-stream."""
        n = self._record("WatchExecutors", context)
        if n <= self.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        for sequence in (1, 2):
            yield pb.ExecutorEvent(sequence=sequence, kind=pb.EXECUTOR_EVENT_KIND_UPDATED)
        context.abort(grpc.StatusCode.UNAVAILABLE, "broken mid-stream")

    def Stop(self, request, context):
        self._record("Stop", context)
        context.abort(grpc.StatusCode.UNAVAILABLE, "going away")

    def SetTotalExpected(self, request, context):
        self._record("SetTotalExpected", context)
        with self.lock:
            self.targets.append(dict(request.executors_per_profile))
        return pb.SetTotalExpectedResponse()


@pytest.fixture
def recorder_server():
    servers = []

    def start(recorder):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ExecutorAllocatorServicer_to_server(recorder, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def test_unavailable_is_retried_with_a_bounded_number_of_attempts(recorder_server):
    flaky = _Recorder(unavailable=2)
    with AllocatorClient(recorder_server(flaky), retry=FAST) as client:
        assert client.get_status("app").last_executor_id == 3
    assert [c[0] for c in flaky.calls] == ["GetStatus"] * 3

    down = _Recorder(unavailable=100)
    with AllocatorClient(recorder_server(down), retry=FAST) as client:
        with pytest.raises(Unavailable) as err:
            client.get_status("app")
    assert err.value.details == "not yet"
    assert len(down.calls) == FAST.max_attempts


def test_other_codes_and_stop_are_not_retried(recorder_server):
    refusing = _Recorder(code=grpc.StatusCode.INVALID_ARGUMENT)
    with AllocatorClient(recorder_server(refusing), retry=FAST) as client:
        with pytest.raises(InvalidArgument):
            client.get_status("app")
        with pytest.raises(Unavailable):
            client.stop("app")
    assert [c[0] for c in refusing.calls] == ["GetStatus", "Stop"]

    stopping = _Recorder()
    with AllocatorClient(recorder_server(stopping), retry=FAST, retry_stop=True) as client:
        with pytest.raises(Unavailable):
            client.stop("app")
    assert [c[0] for c in stopping.calls] == ["Stop"] * FAST.max_attempts


def test_async_client_retries_unavailable(recorder_server):
    flaky = _Recorder(unavailable=2)
    target = recorder_server(flaky)

    async def scenario():
        async with AsyncAllocatorClient(target, retry=FAST) as client:
            return await client.get_status("app")

    assert asyncio.run(scenario()).last_executor_id == 3


def test_the_bearer_token_is_sent_and_a_token_file_is_read_again(recorder_server, tmp_path):
    recorder = _Recorder()
    target = recorder_server(recorder)
    with AllocatorClient(target, token="s3cret") as client:
        client.get_status("app")
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    with AllocatorClient(target, token_file=token_file, token_refresh=0) as client:
        client.get_status("app")
        token_file.write_text("rotated\n")
        client.get_status("app")

    async def scenario():
        async with AsyncAllocatorClient(target, token="async-token") as client:
            await client.get_status("app")

    asyncio.run(scenario())
    sent = [c[1].get("authorization") for c in recorder.calls]
    assert sent == ["Bearer s3cret", "Bearer first", "Bearer rotated", "Bearer async-token"]

    with AllocatorClient(target) as client:
        client.get_status("app")
    assert "authorization" not in recorder.calls[-1][1]


def _openssl(*args, cwd):
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for `localhost` and a client certificate, all signed by it."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp_path)
    (tmp_path / "server.ext").write_text("subjectAltName=DNS:localhost\n")
    for name, extra in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=tmp_path)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", *extra, cwd=tmp_path)
    return tmp_path


def test_tls_with_a_private_ca_and_a_client_certificate(pki):
    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ExecutorAllocatorServicer_to_server(recorder, server)
    credentials = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        target = f"127.0.0.1:{port}"
        with AllocatorClient(
            target,
            root_certificates=pki / "ca.pem",
            client_certificate=pki / "client.pem",
            client_key=(pki / "client.key").read_bytes(),
            tls_server_name="localhost",
            token="over-tls",
        ) as client:
            assert client.get_status("app").last_executor_id == 1
        assert recorder.calls[-1][1]["authorization"] == "Bearer over-tls"

        async def scenario():
            async with AsyncAllocatorClient(
                target,
                root_certificates=pki / "ca.pem",
                client_certificate=pki / "client.pem",
                client_key=pki / "client.key",
                tls_server_name="localhost",
            ) as client:
                return await client.get_status("app")

        assert asyncio.run(scenario()).last_executor_id == 2
        # Without the client certificate the server refuses the handshake.
        with AllocatorClient(
            target, root_certificates=pki / "ca.pem", tls_server_name="localhost", retry=FAST
        ) as client:
            with pytest.raises(Unavailable):
                client.get_status("app")
        assert len(recorder.calls) == 2
    finally:
        server.stop(None)


def test_watch_is_retried_before_its_first_event_only(recorder_server):
    flaky = _Recorder(unavailable=2)
    target = recorder_server(flaky)
    seen = []
    with AllocatorClient(target, retry=FAST) as client:
        with pytest.raises(Unavailable) as err:
            for event in client.watch_executors("app"):
                seen.append(event.sequence)
    assert seen == [1, 2]
    assert err.value.details == "broken mid-stream"
    assert [c[0] for c in flaky.calls] == ["WatchExecutors"] * 3

    async def scenario():
        sequences = []
        async with AsyncAllocatorClient(target, retry=FAST) as client:
            with pytest.raises(Unavailable):
                async for event in client.watch_executors("app"):
                    sequences.append(event.sequence)
        return sequences

    assert asyncio.run(scenario()) == [1, 2]
    assert len(flaky.calls) == 4


def test_retry_policy_backoff_grows_and_is_bounded():
    policy = RetryPolicy(max_attempts=10, initial_backoff=0.1, max_backoff=0.4, multiplier=2, max_elapsed=100)
    for attempt, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.4), (9, 0.4)):
        for _ in range(20):
            assert ceiling / 2 <= policy.delay(attempt) <= ceiling
    import time

    now = time.monotonic()
    assert policy.next_delay(10, now) is None, "no attempt past max_attempts"
    assert policy.next_delay(1, now - 100) is None, "no attempt past max_elapsed"
    assert policy.next_delay(1, now) is not None
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff=2, max_backoff=1)


class _FakeRpcError(grpc.RpcError):
    """An RpcError as grpc raises it: also a Call with a code and details."""

    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"{self._code.name} from the fake"


def test_attempts_retry_unavailable_only_and_within_the_policy():
    from spark_pod_allocator._base import Attempts

    unavailable = _FakeRpcError(grpc.StatusCode.UNAVAILABLE)
    attempts = Attempts(FAST)
    delays = [attempts.delay_or_raise("GetStatus", unavailable) for _ in range(FAST.max_attempts - 1)]
    assert all(0 < d <= FAST.max_backoff for d in delays), delays
    with pytest.raises(Unavailable) as err:
        attempts.delay_or_raise("GetStatus", unavailable)
    assert err.value.method == "GetStatus"
    assert err.value.details == "UNAVAILABLE from the fake"
    assert err.value.__suppress_context__, "raised as the service's answer, not inside the RpcError"

    for code, error in (
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        (grpc.StatusCode.DEADLINE_EXCEEDED, spark_pod_allocator.DeadlineExceeded),
        (grpc.StatusCode.NOT_FOUND, NotFound),
    ):
        with pytest.raises(error):
            Attempts(FAST).delay_or_raise("GetStatus", _FakeRpcError(code))
    with pytest.raises(Unavailable):
        Attempts(FAST).delay_or_raise("WatchExecutors", unavailable, retryable=False)
    with pytest.raises(Unavailable):
        Attempts(RetryPolicy(max_attempts=1)).delay_or_raise("Stop", unavailable)


class _SyncCalls:
    """The calls of the retry test through the blocking client."""

    def __init__(self, target, **options):
        self.client = AllocatorClient(target, **options)

    def run(self, method, *args):
        try:
            with self.client:
                return getattr(self.client, method)(*args)
        except AllocatorError as err:
            return err


class _AsyncCalls:
    """The same calls through the asyncio client, each in an event loop of its own."""

    def __init__(self, target, **options):
        self.target, self.options = target, options

    def run(self, method, *args):
        async def call():
            try:
                async with AsyncAllocatorClient(self.target, **self.options) as client:
                    return await getattr(client, method)(*args)
            except AllocatorError as err:
                return err

        return asyncio.run(call())


@pytest.mark.parametrize("calls", [_SyncCalls, _AsyncCalls], ids=["sync", "asyncio"])
def test_both_clients_retry_the_same_calls_the_same_number_of_times(recorder_server, calls):
    flaky = _Recorder(unavailable=2)
    assert calls(recorder_server(flaky), retry=FAST).run("get_status", "app").last_executor_id == 3
    assert [c[0] for c in flaky.calls] == ["GetStatus"] * 3

    down = _Recorder(unavailable=100)
    assert isinstance(calls(recorder_server(down), retry=FAST).run("get_status", "app"), Unavailable)
    assert len(down.calls) == FAST.max_attempts

    refusing = _Recorder(code=grpc.StatusCode.INVALID_ARGUMENT)
    target = recorder_server(refusing)
    assert isinstance(calls(target, retry=FAST).run("get_status", "app"), InvalidArgument)
    assert isinstance(calls(target, retry=FAST).run("stop", "app"), Unavailable)
    assert [c[0] for c in refusing.calls] == ["GetStatus", "Stop"]

    stopping = _Recorder()
    result = calls(recorder_server(stopping), retry=FAST, retry_stop=True).run("stop", "app")
    assert isinstance(result, Unavailable)
    assert [c[0] for c in stopping.calls] == ["Stop"] * FAST.max_attempts


def test_a_stream_opened_after_a_break_sends_the_last_targets_again(recorder_server):
    # A replica that took the application over after a break may hold an older target (the
    # service answers SetTotalExpected before its registration holds it), and a caller
    # sends a target only when it changes: the resumed stream's first event sends it again.
    recorder = _Recorder()
    target = recorder_server(recorder)
    with AllocatorClient(target, retry=FAST) as client:
        client.set_total_expected("app", {0: 7})
        seen = []
        with pytest.raises(Unavailable):
            for event in client.watch_executors("app"):
                seen.append(event.sequence)
        assert recorder.targets == [{0: 7}], "a first stream sends nothing again"
        with pytest.raises(Unavailable):
            for event in client.watch_executors("app", since=seen[-1]):
                assert recorder.targets == [{0: 7}, {0: 7}], "sent before the first event"
                seen.append(event.sequence)
        assert recorder.targets == [{0: 7}, {0: 7}], "once per stream"
        # Another application's stream sends nothing of this one's.
        with pytest.raises(Unavailable):
            list(client.watch_executors("other", since=2))
        assert recorder.targets == [{0: 7}, {0: 7}]

    async def scenario():
        async with AsyncAllocatorClient(target, retry=FAST) as client:
            await client.set_total_expected("app", {0: 9})
            with pytest.raises(Unavailable):
                async for _ in client.watch_executors("app", since=2):
                    assert recorder.targets[-1] == {0: 9}
                    assert len(recorder.targets) == 4

    asyncio.run(scenario())
    # A stream retried before its first event was opened after a break too.
    flaky = _Recorder(unavailable=1)
    with AllocatorClient(recorder_server(flaky), retry=FAST) as client:
        client.set_total_expected("app", {0: 3})
        with pytest.raises(Unavailable):
            list(client.watch_executors("app"))
    assert flaky.targets == [{0: 3}, {0: 3}]


class _Reclaiming(pb_grpc.ExecutorAllocatorServicer):
    """Streams one RECLAIM event, as a budget's reclaim sends it."""

    def WatchExecutors(self, request, context):
        yield pb.ExecutorEvent(
            sequence=7,
            kind=pb.EXECUTOR_EVENT_KIND_RECLAIM,
            executor=pb.ExecutorPod(executor_id=5, pod_name="app-exec-5"),
            reclaim=pb.ExecutorReclaim(deadline_ms=1_700_000_060_000, budget="queue/gold"),
        )


def test_a_reclaim_event_carries_its_deadline_and_budget(recorder_server):
    with AllocatorClient(recorder_server(_Reclaiming()), retry=FAST) as client:
        (event,) = list(client.watch_executors("app"))
    assert event.kind == pb.EXECUTOR_EVENT_KIND_RECLAIM
    assert event.executor.executor_id == 5
    assert (event.reclaim.deadline_ms, event.reclaim.budget) == (1_700_000_060_000, "queue/gold")
