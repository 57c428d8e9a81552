"""The error that means bad usage or bad input, whichever layer finds it: `gpu-placement` prints it as one
line and exits with status 2 (gpu_placement/app/cli.py)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad usage or bad input: printed as one line, exit status 2."""
