"""Quantities from untrusted text, as admission needs them: counts that must be whole and not
negative, and messages that name what is wrong (a full-width `４`, an RTL mark) so the user can fix
the manifest. gpu_placement.quantity does the arithmetic; it refuses the same inputs (non-ASCII
digits, huge exponents) but only says "not a quantity"."""

from __future__ import annotations

import re

from gpu_placement.quantity import QuantityError, parse_quantity, quantity_to_mib
from webhook.text import first_non_ascii, quoted

__all__ = ["QuantityProblem", "check_quantity", "to_count", "to_mib"]

# resource.Quantity's grammar (k8s.io/apimachinery/pkg/api/resource): number, then a binary or
# decimal suffix or an exponent. The sizes are ours: far beyond any GPU count or memory size.
_GRAMMAR = re.compile(r"[+-]?(?:[0-9]{1,24}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})"
                      r"(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?", re.ASCII)


class QuantityProblem(ValueError):
    """The message is a phrase that fits after `value: `."""


def check_quantity(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityProblem(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        if not -(10**24) < value < 10**24:
            raise QuantityProblem(f"{value!r} is out of range")
        return
    odd = first_non_ascii(value)
    if odd:
        raise QuantityProblem(f"{quoted(value)} is not a quantity: it contains {odd}; use ASCII digits")
    if not _GRAMMAR.fullmatch(value):
        raise QuantityProblem(f"{quoted(value)} is not a quantity")


def to_count(value: object) -> int:
    """A whole, non-negative number of devices."""
    if type(value) is str and len(value) <= 24 and value.isascii() and value.isdigit():
        return int(value)  # what nearly every pod writes ("1", "8"): no need for the full parser
    check_quantity(value)
    try:
        amount = parse_quantity(value)  # type: ignore[arg-type]
    except QuantityError as exc:
        raise QuantityProblem(str(exc)) from None
    if amount < 0:
        raise QuantityProblem(f"{_show(value)} is negative")
    if amount.denominator != 1:
        raise QuantityProblem(f"{_show(value)} is not a whole number of devices")
    return int(amount)


def to_mib(value: object) -> int:
    check_quantity(value)
    try:
        return quantity_to_mib(value)  # type: ignore[arg-type]
    except QuantityError as exc:
        raise QuantityProblem(str(exc)) from None


def _show(value: object) -> str:
    return quoted(value) if isinstance(value, str) else repr(value)
