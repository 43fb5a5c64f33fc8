package io.github.sparkpodallocator.spark;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;

/** A call to the allocation service that failed for good, naming the call and the status. */
public final class AllocatorServiceException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final Status.Code code;

  AllocatorServiceException(String call, StatusRuntimeException cause) {
    super("spark-pod-allocator " + call + " failed: " + cause.getStatus().getCode() + ": "
        + cause.getStatus().getDescription(), cause);
    this.code = cause.getStatus().getCode();
  }

  AllocatorServiceException(String message, InterruptedException cause) {
    super(message, cause);
    this.code = Status.Code.CANCELLED;
  }

  /** The gRPC status code of the failure. */
  public Status.Code code() {
    return code;
  }
}
