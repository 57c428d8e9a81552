"""The nodes changed since a writer last judged them: what lets a leader's pass cost what changed.

A writer that keeps one field of each Node (gpu_placement/controllers/node_writer.py) used to judge every
node on every wake, under the view's lock; at 5,000 nodes that ran on every node event, beside admission.
Now each writer holds one `ChangedNodes`, marked by the listeners it subscribes (the view's for a Node or
its validator, the rollout's and the fences' for a node they re-read, by an event or by the clock), and
a pass judges the names it takes from it. `everything` (a mark of None: the view's "all nodes changed")
makes the next pass judge every node, as the writer's own resyncs do (start, new leadership, a relist,
a failed pass, and a slow period).

Not locked itself: marked and taken under the view's lock, where every listener of the view, the rollout
and the fences is called.
"""

from __future__ import annotations

__all__ = ["ChangedNodes"]


class ChangedNodes:
    """Names marked since the last `take()`; everything until the first."""

    __slots__ = ("_everything", "_names")

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._everything = True

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return self._everything or name in self._names

    def mark(self, name: str | None) -> None:
        """The node `name` changed (None: every node may have)."""
        if name is None:
            self._everything = True
            self._names.clear()
        elif not self._everything:
            self._names.add(name)

    def take(self) -> set[str] | None:
        """The names marked since the last take (None: every node), and start again from none."""
        if self._everything:
            self._everything = False
            return None
        names, self._names = self._names, set()
        return names
