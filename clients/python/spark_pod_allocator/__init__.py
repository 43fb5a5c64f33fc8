"""Python client of spark-pod-allocator's gRPC API (spark.allocator.v1).

A Spark driver written in Python (or a test harness) uses :class:`AllocatorClient` (or
:class:`AsyncAllocatorClient` under asyncio) to hand executor-pod allocation to the service::

    with AllocatorClient("127.0.0.1:50051") as client:
        client.start("app-1", "spark", executor_pod_template=template_yaml)
        client.set_total_expected("app-1", {0: 10})
        ...
        client.stop("app-1")

and follows its executor pods with :meth:`AllocatorClient.watch_executors`. Failed calls
raise a subclass of :class:`AllocatorError` per gRPC code (:class:`NotFound`,
:class:`InvalidArgument`, ...). ``pb`` is the generated message module.
"""

from spark_pod_allocator._version import __version__
from spark_pod_allocator.aio import AsyncAllocatorClient
from spark_pod_allocator.client import AllocatorClient
from spark_pod_allocator.errors import (
    Aborted,
    AllocatorError,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from spark_pod_allocator.options import BearerToken, RetryPolicy
from spark_pod_allocator.v1 import allocator_pb2 as pb
from spark_pod_allocator.v1 import allocator_pb2_grpc as pb_grpc

__all__ = [
    "__version__",
    "AllocatorClient",
    "AsyncAllocatorClient",
    "AllocatorError",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "BearerToken",
    "RetryPolicy",
    "pb",
    "pb_grpc",
]
