"""Kubernetes resource quantities (`20Gi`, `500m`, `1e3`) as exact numbers.

Only what the rules need: GPU counts (integers) and memory asks (converted to MiB).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["QuantityError", "parse_quantity", "quantity_to_int", "quantity_to_mib"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")
_MIB = 2**20


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message quotes it."""


def parse_quantity(value: str | int | float) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (examples: 2, 20Gi, 512Mi)")
    number, exponent, suffix = match.groups()
    amount = Fraction(number)
    if exponent:
        return amount * Fraction(10) ** int(exponent[1:])
    return amount * (_BINARY.get(suffix) or _DECIMAL[suffix or ""])


def quantity_to_int(value: str | int | float) -> int:
    """A count, as Kubernetes rounds extended resources: up to the next whole unit."""
    amount = parse_quantity(value)
    return -(-amount.numerator // amount.denominator)


def quantity_to_mib(value: str | int | float) -> int:
    """Bytes as a quantity (`20Gi`, `21474836480`) to whole MiB, rounded up."""
    amount = parse_quantity(value) / _MIB
    if amount <= 0:
        raise QuantityError(f"{value!r} is not a positive amount of memory")
    return -(-amount.numerator // amount.denominator)
