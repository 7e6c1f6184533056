"""The gate's built-in targets: torch's own ragged paths and Megatron-core's, by name.

Where it sits: in the gate's engine in the testing kit, beneath ``engine`` (which
turns ``--target NAME`` into the options it stands for with ``apply_target`` before
anything else runs) and above the targets that run programs of their own
(``dtensor_target``, ``ulysses_target``, ``ep_dispatch_target``). docs/targets.md gives
each target's declared scope and the reason for it.

This module imports only the standard library at import time: ``--target list``
asks whether each target's modules are installed without importing them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .options import CheckOptions
    from .program_rows import ProgramTarget
    from .results import Report

LIST: Final = "list"
"""``--target list``: print the targets and exit."""


@dataclass(frozen=True)
class Target:
    """One built-in target. ``op``: the collective (``--op``); ``impl``/``call``: what
    is called and how, or ``program``: the module in ``vargather.testing`` of a target
    that runs programs of its own, whose ``TARGET`` is a ``program_rows.ProgramTarget``;
    ``scope``: the ``CheckOptions`` fields it declares; ``requires``: (module, what to
    install when it is missing); ``preload``: modules the rank processes import before
    their first call (``pool.preload``; ``_DYNAMO`` says why); ``refuses``: dtypes the
    backend refuses on this code path though ``torch.distributed``'s own functions carry
    them (they convert): each runs as its own ``PROPERTY:DTYPE`` row."""

    name: str
    title: str
    op: str
    impl: str | None = None
    call: str | None = None
    scope: Mapping[str, Any] = field(default_factory=dict)
    requires: tuple[tuple[str, str], ...] = ()
    preload: tuple[str, ...] = ()
    refuses: tuple[str, ...] = ()
    program: str | None = None


_MEGATRON: Final = (
    (
        "megatron.core",
        "megatron-core is not installed (pip install -c constraints.txt 'vargather[megatron]')",
    ),
)
_DYNAMO: Final = ("torch._dynamo",)
"""What torch's functional collectives, DTensor and the deprecated nn collectives
import on first use (about 10 s of CPU per process, measured on the 2-core machine).
Megatron-core's mappings are preloaded too (importing megatron.core took over 30 s per
rank on the loaded 2-core machine; docs/targets.md says what its aliases bound then
keep)."""
_MAPPINGS: Final = "megatron.core.tensor_parallel.mappings"
_DEEPSPEED_MISSING: Final = (
    "deepspeed is not installed (DS_BUILD_OPS=0 pip install -c constraints.txt "
    "--no-build-isolation 'vargather[deepspeed]')"
)
_TORCHTITAN_MISSING: Final = (
    "torchtitan is not installed (pip install -c constraints.txt 'vargather[torchtitan]', "
    "then pip install -c constraints.txt --no-deps 'torchtitan>=0.3,<0.4')"
)

TARGETS: Final[tuple[Target, ...]] = (
    Target(
        "dtensor",
        "DTensor programs as trainers run them: 1-D, 2-D and 3-D meshes with named dims, "
        "flattened views and submeshes alive; distribute_tensor or from_local, then up to "
        "4 redistribute steps; every local, full_tensor and gradient against the oracle",
        "all_gather_v",
        scope={"grad": "local", "world_sizes": (1, 2, 3, 4)},
        requires=(("torch.distributed.tensor", "torch.distributed.tensor is not available"),),
        preload=(*_DYNAMO, "torch.distributed.tensor"),
        program="dtensor_target",
    ),
    Target(
        "funcol-all-to-all",
        "torch.distributed._functional_collectives.all_to_all_single_autograd",
        "all_to_all_v",
        "torch.distributed._functional_collectives:all_to_all_single_autograd",
        "(x, recv_sizes, send_sizes, group)",
        {"sizes": "required", "grad": "sum", "requires_init": True},
        preload=_DYNAMO,
        refuses=("complex64",),  # docs/repro/funcol_all_to_all_complex_gloo.py
    ),
    Target(
        "nn-all-to-all",
        "torch.distributed.nn.functional.all_to_all_single (a preallocated output)",
        "all_to_all_v",
        "torch.distributed.nn.functional:all_to_all_single",
        "(out, x, recv_sizes, send_sizes, group)",
        {"sizes": "required", "grad": "sum", "requires_init": True, "contiguous_only": True},
        preload=_DYNAMO,
    ),
    Target(
        "nn-all-gather",
        "torch.distributed.nn.functional.all_gather, the list form (equal shapes only)",
        "all_gather_v",
        "torch.distributed.nn.functional:all_gather",
        "(x, group)",
        {
            "grad": "sum",
            "returns": "list",
            "sizes": "never",
            "requires_init": True,
            "equal_shapes": True,
        },
        preload=_DYNAMO,
    ),
    Target(
        "megatron-all-to-all",
        "Megatron-core tensor_parallel.mappings.all_to_all",
        "all_to_all_v",
        f"{_MAPPINGS}:all_to_all",
        "(group, x, recv_sizes, send_sizes)",
        {"sizes": "required", "grad": "sum", "emulate": "nccl", "requires_init": True},
        _MEGATRON,
        (*_DYNAMO, _MAPPINGS),
    ),
    Target(
        "megatron-sp-gather",
        "Megatron-core tensor_parallel.mappings.gather_from_sequence_parallel_region",
        "all_gather_v",
        f"{_MAPPINGS}:gather_from_sequence_parallel_region",
        "(x, True, group, sizes)",
        {
            "sizes": "list",
            "grad": "sum",
            "emulate": "nccl",
            "returns": "tensor",
            "requires_init": True,
        },
        _MEGATRON,
        (*_DYNAMO, _MAPPINGS),
    ),
    Target(
        "megatron-sp-reduce-scatter",
        "Megatron-core tensor_parallel.mappings.reduce_scatter_to_sequence_parallel_region",
        "reduce_scatter_v",
        f"{_MAPPINGS}:reduce_scatter_to_sequence_parallel_region",
        "(x, group, sizes)",
        {"grad": "sum", "emulate": "nccl", "nan_payloads": "backend", "requires_init": True},
        _MEGATRON,
        (*_DYNAMO, _MAPPINGS),
    ),
    Target(
        "deepspeed-ulysses",
        "DeepSpeed Ulysses (deepspeed.sequence.layer): single_all_to_all, "
        "_SeqAllToAll.apply and DistributedAttention, sequence <-> heads shards",
        "all_to_all_v",
        scope={"grad": "sum"},
        requires=(("deepspeed", _DEEPSPEED_MISSING),),
        preload=("deepspeed", "deepspeed.sequence.layer"),
        program="ulysses_target",
    ),
    Target(
        "torchtitan-ep-dispatch",
        "torchtitan's expert-parallel token dispatch and combine "
        "(AllToAllTokenDispatcher.dispatch / .combine)",
        "all_to_all_v",
        scope={"grad": "sum"},
        requires=(("torchtitan", _TORCHTITAN_MISSING),),
        preload=("torchtitan.models.common.token_dispatcher",),
        program="ep_dispatch_target",
    ),
)
"""Every built-in target, in the order ``--target list`` prints them."""

_BY_NAME: Final = {t.name: t for t in TARGETS}


def by_name(name: str) -> Target:
    """The target called ``name`` (``KeyError`` otherwise)."""
    return _BY_NAME[name]


def unavailable(target: Target) -> str | None:
    """Why ``target`` cannot run here (a module it needs is not installed), or
    ``None``. Asks the import system; imports nothing."""
    for module, missing in target.requires:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return missing
    return None


def listing() -> str:
    """``--target list``: every target, whether it runs here, what it calls and how."""
    lines = []
    for t in TARGETS:
        reason = unavailable(t)
        state = "available" if reason is None else f"unavailable: {reason}"
        lines.append(f"{t.name}: {state}")
        lines.append(f"  {t.title}")
        what = t.impl or f"built-in rows (vargather.testing.{t.program})"
        lines.append(f"  --op {t.op}, {what}" + (f", --call '{t.call}'" if t.call else ""))
        scope = " ".join(f"--{k.replace('_', '-')} {_text(v)}" for k, v in t.scope.items())
        if scope:
            lines.append(f"  scope: {scope}")
        if t.refuses:
            lines.append(f"  the backend refuses on this path: {', '.join(t.refuses)}")
    return "\n".join(lines) + "\n"


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def apply_target(options: CheckOptions) -> CheckOptions:
    """``options`` with the target they name filled in (unchanged without one).

    ``OptionError`` (``target``) for an unknown or unavailable target, or for an
    option the user set that contradicts what the target declares; (``only``,
    ``xfails``) for a row id the target lacks. Applying twice gives the same options
    (the isolated child gets them applied already)."""
    from .options import CheckOptions, OptionError

    name = options.target
    if name is None:
        return options
    if name == LIST:
        raise OptionError("target", "list: prints the targets; it runs nothing")
    target = _BY_NAME.get(name)
    if target is None:
        known = ", ".join(t.name for t in TARGETS)
        raise OptionError("target", f": unknown target {name!r}; known: {known}, or list")
    reason = unavailable(target)
    if reason is not None:
        raise OptionError("target", f"{name} is unavailable here: {reason}")
    defaults = CheckOptions()
    wanted: dict[str, Any] = {"op": target.op, "impl": target.impl, "call": target.call}
    wanted.update(target.scope)
    for key, value in wanted.items():
        given = getattr(options, key)
        if given == value or given == getattr(defaults, key):
            continue
        if key == "world_sizes" and set(given) <= set(value):
            wanted[key] = given  # fewer world sizes than the target's: the user's budget
            continue
        spelled = "--" + key.replace("_", "-")
        raise OptionError(
            "target",
            f"{name} declares {spelled} {_text(value) if value is not None else '(none)'}; "
            f"got {spelled} {_text(given)} (a target's implementation and scope are its own)",
        )
    rows = target_ids(target)
    for option, ids in (("only", options.only), ("xfails", tuple(options.xfails))):
        unknown = sorted({i for i in ids if i.partition(":")[0] not in rows})
        if unknown:
            raise OptionError(
                option,
                f": unknown property id(s) {', '.join(unknown)} of --target {name}; known: "
                + ", ".join(rows),
            )
    return replace(options, **wanted)


def target_ids(target: Target) -> tuple[str, ...]:
    """The row ids of ``target`` (what ``--only`` and an xfails file name)."""
    program = _program(target.name)
    if program is not None:
        return tuple(row.id for row in program.rows)
    from .catalogues import property_ids

    return property_ids(target.op)


def _program(name: str | None) -> ProgramTarget | None:
    """The ``ProgramTarget`` of the target called ``name`` when it runs programs of its
    own (``Target.program``), else ``None``."""
    target = _BY_NAME.get(name or "")
    if target is None or target.program is None:
        return None
    import importlib

    found: ProgramTarget = importlib.import_module(f"{__package__}.{target.program}").TARGET
    return found


def program_runner(name: str | None) -> Callable[..., Report] | None:
    """``run(options, progress, factory, versions) -> Report`` of the target called
    ``name`` when it runs programs of its own, else ``None``."""
    program = _program(name)
    if program is None:
        return None
    from .program_rows import run_program_check

    return partial(run_program_check, program)


def program_rows(name: str | None) -> list[tuple[str, str]] | None:
    """The (id, title) of each row of the target called ``name`` when it runs programs
    of its own (the pytest plugin's items), else ``None``."""
    program = _program(name)
    return None if program is None else [(row.id, row.title) for row in program.rows]


def preload_target(options: CheckOptions) -> None:
    """Have the rank processes the run starts import what ``options``' target imports
    on first use (``Target.preload``)."""
    target = _BY_NAME.get(options.target or "")
    if target is not None and unavailable(target) is None:
        from .world import preload

        preload(target.preload)


def target_refusals(options: CheckOptions) -> tuple[str, ...]:
    """The dtypes ``options``' target declares the backend refuses on its code path
    (``Target.refuses``); none without a target."""
    target = _BY_NAME.get(options.target or "")
    return () if target is None else target.refuses
