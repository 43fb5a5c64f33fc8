"""Blocking client of the ExecutorAllocator service."""

from __future__ import annotations

import time
from typing import Iterable, Iterator, Mapping, Optional

import grpc

from spark_pod_allocator import _requests
from spark_pod_allocator._base import Attempts, ClientBase
from spark_pod_allocator.options import RetryPolicy
from spark_pod_allocator.v1 import allocator_pb2 as pb


class AllocatorClient(ClientBase[grpc.Channel]):
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

    _grpc = grpc

    def __enter__(self) -> "AllocatorClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            self._channel.close()

    def _call(self, method: str, request, retry: Optional[RetryPolicy] = None):
        attempts = Attempts(retry or self._retry)
        while True:
            try:
                return getattr(self._stub, method)(
                    request, timeout=self._timeout, metadata=self._metadata()
                )
            except grpc.RpcError as err:  # grpc raises a Call that is also an RpcError
                time.sleep(attempts.delay_or_raise(method, err))

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
        executor_claim_templates: Optional[Iterable[str]] = None,
    ) -> pb.StartResponse:
        """Starts (or resumes) allocation; ``settings`` keys are AllocationSettings fields.

        ``executor_claim_templates`` are PersistentVolumeClaims (YAML or JSON) made for each
        executor, as Spark's ``OnDemand`` claims (``{{EXECUTOR_ID}}`` substituted); the pod
        template mounts them by name.

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
            executor_claim_templates,
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
        request = _requests.set_total_expected(
            application_id, executors_per_profile, resource_profile_templates
        )
        self._call("SetTotalExpected", request)
        self._answered_targets[application_id] = request

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
        request = pb.StopRequest(application_id=application_id)
        deleted = self._call("Stop", request, self._stop_retry).deleted_pods
        self._answered_targets.pop(application_id, None)
        return deleted

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
        ``EXECUTOR_EVENT_KIND_DELETED``. ``EXECUTOR_EVENT_KIND_RECLAIM`` asks the driver to
        give the executor back by ``reclaim.deadline_ms`` (a budget's owner wants its
        guaranteed part, ``reclaim.budget``); the pod is deleted once the executor exited,
        or at the deadline. It comes again after the SYNCED of a full state while the
        reclaim lasts. A reader too slow for the service's per-stream
        buffer gets a fresh full state (SNAPSHOT events then SYNCED) in the middle of the
        stream: whatever it knew is replaced by it. ``executor.pod_json`` is the whole Pod.

        A stream opened after a break (``since`` given, or retried here) may be answered by
        another replica, or a restarted one, whose copy of the application lacks the last
        target this client set (the service answers SetTotalExpected before its
        registration holds it). So on such a stream's first event, this client sends the
        application's last answered SetTotalExpected again, as the Spark plugin does.

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
        attempts = Attempts(self._retry)
        after_break = since != 0
        while True:
            received = False
            call = self._stub.WatchExecutors(request, timeout=timeout, metadata=self._metadata())
            try:
                for event in call:
                    if not received:
                        targets = self._targets_to_send_again(application_id, after_break)
                        if targets is not None:
                            self._call("SetTotalExpected", targets)
                    received = True
                    yield event
                return
            except grpc.RpcError as err:
                # Once events came, a new stream would repeat them: the caller resumes instead.
                time.sleep(attempts.delay_or_raise("WatchExecutors", err, retryable=not received))
                after_break = True
            finally:
                call.cancel()
