"""The fork zoo: ragged all_gathers written from scratch in the shapes real forks take.

Each module is one implementation; ``ZOO`` gives its reference, its declared scope (the
options a fork would put in its ``[tool.vargather.check]`` table) and the verdict the
gate must give: every property passes (rows outside the scope ``n/a``, dtypes the
backend refuses ``unsupported``), or the named properties fail with the named kind
and aspect. ``tests/test_gate_forks.py`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ZOO", "Fork"]


@dataclass(frozen=True)
class Fork:
    name: str
    ref: str
    scope: dict[str, Any]
    """``CheckOptions`` keyword arguments: the declared scope, and the ``call``
    template of the member's own signature (no adapter)."""
    fails: dict[str, tuple[str, str]] = field(default_factory=dict)
    """property id -> (failure kind, aspect) for the rows that must fail; every other
    row passes, is n/a or unsupported, except the ``also`` rows."""
    also: tuple[str, ...] = ()
    """Rows whose cases may hit the same bug (they draw it too), failing with the same
    kind and aspect, or passing when their examples happen not to."""
    bug: str = ""
    examples: int = 4
    """Examples per property in the suite's fast run (enough to find the bug)."""
    fast_rows: tuple[str, ...] = ()
    """The rows of the suite's fast run (empty: the suite's usual selection)."""


ZOO: tuple[Fork, ...] = (
    Fork(
        "world_assert",
        "tests.forks.world_assert:all_gather",
        {"grad": "local", "world_sizes": (2, 3, 4), "requires_init": True, "sizes": "tensor"},
    ),
    Fork("sizes_one_rank", "tests.forks.sizes_one_rank:all_gather", {"grad": "local"}),
    # all_gather(x, dim): the call (x, dim) is inferred from the parameter names.
    Fork("plain_all_gather", "tests.forks.plain_all_gather:all_gather", {"grad": "none"}),
    Fork(
        "plain_dim0",
        "tests.forks.plain_all_gather:dim0_gather",
        {"grad": "none", "dims": (0,)},
    ),
    Fork("dim0_only", "tests.forks.dim0_only:gather_rows", {"grad": "none", "call": "(x)"}),
    Fork(
        "list_return",
        "tests.forks.list_return:gather_all_tensors",
        {"grad": "local", "call": "(x, group=group)", "returns": "list"},
    ),
    Fork(
        "sizes_required",
        "tests.forks.sizes_required:gather_known",
        {"grad": "none", "sizes": "required", "returns": "tensor"},
    ),
    Fork(
        "allreduce_switch",
        "tests.forks.allreduce_switch:AllGather(all_reduce_grads=True)",
        {"grad": "sum"},
    ),
    Fork("broadcast_based", "tests.forks.broadcast_based:all_gather", {"grad": "local"}),
    # vector-quantize-pytorch's shape: async broadcasts, rank 0 waits for them, the
    # others go to a barrier; int16's refusal races the peers' waiting (issue 34).
    Fork(
        "vq_broadcast", "tests.forks.vq_broadcast:all_gather", {"grad": "none", "call": "(x, dim)"}
    ),
    Fork(
        "pickle_based",
        "tests.forks.pickle_based:gather_objects",
        {"grad": "none", "call": "(x, dim)"},
    ),
    Fork(
        "nccl_uneven",
        "tests.forks.nccl_uneven:gather_uneven",
        {"grad": "none", "emulate": "nccl", "call": "(x, dim)"},
    ),
    Fork(
        "function_apply",
        "tests.forks.function_apply:AllGather.apply",
        {"grad": "local", "call": "(x)"},
    ),
    Fork(
        "with_shapes",
        "tests.forks.with_shapes:all_gather_tensors_with_shapes",
        {"grad": "none", "call": "(x, shapes, group=group)", "returns": "list"},
    ),
    Fork(
        "sizes_flag",
        "tests.forks.sizes_flag:all_gather_v",
        {
            "grad": "sum",
            "call": "(x, sizes, dim, True, group)",
            "sizes": "required",
            "emulate": "nccl",
        },
    ),
    Fork(
        "nccl_hang",
        "tests.forks.nccl_hang:all_gather_v",
        {
            "grad": "sum",
            "call": "(x, sizes, dim, True, group)",
            "sizes": "required",
            "emulate": "nccl",
        },
        fails={"non-contiguous": ("error", "call")},
        also=("gradient", "adjoint", "one-rank", "subgroup", "uninitialized", "call-sequence"),
        examples=20,
        bug=(
            "a strided shard reaches NCCL's all_gather (emulated): refused on its rank "
            "while the peers wait in the collective until the group's timeout"
        ),
    ),
    Fork(
        "strided_bug",
        "tests.forks.strided_bug:gather_fast",
        {"grad": "none", "emulate": "nccl", "call": "(x, dim)"},
        fails={"non-contiguous": ("error", "call")},
        also=("one-rank", "subgroup", "uninitialized", "call-sequence"),
        examples=20,
        bug="an equal-size fast path hands a strided view to all_gather (NCCL refuses it)",
    ),
    Fork(
        "negative_dim_crash",
        "tests.forks.negative_dim_crash:gather",
        {"grad": "none"},
        fails={"dims": ("crash", "call")},
        fast_rows=("dims",),
        also=(
            "forward-float",
            "forward-half",
            "forward-complex",
            "forward-int",
            "forward-int:int16",
            "forward-bool",
            "empty-some",
            "empty-all",
            "non-contiguous",
            "sizes-list",
            "sizes-tensor",
            "returned-sizes",
            "subgroup",
            "call-sequence",
        ),
        bug="a negative dim aborts a rank",
    ),
)
