"""Equality-based label selectors (`app=nvidia-operator-validator,tier!=x,present,!absent`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LabelSelector", "SelectorError"]


class SelectorError(ValueError):
    pass


@dataclass(slots=True, frozen=True)
class LabelSelector:
    text: str
    equal: tuple[tuple[str, str], ...]
    not_equal: tuple[tuple[str, str], ...]
    present: tuple[str, ...]
    absent: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        equal: list[tuple[str, str]] = []
        not_equal: list[tuple[str, str]] = []
        present: list[str] = []
        absent: list[str] = []
        for term in (part.strip() for part in text.split(",")):
            if not term:
                continue
            if "!=" in term:
                key, value = term.split("!=", 1)
                not_equal.append((_key(key, text), value.strip()))
            elif "=" in term:
                key, value = term.replace("==", "=", 1).split("=", 1)
                equal.append((_key(key, text), value.strip()))
            elif term.startswith("!"):
                absent.append(_key(term[1:], text))
            else:
                present.append(_key(term, text))
        if not (equal or not_equal or present or absent):
            raise SelectorError(f"label selector {text!r} is empty")
        return cls(text, tuple(equal), tuple(not_equal), tuple(present), tuple(absent))

    def matches(self, labels: Mapping[str, str]) -> bool:
        get = labels.get
        return (all(get(k) == v for k, v in self.equal)
                and all(get(k) != v for k, v in self.not_equal)
                and all(k in labels for k in self.present)
                and not any(k in labels for k in self.absent))


def _key(key: str, text: str) -> str:
    key = key.strip()
    if not key or " " in key or "(" in key:
        raise SelectorError(f"label selector {text!r}: {key!r} is not a label key (use key=value terms)")
    return key
