"""The one way a test waits for something a thread, a server or a process does."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 20.0, what: str | None = None,
             interval: float = 0.01) -> T:
    """Poll `condition()` every `interval` seconds until it returns something truthy, and return that;
    fail the test after `timeout` seconds, naming what was awaited (`what`, else the condition's source).
    The default timeout is long for a CI machine under load: a poll ends as soon as the condition holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or _source(condition)}")
        time.sleep(interval)


def _source(condition: Callable[[], object]) -> str:
    """The condition as written (a lambda's line), else its name."""
    try:
        return inspect.getsource(condition).strip()
    except (OSError, TypeError):
        return getattr(condition, "__qualname__", repr(condition))
