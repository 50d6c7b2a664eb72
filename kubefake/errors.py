"""Errors of the fake apiserver, each a Kubernetes ``Status`` answer (made HTTP at the edge)."""

from __future__ import annotations

from typing import Any

from watchproxy.errors import status_object


class ApiError(Exception):
    """An apiserver failure: HTTP code, Status reason, message and optional details."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = {k: v for k, v in details.items() if v is not None}
        self.headers: dict[str, str] = {}

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, **self.details)


class BadRequest(ApiError):
    code = 400
    reason = "BadRequest"


class Unauthorized(ApiError):
    code = 401
    reason = "Unauthorized"


class Forbidden(ApiError):
    code = 403
    reason = "Forbidden"


class NotFound(ApiError):
    code = 404
    reason = "NotFound"


class MethodNotAllowed(ApiError):
    code = 405
    reason = "MethodNotAllowed"


class NotAcceptable(ApiError):
    code = 406
    reason = "NotAcceptable"


class AlreadyExists(ApiError):
    code = 409
    reason = "AlreadyExists"


class Conflict(ApiError):
    code = 409
    reason = "Conflict"


class Expired(ApiError):
    code = 410
    reason = "Expired"


class UnsupportedMediaType(ApiError):
    code = 415
    reason = "UnsupportedMediaType"


class Invalid(ApiError):
    code = 422
    reason = "Invalid"


class TooManyRequests(ApiError):
    code = 429
    reason = "TooManyRequests"


class InternalError(ApiError):
    code = 500
    reason = "InternalError"


class ServiceUnavailable(ApiError):
    code = 503
    reason = "ServiceUnavailable"


class Timeout(ApiError):
    code = 504
    reason = "Timeout"


_BY_CODE: dict[int, type[ApiError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        NotFound,
        MethodNotAllowed,
        NotAcceptable,
        Conflict,
        Expired,
        UnsupportedMediaType,
        Invalid,
        TooManyRequests,
        InternalError,
        ServiceUnavailable,
        Timeout,
    )
}


def error_for_code(code: int, message: str, **details: Any) -> ApiError:
    """The named error for an HTTP code (InternalError for codes without a name here)."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, **details)
    err = ApiError(message, **details)
    err.code = code
    err.reason = "Unknown"
    return err
