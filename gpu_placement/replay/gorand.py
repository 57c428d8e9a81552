"""Go's math/rand, draw for draw: what `rand.New(rand.NewSource(seed))` (or the global source after
`rand.Seed(seed)`, as the ATC'23 simulator calls it) returns, so a replay inflates and shuffles a trace
exactly as the paper's runs did.

The source is Go's additive lagged Fibonacci generator (src/math/rand/rng.go, `rngSource`: 607 words,
tap 273, seeded from a Lehmer sequence XORed with the precomputed `rngCooked` table); the methods
follow src/math/rand/rand.go (`Int63`, `Int`, `Int31n`, `Intn`, the Lemire `int31n` that `Shuffle`
uses, `Perm`). The table is Go's own, BSD-licensed, in gpu_placement/data/go-math-rand-cooked.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources

__all__ = ["GoRand"]

_LEN = 607
_TAP = 273
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


@cache
def _cooked() -> tuple[int, ...]:
    raw = json.loads(resources.files("gpu_placement").joinpath("data/go-math-rand-cooked.json").read_text())
    values = tuple(int(v) & _MASK64 for v in raw["values"])
    if len(values) != _LEN:
        raise ValueError(f"go-math-rand-cooked.json holds {len(values)} values, not {_LEN}")
    return values


def _seedrand(x: int) -> int:
    """x[n+1] = 48271 * x[n] mod (2**31 - 1), in Go's int32 arithmetic (Schrage's method)."""
    hi, lo = _go_div(x, 44488)
    x = 48271 * lo - 3399 * hi
    return x + _INT32_MAX if x < 0 else x


def _go_div(x: int, y: int) -> tuple[int, int]:
    """Go's truncating integer division and remainder."""
    q = abs(x) // y
    q = -q if x < 0 else q
    return q, x - q * y


class GoRand:
    """One Go `*rand.Rand` over an `rngSource`. Not thread-safe (neither is Go's)."""

    __slots__ = ("_feed", "_tap", "_vec")

    def __init__(self, seed: int) -> None:
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """rngSource.Seed: seed % (2**31-1), 0 becomes 89482311; 20 warm-up steps of the Lehmer sequence."""
        self._tap, self._feed = 0, _LEN - _TAP
        seed = _go_div(seed, _INT32_MAX)[1]
        if seed < 0:
            seed += _INT32_MAX
        if seed == 0:
            seed = 89482311
        x = seed
        cooked = _cooked()
        vec = [0] * _LEN
        for i in range(-20, _LEN):
            x = _seedrand(x)
            if i >= 0:
                u = (x << 40) & _MASK64
                x = _seedrand(x)
                u ^= (x << 20) & _MASK64
                x = _seedrand(x)
                u ^= x
                vec[i] = u ^ cooked[i]
        self._vec = vec

    def uint64(self) -> int:
        self._tap -= 1
        if self._tap < 0:
            self._tap += _LEN
        self._feed -= 1
        if self._feed < 0:
            self._feed += _LEN
        x = (self._vec[self._feed] + self._vec[self._tap]) & _MASK64
        self._vec[self._feed] = x
        return x

    def int63(self) -> int:
        return self.uint64() & _MASK63

    def int31(self) -> int:
        return self.int63() >> 32

    def uint32(self) -> int:
        return (self.int63() >> 31) & 0xFFFFFFFF

    def int63n(self, n: int) -> int:
        if n <= 0:
            raise ValueError("invalid argument to Int63n")
        if n & (n - 1) == 0:
            return self.int63() & (n - 1)
        top = (1 << 63) - 1 - (1 << 63) % n
        v = self.int63()
        while v > top:
            v = self.int63()
        return v % n

    def int31n(self, n: int) -> int:
        if n <= 0:
            raise ValueError("invalid argument to Int31n")
        if n & (n - 1) == 0:
            return self.int31() & (n - 1)
        top = (1 << 31) - 1 - (1 << 31) % n
        v = self.int31()
        while v > top:
            v = self.int31()
        return v % n

    def intn(self, n: int) -> int:
        if n <= 0:
            raise ValueError("invalid argument to Intn")
        return self.int31n(n) if n <= _INT32_MAX else self.int63n(n)

    def _int31n_lemire(self, n: int) -> int:
        """The unexported int31n that Shuffle uses (Lemire's multiply-shift), not Int31n."""
        v = self.uint32()
        prod = v * n
        low = prod & 0xFFFFFFFF
        if low < n:
            thresh = ((1 << 32) - n) % n
            while low < thresh:
                v = self.uint32()
                prod = v * n
                low = prod & 0xFFFFFFFF
        return prod >> 32

    def shuffle(self, n: int, swap: Callable[[int, int], None]) -> None:
        if n < 0:
            raise ValueError("invalid argument to Shuffle")
        i = n - 1
        while i > (1 << 31) - 2:
            swap(i, self.int63n(i + 1))
            i -= 1
        while i > 0:
            swap(i, self._int31n_lemire(i + 1))
            i -= 1

    def perm(self, n: int) -> list[int]:
        m = [0] * n
        for i in range(n):
            j = self.intn(i + 1)
            m[i] = m[j]
            m[j] = i
        return m

    # Last in the class: below it, `int` in an annotation would name this method, not the builtin.
    def int(self) -> int:
        """rand.Int on a 64-bit platform: one Int63."""
        return self.int63()
