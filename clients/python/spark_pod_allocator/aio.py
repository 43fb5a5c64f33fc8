"""asyncio client of the ExecutorAllocator service (``grpc.aio``)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable, Mapping, Optional

import grpc
import grpc.aio

from spark_pod_allocator import _requests
from spark_pod_allocator._base import Attempts, ClientBase
from spark_pod_allocator.options import RetryPolicy
from spark_pod_allocator.v1 import allocator_pb2 as pb


class AsyncAllocatorClient(ClientBase[grpc.aio.Channel]):
    """The :class:`~spark_pod_allocator.AllocatorClient` for asyncio: the same options and
    methods, as coroutines, and :meth:`watch_executors` as an async iterator.

    Make it inside the event loop that uses it (``async with AsyncAllocatorClient(...)``).
    """

    _grpc = grpc.aio

    async def __aenter__(self) -> "AsyncAllocatorClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            await self._channel.close(None)

    async def _call(self, method: str, request, retry: Optional[RetryPolicy] = None):
        attempts = Attempts(retry or self._retry)
        while True:
            try:
                return await getattr(self._stub, method)(
                    request, timeout=self._timeout, metadata=self._metadata()
                )
            except grpc.RpcError as err:
                await asyncio.sleep(attempts.delay_or_raise(method, err))

    async def start(
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
        """See :meth:`spark_pod_allocator.AllocatorClient.start`."""
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
        return await self._call("Start", request)

    async def set_total_expected(
        self,
        application_id: str,
        executors_per_profile: Mapping[int, int],
        *,
        resource_profile_templates: Optional[Mapping[int, str]] = None,
    ) -> None:
        """See :meth:`spark_pod_allocator.AllocatorClient.set_total_expected`."""
        request = _requests.set_total_expected(
            application_id, executors_per_profile, resource_profile_templates
        )
        await self._call("SetTotalExpected", request)
        self._answered_targets[application_id] = request

    async def is_deleted(self, application_id: str, executor_id: object) -> bool:
        """True when the service deleted this executor: refuse its registration."""
        response = await self._call("IsDeleted", _requests.is_deleted(application_id, executor_id))
        return response.deleted

    async def update_registered_executors(
        self, application_id: str, executor_ids: Iterable[object]
    ) -> None:
        """Replaces the set of executors registered with the driver."""
        await self._call(
            "UpdateRegisteredExecutors",
            _requests.update_registered_executors(application_id, executor_ids),
        )

    async def get_status(self, application_id: str) -> pb.ApplicationStatus:
        """The application's allocation state."""
        return await self._call("GetStatus", pb.GetStatusRequest(application_id=application_id))

    async def stop(self, application_id: str) -> int:
        """Deletes every executor pod of the application; returns how many were deleted.

        Not retried on UNAVAILABLE unless the client was made with ``retry_stop=True``.
        """
        request = pb.StopRequest(application_id=application_id)
        response = await self._call("Stop", request, self._stop_retry)
        self._answered_targets.pop(application_id, None)
        return response.deleted_pods

    async def watch_executors(
        self,
        application_id: str,
        since: int = 0,
        *,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[pb.ExecutorEvent]:
        """See :meth:`spark_pod_allocator.AllocatorClient.watch_executors`; ``aclose()``
        (or leaving ``async for`` early) cancels the stream."""
        request = pb.WatchExecutorsRequest(application_id=application_id, since=since)
        attempts = Attempts(self._retry)
        after_break = since != 0
        while True:
            received = False
            call = self._stub.WatchExecutors(request, timeout=timeout, metadata=self._metadata())
            try:
                async for event in call:
                    if not received:
                        targets = self._targets_to_send_again(application_id, after_break)
                        if targets is not None:
                            await self._call("SetTotalExpected", targets)
                    received = True
                    yield event
                return
            except grpc.RpcError as err:
                delay = attempts.delay_or_raise("WatchExecutors", err, retryable=not received)
                await asyncio.sleep(delay)
                after_break = True
            finally:
                call.cancel()
