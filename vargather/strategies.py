"""Hypothesis strategies for ragged all_gather cases: the old import path.

The strategies live in ``vargather.testing.strategies`` (the testing kit, which needs
``pip install 'vargather[test]'``); ``from vargather import strategies`` keeps working.
"""

from __future__ import annotations

from vargather.testing.strategies import DTYPE_NAMES as DTYPE_NAMES
from vargather.testing.strategies import GatherCase as GatherCase
from vargather.testing.strategies import case_batches as case_batches
from vargather.testing.strategies import dtypes as dtypes
from vargather.testing.strategies import gather_cases as gather_cases
from vargather.testing.strategies import ragged_sizes as ragged_sizes
from vargather.testing.strategies import upstream_grads as upstream_grads

__all__ = [
    "DTYPE_NAMES",
    "GatherCase",
    "case_batches",
    "dtypes",
    "gather_cases",
    "ragged_sizes",
    "upstream_grads",
]
