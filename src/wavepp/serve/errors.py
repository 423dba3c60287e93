"""Refusals in OpenAI's error format: {"error": {"message", "type", "param", "code"}} with the
HTTP status; `param` names the field at fault."""

from __future__ import annotations

import reprlib


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


def short(value) -> str:
    """A value for an error message, bounded in length and depth whatever the client sent."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 3, 60, 60, 8, 8
