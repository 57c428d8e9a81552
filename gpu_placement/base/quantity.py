"""Kubernetes resource quantities (`20Gi`, `500m`, `1e3`) as exact numbers.

Only what the rules need: GPU counts (integers) and memory asks (converted to MiB). Two ways in:
`parse_quantity` and the `quantity_to_*` helpers for what the cluster stores (they refuse what
Kubernetes refuses, non-ASCII digits and huge exponents, and only say "not a quantity"); `to_count`
and `to_mib` for untrusted text at admission, whose `QuantityProblem` names what is wrong (a
full-width `４`, an RTL mark) so the user can fix the manifest.
"""

from __future__ import annotations

import re
from fractions import Fraction

from gpu_placement.base.text import first_non_ascii, quoted, shown

__all__ = ["QuantityError", "QuantityProblem", "check_quantity", "cpu_to_milli", "parse_quantity", "quantity_to_int",
           "quantity_to_mib", "to_count", "to_mib"]

_BINARY: dict[str, int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
# ASCII digits only (Kubernetes rejects "４"), a bounded length and exponent: the text is untrusted and
# `Fraction(10) ** 999999999` would stall whoever parses it.
_QUANTITY = re.compile(r"^([+-]?(?:\d{1,30}\.?\d{0,30}|\.\d{1,30}))"
                       r"(?:([eE][+-]?\d{1,2})|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$", re.ASCII)
_MIB = 2**20


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message quotes it (cut, see gpu_placement.base.text)."""


def parse_quantity(value: str | int | float) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"{shown(value)} is not a quantity")
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise QuantityError(f"{shown(value)} is not a Kubernetes quantity (examples: 2, 20Gi, 512Mi)")
    number, exponent, suffix = match.groups()
    amount = Fraction(number)
    if exponent:
        return amount * Fraction(10) ** int(exponent[1:])
    return amount * (_BINARY.get(suffix) or _DECIMAL[suffix or ""])


def quantity_to_int(value: str | int | float) -> int:
    """A count, as Kubernetes rounds extended resources: up to the next whole unit."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 30:
        return int(value)  # the common case ("1", "8"), without the exact-fraction parser
    amount = parse_quantity(value)
    return -(-amount.numerator // amount.denominator)


def quantity_to_mib(value: str | int | float) -> int:
    """Bytes as a quantity (`20Gi`, `21474836480`) to whole MiB, rounded up."""
    amount = parse_quantity(value) / _MIB
    if amount <= 0:
        raise QuantityError(f"{shown(value)} is not a positive amount of memory")
    if amount < 1:  # "16384" is bytes to Kubernetes, but almost always meant MiB
        raise QuantityError(f"{shown(value)} is less than 1Mi (a plain number counts bytes, not MiB)")
    return -(-amount.numerator // amount.denominator)


# -- untrusted text, as admission needs it -----------------------------------------------------------------

# resource.Quantity's grammar (k8s.io/apimachinery/pkg/api/resource): number, then a binary or
# decimal suffix or an exponent. The sizes are ours: far beyond any GPU count or memory size.
_GRAMMAR = re.compile(r"[+-]?(?:[0-9]{1,24}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})"
                      r"(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?", re.ASCII)


class QuantityProblem(ValueError):
    """The message is a phrase that fits after `value: `."""


def check_quantity(value: object) -> str | int | float:
    """`value`, when it is a quantity as written; else QuantityProblem says why."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityProblem(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        if not -(10**24) < value < 10**24:
            raise QuantityProblem(f"{value!r} is out of range")
        return value
    odd = first_non_ascii(value)
    if odd:
        raise QuantityProblem(f"{quoted(value)} is not a quantity: it contains {odd}; use ASCII digits")
    if not _GRAMMAR.fullmatch(value):
        raise QuantityProblem(f"{quoted(value)} is not a quantity")
    return value


def to_count(value: object) -> int:
    """A whole, non-negative number of devices."""
    if type(value) is str and len(value) <= 24 and value.isascii() and value.isdigit():
        return int(value)  # what nearly every pod writes ("1", "8"): no need for the full parser
    try:
        amount = parse_quantity(check_quantity(value))
    except QuantityError as exc:
        raise QuantityProblem(str(exc)) from None
    if amount < 0:
        raise QuantityProblem(f"{_show(value)} is negative")
    if amount.denominator != 1:
        raise QuantityProblem(f"{_show(value)} is not a whole number of devices")
    return int(amount)


def to_mib(value: object) -> int:
    try:
        return quantity_to_mib(check_quantity(value))
    except QuantityError as exc:
        raise QuantityProblem(str(exc)) from None


def _show(value: object) -> str:
    return quoted(value) if isinstance(value, str) else repr(value)


def cpu_to_milli(value: str | int | float) -> int:
    """A CPU quantity in milli-CPU, rounded up ("500m", "4", "0.5")."""
    if isinstance(value, str):
        if value.endswith("m") and value[:-1].isdigit():
            return int(value[:-1])
        if value.isdigit():
            return int(value) * 1000
    amount = parse_quantity(value) * 1000
    return -(-amount.numerator // amount.denominator)
