"""Request bodies under limits: the size cap while reading, then JSON that cannot hurt the server.

:func:`read_body` runs on the event loop and reads at most ``limit`` bytes: a ``Content-Length``
over the cap is refused before a byte of the body is read, and a chunked body is counted as it
arrives. :func:`parse_json_body` runs in a worker thread (the body may be megabytes) and turns
everything a JSON parser can choke on into a 400 ``invalid_json`` instead of a 500:

* invalid UTF-8, invalid JSON, ``NaN``/``Infinity``, a body that is not an object;
* an integer of more than 4,300 digits (Python refuses to convert it: ``ValueError``);
* nesting deeper than :data:`MAX_JSON_DEPTH` (and a parser ``RecursionError`` far beyond it);
* a lone UTF-16 surrogate written as an escape (``"\\ud800"``): valid JSON, but not Unicode that
  a tokenizer can encode or a response can carry.
"""

from __future__ import annotations

import json

from starlette.requests import Request

from helios_jax.serve.flags import MAX_BODY_BYTES
from helios_jax.serve.openai_errors import ApiError, bad_request

MAX_JSON_DEPTH = 32  # an OpenAI body nests 5 deep (messages[i].content[j].image_url)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request bodies are limited to {limit} bytes", code="request_too_large")


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, or a 413 as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise bad_request("invalid Content-Length header") from None
        if length > limit:
            raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str):
    raise bad_request(f"invalid JSON: {name} is not a JSON number", code="invalid_json")


def _invalid(message: str) -> ApiError:
    return bad_request(message, code="invalid_json")


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400 ``invalid_json`` (see the module docstring)."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise _invalid("the request body is not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise _invalid(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise _invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:  # int() of a number with more digits than Python converts
        raise _invalid("the request body has a number with too many digits") from None
    if not isinstance(body, dict):
        raise _invalid(f"the request body must be a JSON object, got {type(body).__name__}")
    check_json_values(body)
    return body


def check_json_values(body: dict) -> None:
    """Depth at most MAX_JSON_DEPTH and every string (keys too) encodable as UTF-8; iterative,
    so a deep body cannot exhaust the stack here."""
    pending: list[tuple[object, int]] = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            _check_string(value)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise _invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string(key)
                pending.append((item, depth + 1))
        else:
            pending.extend((item, depth + 1) for item in value)


def _check_string(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid("the request body has a lone surrogate (\\ud800-\\udfff): not valid Unicode") from None
