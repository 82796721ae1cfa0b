"""The OpenAI error object and the exception that carries it.

:class:`ApiError` holds an HTTP status and the fields of the OpenAI error object
``{"error": {"message", "type", "param", "code"}}``. Request parsing (``openai_protocol``), routing
and the API key (``handler``) and engine failures (``streaming``) all raise it; the handler answers
with the status and :meth:`ApiError.body`, or, once a stream's headers are out, writes the body as
a ``data:`` event.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error response: HTTP status plus the OpenAI error object's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_parameter")
