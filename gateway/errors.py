"""The one error tree of thinkgate, and how each error looks on the wire.

::

    GatewayError                        (500 server_error)
    ├── ClientError                     the caller did something wrong (4xx)
    │   ├── InvalidRequest              400 invalid_request_error, with ``param``
    │   ├── RequestTooLarge             413 invalid_request_error / request_too_large
    │   ├── RequestTimeout              408 request_timeout (body not sent in BODY_TIMEOUT_S)
    │   ├── ClientClosedRequest         499 client_closed_request (gone mid-upload)
    │   ├── HeadersTooLarge             431 headers_too_large
    │   ├── RouteError(status)          the framework's own refusal of a route (405, …)
    │   ├── AuthError                   401 authentication_error / invalid_api_key
    │   ├── PermissionDenied            403 permission_error
    │   ├── NotFound                    404 not_found_error (``model_not_found`` for models)
    │   └── RateLimited(retry_after)    429 rate_limit_error, ``retry-after`` header
    ├── UpstreamError                   the model server failed us (5xx unless relayed)
    │   ├── UpstreamConnectError        502 upstream_error / upstream_unreachable
    │   ├── UpstreamTimeout             504 timeout / upstream_timeout
    │   ├── UpstreamProtocolError       502 upstream_error / upstream_protocol_error
    │   └── UpstreamStatusError         the upstream's own status and message (4xx relayed,
    │                                   5xx as 502/503)
    ├── ServiceUnavailable              503 service_unavailable (no upstream, overloaded)
    │   └── DatabaseUnavailable         503 database_unavailable, ``retry-after``
    └── LedgerError                     503 ledger_error
        ├── LedgerUnavailable
        └── LedgerIntegrityError

The sans-I/O parsers raise the h11-style pair below, which say whose fault it is:
``RemoteProtocolError`` (the peer sent garbage) and ``LocalProtocolError`` (the caller misused
the API). The shell translates ``RemoteProtocolError`` from an upstream into
``UpstreamProtocolError``.

Errors are complete when raised: nothing is set on one afterwards. What the context adds (the
request's ``x-ratelimit-*`` headers, the engine that failed) makes a new error with
``with_headers`` / ``at``, raised in the old one's place. Each class carries its ``outcome``,
the one classification the record, the metrics and the log share (``Outcome``).

Every rendered error is an OpenAI error object, ``{"error": {"message", "type", "param",
"code"}}`` (OpenAI API reference, "Error codes"). Messages never contain secrets, prompts or
reasoning text: constructors take only what is safe to show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

import orjson

# How a request ended, for the record, ``thinkgate_requests_total`` and the access log.
Outcome = Literal["ok", "invalid", "rate_limited", "upstream_error", "client_disconnected", "error"]


class ProtocolError(Exception):
    """A sans-I/O parser was given input it cannot accept."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that violate the protocol (its fault, not ours). ``events``: what a
    parser had already decoded from the same input before the violation (still good)."""

    def __init__(self, message: str, events: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.events = list(events)


class LocalProtocolError(ProtocolError):
    """The caller used a parser wrongly, e.g. fed it after ``close()`` (our fault)."""


class GatewayError(Exception):
    """Base of every error that thinkgate renders to a client."""

    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"
    outcome: Outcome = "error"
    # Headers of the request's context that every response carries, errors included (the
    # ``x-ratelimit-*`` of an admitted request that then failed upstream): ``with_headers``.
    context_headers: tuple[tuple[str, str], ...] = ()

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def to_anthropic(self) -> bytes:
        """The error in Anthropic's shape (the Messages API), typed by status."""
        return anthropic_error(self.status, self.message)

    def with_headers(self, headers: Sequence[tuple[str, str]]) -> Self:
        """This error, for a response that also carries ``headers`` (a new error)."""
        if not headers:
            return self
        return self._copy(context_headers=tuple(headers))

    def _copy(self, **changes: Any) -> Self:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__, **changes)
        new.args = self.args
        return new

    def headers(self) -> dict[str, str]:
        """Extra response headers this error needs (``retry-after`` for 429)."""
        return dict(self.context_headers)


class ClientError(GatewayError):
    status = 400
    type = "invalid_request_error"
    code: str | None = None
    outcome: Outcome = "invalid"


class InvalidRequest(ClientError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class RequestTooLarge(ClientError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RequestTimeout(ClientError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class ClientClosedRequest(ClientError):
    """The client went away before its request was read (nginx's 499; nobody reads it)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"
    outcome: Outcome = "client_disconnected"


class RouteError(ClientError):
    """The framework refused the route itself (405 method not allowed, say): its status."""

    code = None

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, code="method_not_allowed" if status == 405 else None)
        self.status = status


class HeadersTooLarge(ClientError):
    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class AuthError(ClientError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(ClientError):
    status = 403
    type = "permission_error"
    code = "insufficient_permissions"


class NotFound(ClientError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class Conflict(ClientError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class RateLimited(ClientError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    outcome: Outcome = "rate_limited"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float,
        code: str | None = None,
        limit_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message, code=code)
        self.retry_after = retry_after
        if limit_type is not None:  # OpenAI says which limit: "requests" or "tokens"
            self.type = limit_type
        self._headers = dict(headers or {})

    def headers(self) -> dict[str, str]:
        # The openai SDK honours retry-after-ms before retry-after (whole seconds, rounded up).
        return {
            **super().headers(),
            **self._headers,
            "retry-after": str(max(1, math.ceil(self.retry_after))),
            "retry-after-ms": str(max(1, math.ceil(self.retry_after * 1000))),
        }


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"
    outcome: Outcome = "upstream_error"
    # Whether another upstream may be tried: true only when nothing reached the model yet.
    retryable = False
    # Which model server failed, once known (``at``, where the attempt was made): the record's.
    upstream_url: str | None = None

    def at(self, upstream_url: str) -> Self:
        """This error, as the model server ``upstream_url`` caused it (a new error)."""
        return self._copy(upstream_url=upstream_url)


class UpstreamConnectError(UpstreamError):
    status = 502
    code = "upstream_unreachable"
    retryable = True


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"
    retryable = True


class UpstreamProtocolError(UpstreamError):
    status = 502
    code = "upstream_protocol_error"


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status; 4xx are relayed as they are."""

    @classmethod
    def from_body(cls, body: Any, status: int) -> UpstreamStatusError:
        """An upstream error object (OpenAI's, or vLLM's flat ``{"object": "error"}``) as ours;
        only its message (bounded), ``param`` and ``code`` are kept."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            error = body if isinstance(body, dict) else {}
        message = error.get("message")
        if not isinstance(message, str) or not message:
            message = f"upstream returned status {status}"
        param, code = error.get("param"), error.get("code")
        return cls(
            status,
            message[:2000],
            param=param if isinstance(param, str) else None,
            code=_openai_code(code, status),
        )

    def __init__(self, status: int, message: str, *, param: str | None, code: str | None):
        super().__init__(message, param=param, code=code)
        self.upstream_status = status
        if status < 500:  # the client's request, refused by the engine: relayed as it is
            self.status = status
            self.type = "invalid_request_error"
            self.outcome = "invalid"
        else:
            self.status = 503 if status == 503 else 502
            self.retryable = True


_CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "insufficient_permissions",
          404: "not_found", 413: "request_too_large", 422: "invalid_request",
          429: "rate_limit_exceeded"}  # fmt: skip


def _openai_code(code: Any, status: int) -> str | None:
    """An upstream's error code as an OpenAI code: vLLM sends the HTTP status (``400`` or
    ``"400"``) where OpenAI sends a word, so a number becomes the word for its status."""
    if code is None:
        return None
    text = str(code)
    if not text.isdigit():
        return text
    return _CODES.get(status, "invalid_request" if status < 500 else "upstream_error")


class ServiceUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "service_unavailable"
    outcome: Outcome = "upstream_error"


class DatabaseUnavailable(ServiceUnavailable):
    """The database is away and the request needs it (a key not seen recently, a stored
    response): try again shortly, as ``retry-after`` says (``gateway.db.DatabaseHealth``)."""

    code = "database_unavailable"
    outcome: Outcome = "error"
    retry_after = 1

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "retry-after": str(self.retry_after)}


class LedgerError(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "ledger_error"


class LedgerUnavailable(LedgerError):
    code = "ledger_unavailable"


class LedgerIntegrityError(LedgerError):
    status = 500
    type = "server_error"
    code = "ledger_integrity_error"


_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error", 529: "overloaded_error",
}  # fmt: skip


def anthropic_error(status: int, message: str) -> bytes:
    """``{"type": "error", "error": {"type", "message"}}``: a 4xx without a type of its own is
    an ``invalid_request_error``, a 5xx an ``api_error``."""
    kind = _ANTHROPIC_TYPES.get(status)
    if kind is None:
        kind = "invalid_request_error" if status < 500 else "api_error"
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
