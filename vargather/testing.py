"""Public test helpers: the persistent multi-rank pool that vargather's property suite,
conformance check and fuzzers run on. See :mod:`vargather._pool` for how it works.

``import vargather.testing`` then ``vargather.testing.get_pool(2).run(fn, payload)``,
where ``fn(ctx, payload)`` is a module-level function run on every rank.
"""

from ._pool import COLLECTIVE_TIMEOUT_ENV as COLLECTIVE_TIMEOUT_ENV
from ._pool import PoolConfig as PoolConfig
from ._pool import PoolFailure as PoolFailure
from ._pool import PoolStartError as PoolStartError
from ._pool import RankContext as RankContext
from ._pool import RankCrashed as RankCrashed
from ._pool import RankError as RankError
from ._pool import RankHung as RankHung
from ._pool import RankOutcome as RankOutcome
from ._pool import RankPool as RankPool
from ._pool import RemoteException as RemoteException
from ._pool import close_all_pools as close_all_pools
from ._pool import get_pool as get_pool

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "PoolConfig",
    "PoolFailure",
    "PoolStartError",
    "RankContext",
    "RankCrashed",
    "RankError",
    "RankHung",
    "RankOutcome",
    "RankPool",
    "RemoteException",
    "close_all_pools",
    "get_pool",
]
