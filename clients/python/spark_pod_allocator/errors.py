"""Exceptions of the client: one class per gRPC status code, all :class:`AllocatorError`."""

from __future__ import annotations

from typing import Dict, Type

import grpc


class AllocatorError(Exception):
    """An RPC failed; ``code`` is the gRPC status code, ``details`` the server's message
    (for a client mistake it starts with the offending field, e.g. ``application_id: ...``)."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details

    @staticmethod
    def from_rpc_error(method: str, err: grpc.RpcError) -> "AllocatorError":
        """The exception of the class matching ``err``'s status code."""
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = (err.details() if hasattr(err, "details") else None) or ""
        return _BY_CODE.get(code, AllocatorError)(method, code, details)


class Cancelled(AllocatorError):
    """CANCELLED: the call was cancelled, usually by the caller."""


class Unknown(AllocatorError):
    """UNKNOWN."""


class InvalidArgument(AllocatorError):
    """INVALID_ARGUMENT: the request is malformed; ``details`` names the field."""


class DeadlineExceeded(AllocatorError):
    """DEADLINE_EXCEEDED: the call's timeout passed."""


class NotFound(AllocatorError):
    """NOT_FOUND: the application is not (or no longer) known to the service."""


class AlreadyExists(AllocatorError):
    """ALREADY_EXISTS."""


class PermissionDenied(AllocatorError):
    """PERMISSION_DENIED: the service (or Kubernetes behind it) refused the caller."""


class ResourceExhausted(AllocatorError):
    """RESOURCE_EXHAUSTED: a limit of the service was reached."""


class FailedPrecondition(AllocatorError):
    """FAILED_PRECONDITION: the request conflicts with the application's state; ``details``
    names the field."""


class Aborted(AllocatorError):
    """ABORTED."""


class OutOfRange(AllocatorError):
    """OUT_OF_RANGE."""


class Unimplemented(AllocatorError):
    """UNIMPLEMENTED: the service does not have this method (an older version)."""


class Internal(AllocatorError):
    """INTERNAL: a bug or an unexpected failure in the service."""


class Unavailable(AllocatorError):
    """UNAVAILABLE: the service could not be reached (after the retries, if any)."""


class DataLoss(AllocatorError):
    """DATA_LOSS."""


class Unauthenticated(AllocatorError):
    """UNAUTHENTICATED: missing or wrong credentials (bearer token, client certificate)."""


_BY_CODE: Dict[grpc.StatusCode, Type[AllocatorError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}
