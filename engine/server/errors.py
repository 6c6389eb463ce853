"""Errors in the OpenAI shape {"error": {"message", "type", "param", "code"}} with the right status.

A client's mistake is never a 500: validation errors, malformed JSON and bad UTF-8 are 400, unknown
routes 404, and only a genuine server fault reaches the catch-all 500 handler."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("kvloop.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}
RETRY_AFTER_S = 1  # every 429 and 503 says when to come back; a load balancer or client may wait that long


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers
        self.request_id: str | None = None  # the engine request it ended, when it ended one mid-call


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    if status in (429, 503) and not any(k.lower() == "retry-after" for k in headers or {}):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def param_of(message: str) -> str | None:
    """SamplingParams messages start with the parameter's name ("max_tokens must be ...")."""
    head = message.split(" ", 1)[0]
    return head if head.replace("_", "").isalnum() and head.islower() else None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        return (f"{param} is not a parameter this server knows; unknown parameters are refused rather than "
                "silently ignored"), param
    msg = first.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(exc)
    return error_response(400, message, param)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else "request failed"
    if status == 400 and "parsing the body" in detail:
        detail = "the request body could not be parsed (invalid JSON or UTF-8)"
    return error_response(status, detail, headers=getattr(exc, "headers", None))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response(500, "internal server error", code="internal_error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
