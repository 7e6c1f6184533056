"""The control: the unbroken pipeline of ``_base``. It must pass every property."""

from __future__ import annotations

from ._base import gather as all_gather_v

__all__ = ["all_gather_v"]
