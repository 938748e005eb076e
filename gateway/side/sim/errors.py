"""The errors the simulator answers with, in vLLM's shape (sans-I/O).

``SimRequestError`` is a request vLLM would refuse: its HTTP status, error type, message and
the offending parameter; ``body()`` renders vLLM's ``{"error": {"message", "type", "param",
"code"}}``. ``bad_request`` is the common 400.
"""

from __future__ import annotations

import orjson


class SimRequestError(Exception):
    """The client sent a request vLLM would refuse; carries the HTTP status and error type."""

    def __init__(self, status: int, error_type: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.status)


def error_body(message: str, error_type: str, param: str | None, code: int) -> bytes:
    """vLLM's error object."""
    error = {"message": message, "type": error_type, "param": param, "code": code}
    return orjson.dumps({"error": error})


def bad_request(message: str, param: str | None = None) -> SimRequestError:
    """vLLM's 400 ``BadRequestError``."""
    return SimRequestError(400, "BadRequestError", message, param)
