"""K policies (controllers) for speculative decoding."""

from spectune.control.base import FixedK, KPolicy

__all__ = ["FixedK", "KPolicy"]
