"""What the sync and asyncio clients share: the constructor and the retry decision.

They differ only in how a call is made and how a retry waits (``time.sleep`` or
``await asyncio.sleep``), so each keeps just that loop and asks :class:`Attempts` after every
failure whether, and after how long, to try again.
"""

from __future__ import annotations

import os
import time
import types
from typing import Any, ClassVar, Dict, Generic, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import grpc.aio

from spark_pod_allocator.errors import AllocatorError
from spark_pod_allocator.options import (
    NO_RETRY,
    BearerToken,
    PathOrBytes,
    RetryPolicy,
    channel_credentials,
    channel_options,
)
from spark_pod_allocator.v1 import allocator_pb2_grpc as pb_grpc

Metadata = Sequence[Tuple[str, str]]

ChannelT = TypeVar("ChannelT", grpc.Channel, grpc.aio.Channel)


class Attempts:
    """One call's attempts under a :class:`RetryPolicy`, from its first attempt on (the
    policy's ``max_elapsed`` counts from there)."""

    def __init__(self, policy: RetryPolicy):
        self._policy = policy
        self._started = time.monotonic()
        self._failed = 0

    def delay_or_raise(self, method: str, err: grpc.RpcError, *, retryable: bool = True) -> float:
        """The wait before trying ``method`` again after ``err`` failed an attempt; raises
        ``err`` as its :class:`AllocatorError` when it is not to be retried: a code the
        policy does not retry, the policy's budget spent, or ``retryable`` false (a stream
        that already delivered events)."""
        self._failed += 1
        code = err.code() if hasattr(err, "code") else None
        if retryable and code in self._policy.RETRIED_CODES:
            delay = self._policy.next_delay(self._failed, self._started)
            if delay is not None:
                return delay
        raise AllocatorError.from_rpc_error(method, err) from None


class ClientBase(Generic[ChannelT]):
    """The options of both clients (documented on :class:`~spark_pod_allocator.AllocatorClient`)
    and what they make of them: the channel (unless given), the stub, the bearer token and
    the retry policy of each method."""

    # The client's flavour of grpc, whose channels it opens: ``grpc`` or ``grpc.aio``.
    _grpc: ClassVar[types.ModuleType]

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: Optional[ChannelT] = None,
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
                channel = self._grpc.insecure_channel(target, options=options)
            else:
                channel = self._grpc.secure_channel(target, credentials, options=options)
        self._channel: ChannelT = channel
        self._stub = pb_grpc.ExecutorAllocatorStub(channel)
        self._timeout = timeout
        self._retry = retry
        # A Stop that reached the service before the connection broke would, retried,
        # answer NOT_FOUND and lose the count of deleted pods.
        self._stop_retry = retry if retry_stop else NO_RETRY
        self._token = (
            BearerToken(token, token_file, token_refresh)
            if token is not None or token_file is not None
            else None
        )
        # The last SetTotalExpected the service answered, per application: sent again on the
        # first event of an executor stream opened after a break (see ``watch_executors``).
        self._answered_targets: Dict[str, Any] = {}

    def _targets_to_send_again(self, application_id: str, after_break: bool) -> Optional[Any]:
        """The application's last answered SetTotalExpected, if the stream being read was
        opened after a break (a resumed or retried stream), else None."""
        return self._answered_targets.get(application_id) if after_break else None

    def _metadata(self) -> Optional[Metadata]:
        return self._token.metadata() if self._token is not None else None
