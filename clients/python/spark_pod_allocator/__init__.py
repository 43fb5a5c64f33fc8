"""A small Python client of spark-pod-allocator's gRPC API (spark.allocator.v1).

A Spark driver written in Python (or a test harness) uses :class:`AllocatorClient` to hand
executor-pod allocation to the service::

    with AllocatorClient("127.0.0.1:50051") as client:
        client.start("app-1", "spark", executor_pod_template=template_yaml)
        client.set_total_expected("app-1", {0: 10})
        ...
        client.stop("app-1")

and follows its executor pods with :meth:`AllocatorClient.watch_executors`.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Optional

import grpc

from spark.allocator.v1 import allocator_pb2 as pb
from spark.allocator.v1 import allocator_pb2_grpc as pb_grpc

__all__ = ["AllocatorClient", "AllocatorError", "pb"]

_SETTING_FIELDS = (
    "batch_size",
    "batch_delay_ms",
    "executor_timeout_ms",
    "executor_idle_timeout_ms",
    "max_pending_pods",
    "max_pending_pods_per_profile",
    "max_executors",
    "delete_on_termination",
    "executor_container_name",
    "check_all_containers",
)


class AllocatorError(Exception):
    """An RPC failed; ``code`` is the gRPC status code, ``details`` the server's message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


class AllocatorClient:
    """Blocking client of the ExecutorAllocator service.

    ``timeout`` (seconds) bounds every call, so a driver's loop never hangs on the service.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: Optional[grpc.Channel] = None,
        timeout: float = 10.0,
    ):
        self._own_channel = channel is None
        self._channel = channel if channel is not None else grpc.insecure_channel(target)
        self._stub = pb_grpc.ExecutorAllocatorStub(self._channel)
        self._timeout = timeout

    def __enter__(self) -> "AllocatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            self._channel.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as err:  # grpc raises a Call that is also an RpcError
            raise AllocatorError(method, err.code(), err.details() or "") from None

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
        unknown = set(settings or {}) - set(_SETTING_FIELDS)
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        request = pb.StartRequest(
            application_id=application_id,
            namespace=namespace,
            executor_pod_template=executor_pod_template,
            driver_pod_name=driver_pod_name,
            pod_name_prefix=pod_name_prefix,
            settings=pb.AllocationSettings(**dict(settings or {})),
            resource_profile_templates=dict(resource_profile_templates or {}),
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
            pb.SetTotalExpectedRequest(
                application_id=application_id,
                executors_per_profile=dict(executors_per_profile),
                resource_profile_templates=dict(resource_profile_templates or {}),
            ),
        )

    def is_deleted(self, application_id: str, executor_id) -> bool:
        """True when the service deleted this executor: refuse its registration."""
        response = self._call(
            "IsDeleted",
            pb.IsDeletedRequest(application_id=application_id, executor_id=str(executor_id)),
        )
        return response.deleted

    def update_registered_executors(self, application_id: str, executor_ids: Iterable) -> None:
        """Replaces the set of executors registered with the driver."""
        self._call(
            "UpdateRegisteredExecutors",
            pb.UpdateRegisteredExecutorsRequest(
                application_id=application_id,
                executor_ids=[str(i) for i in executor_ids],
            ),
        )

    def get_status(self, application_id: str) -> pb.ApplicationStatus:
        """The application's allocation state."""
        return self._call("GetStatus", pb.GetStatusRequest(application_id=application_id))

    def stop(self, application_id: str) -> int:
        """Deletes every executor pod of the application; returns how many were deleted."""
        return self._call("Stop", pb.StopRequest(application_id=application_id)).deleted_pods

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
        limit by default, unlike the other calls) bounds the whole stream. Errors raise
        :class:`AllocatorError` (NOT_FOUND for an unknown application); stopping the
        iteration early (``break``, ``close()``) cancels the stream.
        """
        call = self._stub.WatchExecutors(
            pb.WatchExecutorsRequest(application_id=application_id, since=since),
            timeout=timeout,
        )
        try:
            for event in call:
                yield event
        except grpc.RpcError as err:
            raise AllocatorError("WatchExecutors", err.code(), err.details() or "") from None
        finally:
            call.cancel()
