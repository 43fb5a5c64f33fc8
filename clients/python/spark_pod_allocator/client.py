"""Blocking client of the ExecutorAllocator service."""

from __future__ import annotations

import os
import time
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import grpc

from spark_pod_allocator import _requests
from spark_pod_allocator.errors import AllocatorError
from spark_pod_allocator.options import (
    NO_RETRY,
    BearerToken,
    PathOrBytes,
    RetryPolicy,
    channel_credentials,
    channel_options,
)
from spark_pod_allocator.v1 import allocator_pb2 as pb
from spark_pod_allocator.v1 import allocator_pb2_grpc as pb_grpc

Metadata = Sequence[Tuple[str, str]]


class AllocatorClient:
    """Blocking client of the ExecutorAllocator service.

    ``timeout`` (seconds) bounds every attempt of a call, so a driver's loop never hangs on
    the service. UNAVAILABLE is retried per ``retry`` (see :class:`RetryPolicy`); every
    method is idempotent and retried, except :meth:`stop` unless ``retry_stop`` (a Stop that
    reached the service before the connection broke would, retried, answer NOT_FOUND and lose
    the count of deleted pods). TLS is used when ``tls`` or a certificate is given;
    ``token``/``token_file`` add ``authorization: Bearer ...`` to every call (see
    :class:`BearerToken`). ``channel`` replaces the channel this client would open (then
    TLS and channel options are the caller's).
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: Optional[grpc.Channel] = None,
        timeout: float = 10.0,
        retry: RetryPolicy = RetryPolicy(),
        retry_stop: bool = False,
        tls: bool = False,
        root_certificates: Optional[PathOrBytes] = None,
        client_certificate: Optional[PathOrBytes] = None,
        client_key: Optional[PathOrBytes] = None,
        tls_server_name: Optional[str] = None,
        token: Optional[str] = None,
        token_file: Optional[Union[str, "os.PathLike[str]"]] = None,
        token_refresh: float = 60.0,
    ):
        self._own_channel = channel is None
        if channel is None:
            credentials = channel_credentials(tls, root_certificates, client_certificate, client_key)
            options = channel_options(retry, tls_server_name)
            if credentials is None:
                channel = grpc.insecure_channel(target, options=options)
            else:
                channel = grpc.secure_channel(target, credentials, options=options)
        self._channel = channel
        self._stub = pb_grpc.ExecutorAllocatorStub(channel)
        self._timeout = timeout
        self._retry = retry
        self._retry_stop = retry_stop
        self._token = (
            BearerToken(token, token_file, token_refresh)
            if token is not None or token_file is not None
            else None
        )

    def __enter__(self) -> "AllocatorClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            self._channel.close()

    def _metadata(self) -> Optional[Metadata]:
        return self._token.metadata() if self._token is not None else None

    def _call(self, method: str, request, retry: Optional[RetryPolicy] = None):
        policy = retry or self._retry
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return getattr(self._stub, method)(
                    request, timeout=self._timeout, metadata=self._metadata()
                )
            except grpc.RpcError as err:  # grpc raises a Call that is also an RpcError
                if err.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    delay = policy.next_delay(attempt, started)
                    if delay is not None:
                        time.sleep(delay)
                        continue
                raise AllocatorError.from_rpc_error(method, err) from None

    def start(
        self,
        application_id: str,
        namespace: str,
        executor_pod_template: str = "",
        *,
        driver_pod_name: str = "",
        pod_name_prefix: str = "",
        settings: Optional[Mapping[str, object]] = None,
        resource_profile_templates: Optional[Mapping[int, str]] = None,
    ) -> pb.StartResponse:
        """Starts (or resumes) allocation; ``settings`` keys are AllocationSettings fields.

        A repeated Start of a running application must repeat the first one (templates,
        effective settings, driver pod, prefix), else FAILED_PRECONDITION names the field;
        it may add resource profiles the application does not have yet.
        """
        request = _requests.start(
            application_id,
            namespace,
            executor_pod_template,
            driver_pod_name,
            pod_name_prefix,
            settings,
            resource_profile_templates,
        )
        return self._call("Start", request)

    def set_total_expected(
        self,
        application_id: str,
        executors_per_profile: Mapping[int, int],
        *,
        resource_profile_templates: Optional[Mapping[int, str]] = None,
    ) -> None:
        """Sets the wanted executors per resource profile.

        ``resource_profile_templates`` registers the pod templates (YAML or JSON) of
        profiles created after Start, before the targets apply (all or nothing); a known
        profile's template may be given again only unchanged.
        """
        self._call(
            "SetTotalExpected",
            _requests.set_total_expected(
                application_id, executors_per_profile, resource_profile_templates
            ),
        )

    def is_deleted(self, application_id: str, executor_id: object) -> bool:
        """True when the service deleted this executor: refuse its registration."""
        return self._call("IsDeleted", _requests.is_deleted(application_id, executor_id)).deleted

    def update_registered_executors(self, application_id: str, executor_ids: Iterable[object]) -> None:
        """Replaces the set of executors registered with the driver."""
        self._call(
            "UpdateRegisteredExecutors",
            _requests.update_registered_executors(application_id, executor_ids),
        )

    def get_status(self, application_id: str) -> pb.ApplicationStatus:
        """The application's allocation state."""
        return self._call("GetStatus", pb.GetStatusRequest(application_id=application_id))

    def stop(self, application_id: str) -> int:
        """Deletes every executor pod of the application; returns how many were deleted.

        Not retried on UNAVAILABLE unless the client was made with ``retry_stop=True``.
        """
        policy = self._retry if self._retry_stop else NO_RETRY
        return self._call("Stop", pb.StopRequest(application_id=application_id), policy).deleted_pods

    def watch_executors(
        self,
        application_id: str,
        since: int = 0,
        *,
        timeout: Optional[float] = None,
    ) -> Iterator[pb.ExecutorEvent]:
        """Iterates over the application's executor pod events as they happen.

        The stream starts with the full current state (``EXECUTOR_EVENT_KIND_SNAPSHOT``
        events, one per executor, then one ``EXECUTOR_EVENT_KIND_SYNCED``), unless ``since``
        (the ``sequence`` of an event received earlier) is still resumable: then only the
        changes after it come. Changes are ``EXECUTOR_EVENT_KIND_UPDATED`` (a pod added or
        changed; ``executor.state`` FAILED carries ``exit_code`` and ``reason``) and
        ``EXECUTOR_EVENT_KIND_DELETED``. A reader too slow for the service's per-stream
        buffer gets a fresh full state (SNAPSHOT events then SYNCED) in the middle of the
        stream: whatever it knew is replaced by it. ``executor.pod_json`` is the whole Pod.

        The iteration ends when the application is stopped or forgotten. ``timeout`` (no
        limit by default, unlike the other calls) bounds the whole stream. UNAVAILABLE
        before the first event is retried like the other calls; once events have come, a
        broken stream raises :class:`~spark_pod_allocator.errors.Unavailable` and the caller
        resumes with ``since`` = the last sequence it saw. Errors raise
        :class:`AllocatorError` subclasses (:class:`~spark_pod_allocator.errors.NotFound`
        for an unknown application); stopping the iteration early (``break``, ``close()``)
        cancels the stream.
        """
        request = pb.WatchExecutorsRequest(application_id=application_id, since=since)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            received = False
            call = self._stub.WatchExecutors(request, timeout=timeout, metadata=self._metadata())
            try:
                for event in call:
                    received = True
                    yield event
                return
            except grpc.RpcError as err:
                if not received and err.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    delay = self._retry.next_delay(attempt, started)
                    if delay is not None:
                        time.sleep(delay)
                        continue
                raise AllocatorError.from_rpc_error("WatchExecutors", err) from None
            finally:
                call.cancel()
