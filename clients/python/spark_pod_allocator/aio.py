"""asyncio client of the ExecutorAllocator service (``grpc.aio``)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import AsyncIterator, Iterable, Mapping, Optional, Union

import grpc
import grpc.aio

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


class AsyncAllocatorClient:
    """The :class:`~spark_pod_allocator.AllocatorClient` for asyncio: the same options and
    methods, as coroutines, and :meth:`watch_executors` as an async iterator.

    Make it inside the event loop that uses it (``async with AsyncAllocatorClient(...)``).
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: Optional[grpc.aio.Channel] = None,
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
                channel = grpc.aio.insecure_channel(target, options=options)
            else:
                channel = grpc.aio.secure_channel(target, credentials, options=options)
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

    async def __aenter__(self) -> "AsyncAllocatorClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._own_channel:
            await self._channel.close(None)

    def _metadata(self):
        return self._token.metadata() if self._token is not None else None

    async def _call(self, method: str, request, retry: Optional[RetryPolicy] = None):
        policy = retry or self._retry
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await getattr(self._stub, method)(
                    request, timeout=self._timeout, metadata=self._metadata()
                )
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    delay = policy.next_delay(attempt, started)
                    if delay is not None:
                        await asyncio.sleep(delay)
                        continue
                raise AllocatorError.from_rpc_error(method, err) from None

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
        await self._call(
            "SetTotalExpected",
            _requests.set_total_expected(
                application_id, executors_per_profile, resource_profile_templates
            ),
        )

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
        policy = self._retry if self._retry_stop else NO_RETRY
        response = await self._call("Stop", pb.StopRequest(application_id=application_id), policy)
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
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            received = False
            call = self._stub.WatchExecutors(request, timeout=timeout, metadata=self._metadata())
            try:
                async for event in call:
                    received = True
                    yield event
                return
            except grpc.RpcError as err:
                if not received and err.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    delay = self._retry.next_delay(attempt, started)
                    if delay is not None:
                        await asyncio.sleep(delay)
                        continue
                raise AllocatorError.from_rpc_error("WatchExecutors", err) from None
            finally:
                call.cancel()
