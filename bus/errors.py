"""The error kinds a handler raises to choose what happens to a message, and the bus's own errors.

Handlers raise TemporaryError (nak, redeliver after a delay) or PermanentError (term and a copy
to the dead-letter subject). Retry policy lives here and in the consumer loops, nowhere else.
"""

from __future__ import annotations


class BusError(Exception):
    """Base of every error the bus raises."""


class TemporaryError(BusError):
    """Try again later: the message is nak'ed with `delay` seconds."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(BusError):
    """This message can never succeed: term it and copy it to the dead-letter subject with the reason."""


class ConflictError(BusError):
    """An optimistic-concurrency publish lost: the subject's last sequence was not the expected one."""

    def __init__(self, message: str, *, subject: str, expected: int) -> None:
        super().__init__(message)
        self.subject = subject
        self.expected = expected


class RemoteError(BusError):
    """A request's responder failed while handling it (its handler raised); the message is its reason."""


class BusUnavailableError(BusError):
    """The bus could not be reached (or did not answer in time). `reason`, for a request: "no responders" (nobody
    got it), "no answer" (no reply in time: it may have been handled) or "connection" (lost under it: the same)."""

    def __init__(self, message: str, *, reason: str = "unavailable") -> None:
        super().__init__(message)
        self.reason = reason


class PayloadTooLargeError(BusError):
    """A message larger than the server's max_payload: it was not sent (the sender can only send less)."""
