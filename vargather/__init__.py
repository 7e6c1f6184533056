"""vargather: a property-tested reference all_gather for ragged PyTorch tensors.

``all_gather_v(x, dim)`` returns ``cat_r x_r`` on every rank when the size of ``x``
along ``dim`` differs from rank to rank, with an explicit gradient contract
(``grad="sum"|"local"|"mean"``) and the same clear error on every rank for bad input.

The pipeline, one private module per stage (``docs/architecture.md`` has the map):
``_args`` (local argument checks -> a record) -> ``_wire`` (record <-> int64 vector)
-> ``_exchange`` (exchange + cross-rank validation) -> ``_layout`` (``Layout``) ->
``_transport`` (with ``_buffers``) -> ``_autograd``; every collective goes through
``_comm``, and ``_dtypes``, ``_choices`` and ``_collectives`` hold the vocabularies
(``COLLECTIVES``: every collective's name, wire code, checks, oracle and catalogue).
``vargather.oracle`` defines the right answer; ``vargather.compat`` replaces the seed
``distributed.py`` that many repos copy.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import _errors
from ._api import all_gather_v as all_gather_v
from ._api import all_gather_v_coalesced as all_gather_v_coalesced
from ._api import all_gather_v_with_layout as all_gather_v_with_layout
from ._api import gather_layout as gather_layout
from ._choices import CONTRACTS as CONTRACTS
from ._choices import TRANSPORT_NAMES as TRANSPORT_NAMES
from ._choices import GradContract as GradContract
from ._choices import TransportName as TransportName
from ._collectives import COLLECTIVE_NAMES as COLLECTIVE_NAMES
from ._collectives import COLLECTIVES as COLLECTIVES
from ._collectives import Collective as Collective
from ._collectives import CollectiveName as CollectiveName
from ._dtypes import GLOO_DTYPES as GLOO_DTYPES
from ._dtypes import NATIVE_DTYPES as GLOO_NATIVE_DTYPES
from ._errors import ArgumentError as ArgumentError
from ._errors import ArgumentMismatchError as ArgumentMismatchError
from ._errors import CollectiveError as CollectiveError
from ._errors import CollectiveTimeoutError as CollectiveTimeoutError
from ._errors import DimError as DimError
from ._errors import DTypeMismatchError as DTypeMismatchError
from ._errors import GroupError as GroupError
from ._errors import InputShapeError as InputShapeError
from ._errors import InputTypeError as InputTypeError
from ._errors import MismatchError as MismatchError
from ._errors import PeerLostError as PeerLostError
from ._errors import ProtocolMismatchError as ProtocolMismatchError
from ._errors import RequiresGradMismatchError as RequiresGradMismatchError
from ._errors import ShapeMismatchError as ShapeMismatchError
from ._errors import SizesError as SizesError
from ._errors import SizesMismatchError as SizesMismatchError
from ._errors import SizesTypeError as SizesTypeError
from ._errors import VarGatherError as VarGatherError
from ._gather import GatherResult as GatherResult
from ._layout import Layout as Layout

try:
    __version__ = version("vargather")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "COLLECTIVES",
    "COLLECTIVE_NAMES",
    "CONTRACTS",
    "GLOO_DTYPES",
    "GLOO_NATIVE_DTYPES",
    "TRANSPORT_NAMES",
    "Collective",
    "CollectiveName",
    "GatherResult",
    "GradContract",
    "Layout",
    "TransportName",
    "__version__",
    "all_gather_v",
    "all_gather_v_coalesced",
    "all_gather_v_with_layout",
    "gather_layout",
]
__all__ += _errors.__all__

# The ragged collective family (docs/family.md).
from ._all_to_all import AllToAllResult as AllToAllResult  # noqa: E402
from ._api import all_gather_list as all_gather_list  # noqa: E402
from ._api import all_to_all_v as all_to_all_v  # noqa: E402
from ._api import all_to_all_v_with_layout as all_to_all_v_with_layout  # noqa: E402
from ._api import reduce_scatter_v as reduce_scatter_v  # noqa: E402

__all__ += [
    "AllToAllResult",
    "all_gather_list",
    "all_to_all_v",
    "all_to_all_v_with_layout",
    "reduce_scatter_v",
]

# Ulysses sequence parallelism on all_to_all_v(..., cat_dim=) (docs/sequence-parallel.md).
from ._sequence_parallel import SequenceLayout as SequenceLayout  # noqa: E402
from ._sequence_parallel import head_split as head_split  # noqa: E402
from ._sequence_parallel import heads_to_seq as heads_to_seq  # noqa: E402
from ._sequence_parallel import kv_repeats as kv_repeats  # noqa: E402
from ._sequence_parallel import seq_to_heads as seq_to_heads  # noqa: E402

__all__ += ["SequenceLayout", "head_split", "heads_to_seq", "kv_repeats", "seq_to_heads"]

# The rooted ragged gather and scatter (docs/family.md).
from ._rooted import gather_v as gather_v  # noqa: E402
from ._rooted import scatter_v as scatter_v  # noqa: E402

__all__ += ["gather_v", "scatter_v"]
