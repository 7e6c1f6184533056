"""vargather's testing kit: rank pools, the case model, strategies, the judge, the properties.

Where it sits: the second layer of the package, on top of the gather library
(``vargather``), which never imports it. It needs the ``test`` extra
(``pip install 'vargather[test]'``: Hypothesis). Its modules, bottom up, are listed
in ``docs/architecture.md``.
"""

from __future__ import annotations

try:
    import hypothesis as _hypothesis  # noqa: F401  # only checking that it is installed
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "vargather.testing (the testing kit, its strategies and `python -m vargather "
        "check`) needs Hypothesis: pip install 'vargather[test]'"
    ) from _err

from .asserts import assert_bitwise_equal as assert_bitwise_equal
from .asserts import bitwise_difference as bitwise_difference
from .cases import COMPAT as COMPAT
from .cases import VARGATHER as VARGATHER
from .cases import GatherCase as GatherCase
from .cases import Implementation as Implementation
from .cases import parse_case as parse_case
from .catalogues import catalogue as catalogue
from .catalogues import property_ids as property_ids
from .family import FamilyCase as FamilyCase
from .family_catalogue import FamilyCatalogue as FamilyCatalogue
from .importer import ImplementationError as ImplementationError
from .judge import Failure as Failure
from .pool import RankPool as RankPool
from .pool import close_all_pools as close_all_pools
from .pool import get_pool as get_pool
from .pool_types import COLLECTIVE_TIMEOUT_ENV as COLLECTIVE_TIMEOUT_ENV
from .pool_types import PoolConfig as PoolConfig
from .pool_types import PoolFailure as PoolFailure
from .pool_types import PoolStartError as PoolStartError
from .pool_types import RankCrashed as RankCrashed
from .pool_types import RankError as RankError
from .pool_types import RankHung as RankHung
from .pool_types import RankOutcome as RankOutcome
from .pool_types import RemoteException as RemoteException
from .properties import Property as Property
from .rank_side import RankContext as RankContext
from .runner import Verdict as Verdict
from .runner import describe as describe
from .runner import run_cases as run_cases

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "COMPAT",
    "VARGATHER",
    "Failure",
    "FamilyCase",
    "FamilyCatalogue",
    "GatherCase",
    "Implementation",
    "ImplementationError",
    "PoolConfig",
    "PoolFailure",
    "PoolStartError",
    "Property",
    "RankContext",
    "RankCrashed",
    "RankError",
    "RankHung",
    "RankOutcome",
    "RankPool",
    "RemoteException",
    "Verdict",
    "assert_bitwise_equal",
    "bitwise_difference",
    "catalogue",
    "close_all_pools",
    "describe",
    "get_pool",
    "parse_case",
    "property_ids",
    "run_cases",
]
