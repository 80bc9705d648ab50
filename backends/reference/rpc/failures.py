"""How a failed request travels: (exception type, torch's text), formatted once on the callee.

The agent answers with these pairs and raises them on the caller; the owner
table (owners.py) keeps a failed remote()'s pair for every later fetch.
"""

from __future__ import annotations

import sys
import traceback


def remote_exception(info, exc: BaseException) -> tuple[type, str]:
    """(type, text) as torch's internal._run_function formats a UDF's exception (and logs it)."""
    text = f"On {info}:\n{repr(exc)}\n{traceback.format_exc()}"
    print(text, file=sys.stderr)
    return type(exc), text


def raise_remote(exc_type: type, text: str) -> BaseException:
    """The caller's exception: the original type with torch's text ("ValueError: On WorkerInfo...")."""
    try:  # torch's internal._handle_exception decodes the text: repr's "\\n" becomes a line break
        text = text.encode("utf-8").decode("unicode_escape")
    except UnicodeDecodeError as exc:  # a stray backslash: torch's caller raises this too
        return exc
    message = f"{getattr(exc_type, '__name__', 'Exception')}: {text}"
    try:
        return exc_type(message)
    except BaseException as exc:  # torch's internal._handle_exception fallback
        return RuntimeError(f"Failed to create original exception type. Error msg was {exc} "
                            f"Original exception on remote side was {message}")


class Failure(Exception):
    """A UDF failure carried through a Future as (type, text), formatted once."""

    def __init__(self, failure):
        super().__init__(failure[1])
        self.failure = failure


class UdfRaised:
    """A Python function's exception as the request's value (torch's RemoteException): (type, text)."""

    __slots__ = ("failure",)

    def __init__(self, failure):
        self.failure = failure


def failure_of(info, exc: BaseException):
    """The (type, text) pair of a failed Future's exception."""
    if isinstance(exc, Failure):
        return exc.failure
    try:
        raise exc
    except BaseException as caught:
        return remote_exception(info, caught)
