"""Names due at a time, soonest first: what the clock alone ends (a driver's soak, a fence's probe backoff)."""

from __future__ import annotations

import heapq

__all__ = ["Deadlines"]


class Deadlines:
    """A heap of (when, name). A name may stand more than once; the caller re-evaluates it when due."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []

    def __bool__(self) -> bool:
        return bool(self._heap)

    def add(self, when: float, name: str) -> None:
        heapq.heappush(self._heap, (when, name))

    def any_due(self, now: float) -> bool:
        """One comparison: callers ask on every request."""
        return bool(self._heap) and self._heap[0][0] <= now

    def pop_due(self, now: float) -> set[str]:
        due = set()
        while self._heap and self._heap[0][0] <= now:
            due.add(heapq.heappop(self._heap)[1])
        return due
