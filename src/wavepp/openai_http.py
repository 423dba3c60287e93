"""What both HTTP servers share, `wavepp serve` (serve/) and `wavepp route` (route/): OpenAI's
error format, the JSON answer that carries it and the handler that turns a raised `APIError`
into it, the request body read under a byte limit, and the request fields that only choose
among tokens. Torch-free (FastAPI and the standard library only), so the router, a program of
its own, loads none of the engine.

    APIError(status, message, param)   {"error": {"message", "type", "param", "code"}} + status
    json_error(err)                    that body as a JSONResponse, with the error's headers
    answer_api_errors(app)             every APIError raised in a route answered so
    read_body(request, max_bytes)      the body; 413 as soon as it passes max_bytes
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.requests import Request

MiB = 2**20
DEFAULT_MAX_BODY_BYTES = 32 * MiB

# the sampling fields that only choose among tokens (serve/sampling.py's table): a prefill whose
# KV a decode engine takes on leaves them to the decode side (the router sends the prefill none)
TOKEN_CHOICE_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "n",
    "best_of",
    "min_tokens",
    "bad_words",
    "allowed_token_ids",
    "response_format",
)


class APIError(Exception):
    """A refusal in OpenAI's error format. `param` names the field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


def json_error(err: APIError) -> JSONResponse:
    """`err` as the answer: its body, its status and its headers (`Retry-After`)."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def answer_api_errors(app: "FastAPI") -> None:
    """Mutates `app`: an APIError raised in any of its routes is answered by `json_error`."""

    async def _handler(request, exc: APIError):
        return json_error(exc)

    app.add_exception_handler(APIError, _handler)


async def read_body(request: "Request", max_bytes: int) -> bytes:
    """The request's body, refused with 413 as soon as it passes `max_bytes` (by its
    Content-Length, or while it arrives): a larger body is never held in memory whole."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise _too_large(int(length), max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def short(value) -> str:
    """A value for an error message, bounded in length and depth whatever the client sent."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 3, 60, 60, 8, 8


def _too_large(size: int, max_bytes: int) -> APIError:
    return APIError(
        413,
        f"the request body has {size} bytes or more; this server takes at most "
        f"{max_bytes} (--max-body-bytes)",
        type_="invalid_request_error",
    )
