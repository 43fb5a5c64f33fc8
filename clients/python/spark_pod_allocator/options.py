"""Connection options shared by the sync and async clients: retries, TLS, bearer token."""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import ClassVar, FrozenSet, List, Optional, Tuple, Union

import grpc

PathOrBytes = Union[str, "os.PathLike[str]", bytes]


@dataclass(frozen=True)
class RetryPolicy:
    """How UNAVAILABLE (service down, restarting, unreachable) is retried.

    A call is tried at most ``max_attempts`` times and never retried once ``max_elapsed``
    seconds have passed since its first attempt; between attempts it waits a random time in
    [backoff/2, backoff], backoff starting at ``initial_backoff`` and multiplied by
    ``multiplier`` up to ``max_backoff``. Only UNAVAILABLE is retried: every other code is
    the service's answer. ``RetryPolicy(max_attempts=1)`` disables retries.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    max_elapsed: float = 30.0

    # Every other code is the service's answer (or the caller's deadline), which a retry
    # would only repeat.
    RETRIED_CODES: ClassVar[FrozenSet[grpc.StatusCode]] = frozenset({grpc.StatusCode.UNAVAILABLE})

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ValueError("need 0 <= initial_backoff <= max_backoff")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        backoff = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return random.uniform(backoff / 2, backoff)

    def next_delay(self, attempt: int, started: float) -> Optional[float]:
        """The wait before another attempt, or None when the budget is spent."""
        if attempt >= self.max_attempts:
            return None
        delay = self.delay(attempt)
        if time.monotonic() + delay - started > self.max_elapsed:
            return None
        return delay


NO_RETRY = RetryPolicy(max_attempts=1)


def _read(value: Optional[PathOrBytes]) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


class BearerToken:
    """The ``authorization: Bearer ...`` metadata of every call.

    From a fixed ``token`` or from ``token_file`` (e.g. a projected service-account token,
    which the kubelet rotates): the file is read again when ``refresh`` seconds have passed
    since it was last read (0: before every call).
    """

    def __init__(
        self,
        token: Optional[str] = None,
        token_file: Optional[Union[str, "os.PathLike[str]"]] = None,
        refresh: float = 60.0,
    ):
        if (token is None) == (token_file is None):
            raise ValueError("give exactly one of token and token_file")
        self._token = token.strip() if token is not None else None
        self._file = token_file
        self._refresh = refresh
        self._read_at: Optional[float] = None
        self._lock = threading.Lock()

    def value(self) -> str:
        """The current token (re-read from the file when due)."""
        if self._file is None:
            return self._token or ""
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= self._refresh:
                with open(self._file, "r", encoding="utf-8") as f:
                    self._token = f.read().strip()
                self._read_at = now
            return self._token or ""

    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.value()}"),)


def channel_credentials(
    tls: bool,
    root_certificates: Optional[PathOrBytes],
    client_certificate: Optional[PathOrBytes],
    client_key: Optional[PathOrBytes],
) -> Optional[grpc.ChannelCredentials]:
    """TLS credentials when ``tls`` or any certificate is given, else None (plaintext).

    Certificates and key are PEM, as bytes or a file path; without ``root_certificates``
    the system's roots are used. A client certificate needs its key (mutual TLS).
    """
    if (client_certificate is None) != (client_key is None):
        raise ValueError("client_certificate and client_key go together")
    if not (tls or root_certificates is not None or client_certificate is not None):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(root_certificates),
        private_key=_read(client_key),
        certificate_chain=_read(client_certificate),
    )


def channel_options(retry: RetryPolicy, tls_server_name: Optional[str]) -> List[Tuple[str, object]]:
    """gRPC channel options: reconnect no slower than the retry backoff (else retries would
    meet a channel still waiting out its own, longer, reconnect backoff)."""
    options: List[Tuple[str, object]] = [
        ("grpc.initial_reconnect_backoff_ms", max(1, int(retry.initial_backoff * 1000))),
        ("grpc.min_reconnect_backoff_ms", max(1, int(retry.initial_backoff * 1000))),
        ("grpc.max_reconnect_backoff_ms", max(1, int(retry.max_backoff * 1000))),
    ]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return options
