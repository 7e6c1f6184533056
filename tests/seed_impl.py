"""The old import path of the seed re-implementation, kept for ``.github/workflows``.

The one re-implementation of the seed ``distributed.py`` is ``vargather.testing.reference_seed``
(the benchmark and the conformance tests use it); this module only re-exports it, so
``python -m vargather check --impl tests.seed_impl:all_gather`` keeps working.
"""

from __future__ import annotations

from vargather.testing.reference_seed import AllGather as AllGather
from vargather.testing.reference_seed import all_gather as all_gather
from vargather.testing.reference_seed import all_gather_variable_dim as all_gather_variable_dim
from vargather.testing.reference_seed import exists as exists
from vargather.testing.reference_seed import pad_dim_to as pad_dim_to

__all__ = ["AllGather", "all_gather", "all_gather_variable_dim", "exists", "pad_dim_to"]
