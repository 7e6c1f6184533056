"""The ``deepspeed-ulysses`` target: DeepSpeed's Ulysses sequence-parallel all-to-all.

Where it sits: in the gate's engine, above ``program_rows``, beneath ``targets``.
DeepSpeed is an optional extra (``vargather[deepspeed]``), imported inside functions
only and typed ``Any``. Programs build models with their own head counts in one
process, then call ``deepspeed.sequence.layer`` on them in order; the oracle is the
global tensor on one process. docs/targets.md describes the rows, the oracle and what
the target relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Final

import torch
from hypothesis import strategies as st

from .family import values
from .program_rows import (
    FLOAT_DTYPES,
    ProgramRow,
    ProgramTarget,
    StepsReport,
    all_worlds,
    differences,
    first_real_error,
    in_turn,
    multi_worlds,
    quiet_stdout,
    raised_message,
)
from .progress import Progress

KINDS: Final = ("seq-to-heads", "round-trip", "attention")


@dataclass(frozen=True)
class Model:
    """One attention layer as a model builds it: ``heads`` query heads, ``kv_heads``
    key/value heads (``heads`` for MHA, a divisor of it for GQA), ``head_dim``, and
    its layout: ``batch_first`` is ``batch_dim_idx=0`` (``[b, s, h, d]``), otherwise
    ``batch_dim_idx=1`` (``[s, b, h, d]``)."""

    heads: int
    kv_heads: int
    head_dim: int
    batch_first: bool

    @property
    def batch_dim_idx(self) -> int:
        return 0 if self.batch_first else 1

    @property
    def seq_dim(self) -> int:
        return 1 if self.batch_first else 0


@dataclass(frozen=True)
class Step:
    """One call on model ``model``: ``kind`` ``seq-to-heads`` (``single_all_to_all``,
    or ``_SeqAllToAll.apply`` with ``grad``) on its query (``tensor="q"``) or key/value
    (``"kv"``) tensor, ``round-trip`` (seq -> heads -> seq), or ``attention``
    (``DistributedAttention``, forward and with ``grad`` backward); ``seq`` positions
    per rank, ``batch`` sequences."""

    model: int
    kind: str
    tensor: str
    seq: int
    batch: int
    grad: bool
    seed: int


@dataclass(frozen=True)
class UlyssesProgram:
    """Models built in order, then steps run in order, in one process per rank."""

    world_size: int
    models: tuple[Model, ...]
    steps: tuple[Step, ...]
    dtype: str = "float32"
    refusal: bool = False
    """Every model has fewer key/value heads than ranks: every rank must refuse."""


def describe(program: UlyssesProgram) -> str:
    models = "; ".join(
        f"model {i}: {m.heads} q heads, {m.kv_heads} kv heads, d={m.head_dim}, "
        f"batch_dim_idx={m.batch_dim_idx}"
        for i, m in enumerate(program.models)
    )
    steps = "; ".join(
        f"{s.kind}({'model ' + str(s.model)}{', ' + s.tensor if s.kind != 'attention' else ''}, "
        f"s={s.seq}/rank, b={s.batch}{', backward' if s.grad else ''})"
        for s in program.steps
    )
    return f"{program.world_size} ranks, {program.dtype}: {models}; then {steps}"


# --- the oracle ------------------------------------------------------------------------


def head_split(heads: int, basis: int, world: int) -> list[int]:
    """Each rank's head count for a tensor of ``heads`` heads partitioned by ``basis``
    groups (DeepSpeed's ``get_shard_size``: the first ``basis % world`` ranks take one
    group more; each group ``heads // basis`` heads)."""
    if basis % world == 0:
        return [heads // world] * world
    per = heads // basis
    return [per * (basis // world + (1 if r < basis % world else 0)) for r in range(world)]


def _global(program: UlyssesProgram, index: int, tag: int) -> torch.Tensor:
    """Step ``index``'s global tensor ``tag``: 1 its input (an attention's query), 2 and
    3 an attention's key and value, 4 the upstream gradient of its result."""
    step = program.steps[index]
    model = program.models[step.model]
    heads = model.kv_heads if step.tensor == "kv" or tag in (2, 3) else model.heads
    s = step.seq * program.world_size
    shape = (step.batch, s, heads, model.head_dim)
    if not model.batch_first:
        shape = (s, step.batch, heads, model.head_dim)
    return values(shape, program.dtype, step.seed * 131 + tag, False)


def _seq_chunk(program: UlyssesProgram, index: int, t: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s sequence chunk of ``t``, a global tensor of step ``index``."""
    seq_dim = program.models[program.steps[index].model].seq_dim
    local = t.shape[seq_dim] // program.world_size
    return t.narrow(seq_dim, rank * local, local).contiguous()


def local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_dim: int
) -> torch.Tensor:
    """The attention each rank runs on its heads and the whole sequence, exact on small
    integers: ``q + flip(k') + 2 v'`` along the sequence, each key/value head repeated
    for its query heads. Raises ``ValueError`` when a rank's query heads are not a
    multiple of its key/value heads (a GQA group torn across ranks)."""
    if k.shape[2] == 0 or q.shape[2] % k.shape[2] != 0:
        raise ValueError(
            f"{q.shape[2]} query heads over {k.shape[2]} key/value heads on this rank: "
            "a GQA group is torn across ranks"
        )
    times = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(times, dim=2), v.repeat_interleave(times, dim=2)
    return q + torch.flip(k, [seq_dim]) + 2 * v


def _heads_of(
    program: UlyssesProgram, index: int, rank: int, takes_kv: bool, tag: int
) -> torch.Tensor:
    """Rank ``rank``'s heads of step ``index``'s global tensor ``tag`` (1 the input, 4 the
    upstream gradient), split over the release's basis (``takes_kv``: the key/value
    head count, else the tensor's own)."""
    step = program.steps[index]
    model = program.models[step.model]
    heads = model.heads if step.tensor == "q" else model.kv_heads
    split = head_split(heads, model.kv_heads if takes_kv else heads, program.world_size)
    return _global(program, index, tag).narrow(2, sum(split[:rank]), split[rank]).contiguous()


def expected_heads(
    program: UlyssesProgram, index: int, rank: int, takes_kv: bool
) -> dict[str, torch.Tensor]:
    """What rank ``rank`` should hold after step ``index`` (``takes_kv``: the release
    takes a key/value head count, the partition basis)."""
    step = program.steps[index]
    out: dict[str, torch.Tensor] = {}
    if step.kind == "attention":
        qkv = [_global(program, index, tag).clone().requires_grad_(step.grad) for tag in (1, 2, 3)]
        result = local_attention(qkv[0], qkv[1], qkv[2], program.models[step.model].seq_dim)
        out["output"] = _seq_chunk(program, index, result.detach(), rank)
        if step.grad:
            (result * _global(program, index, 4)).sum().backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs
            for name, t in zip(("q", "k", "v"), qkv, strict=True):
                assert t.grad is not None
                out[f"grad_{name}"] = _seq_chunk(program, index, t.grad, rank)
        return out
    out["heads"] = _heads_of(program, index, rank, takes_kv, 1)
    if step.kind == "round-trip":
        out["back"] = _seq_chunk(program, index, _global(program, index, 1), rank)
    if step.grad:
        out["grad_x"] = _seq_chunk(program, index, _global(program, index, 4), rank)
    return out


# --- the strategy ----------------------------------------------------------------------


@st.composite
def _model(draw: Any, world: int, uneven: bool, refusal: bool) -> Model:
    if refusal:
        kv = draw(st.integers(1, max(1, world - 1)))
    elif uneven and world > 1:
        kv = draw(st.integers(world + 1, 3 * world).filter(lambda h: h % world != 0))
    else:
        kv = draw(st.integers(world, 3 * world))
    group = draw(st.sampled_from((1, 1, 2, 3)))
    return Model(kv * group, kv, draw(st.integers(1, 3)), draw(st.booleans()))


@st.composite
def ulysses_programs(
    draw: Any,
    world_sizes: Sequence[int],
    kinds: Sequence[str] = KINDS,
    models: int = 1,
    steps: int = 1,
    uneven: bool = False,
    grad: bool | None = None,
    refusal: bool = False,
) -> UlyssesProgram:
    """A program on one of ``world_sizes``: up to ``models`` models (head counts drawn
    apart; ``uneven``: key/value heads not a multiple of the world size; ``refusal``:
    fewer than the world size), then up to ``steps`` calls of ``kinds`` on them
    (``grad``: with backward always, never, or drawn)."""
    world = draw(st.sampled_from(list(world_sizes)))
    count = draw(st.integers(1, models))
    built = tuple(draw(_model(world, uneven, refusal)) for _ in range(count))
    chosen = []
    for _ in range(draw(st.integers(1, steps))):
        kind = draw(st.sampled_from(list(kinds)))
        backward = draw(st.booleans()) if grad is None else grad
        chosen.append(
            Step(
                model=draw(st.integers(0, count - 1)),
                kind=kind,
                tensor=draw(st.sampled_from(("q", "kv"))) if kind != "attention" else "q",
                seq=draw(st.integers(1, 3)),
                batch=draw(st.integers(1, 2)),
                grad=backward and kind != "round-trip",
                seed=draw(st.integers(0, 2**16)),
            )
        )
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    return UlyssesProgram(world, built, tuple(chosen), dtype, refusal)


# --- the rank side ---------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """What this DeepSpeed release's signatures take."""

    version: str
    single_takes_kv: bool
    apply_takes_kv: bool
    attention_takes_kv: bool


def release() -> Release:
    """The installed release and whether its functions take ``num_kv_heads``."""
    import inspect

    import deepspeed  # untyped: Any
    from deepspeed.sequence import layer

    def takes(fn: Callable[..., Any]) -> bool:
        return "num_kv_heads" in inspect.signature(fn).parameters

    return Release(
        str(deepspeed.__version__),
        takes(layer.single_all_to_all),
        takes(layer._SeqAllToAll.forward),
        takes(layer.DistributedAttention.__init__),
    )


_SETUP: dict[str, Any] = {}
"""This rank process's DeepSpeed setup (communication backend, group, mpu), once."""


def _setup(ctx: Any) -> Any:
    group = _SETUP.get("group")
    if group is None:
        import deepspeed  # untyped: Any
        import torch.distributed as dist
        from deepspeed.utils import groups

        with quiet_stdout():  # its comm op's load messages (ninja's among them)
            deepspeed.init_distributed(dist_backend="gloo")
        group = _SETUP["group"] = ctx.subgroup(tuple(range(ctx.world_size)))
        # what deepspeed.initialize(mpu=...) installs: the model-parallel unit of a
        # sequence-parallel group of every rank, no tensor or pipeline parallelism
        groups.mpu = SimpleNamespace(
            get_sequence_parallel_group=lambda: group,
            get_sequence_parallel_rank=lambda: dist.get_rank(group),
            get_sequence_parallel_world_size=lambda: dist.get_world_size(group),
        )
    return group


class _Attention(torch.nn.Module):
    """``local_attention`` as the module ``DistributedAttention`` wraps. A torn GQA
    group is noted in ``torn`` (step, message) and answered with the query heads alone,
    of the right shape, so that every rank still reaches the output all-to-all (a rank
    raising there would leave its peers waiting in it until their timeout)."""

    def __init__(self, seq_dim: int, torn: list[tuple[int, str]]) -> None:
        super().__init__()
        self.seq_dim = seq_dim
        self.torn = torn
        self.step = 0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any
    ) -> torch.Tensor:
        try:
            return local_attention(q, k, v, self.seq_dim)
        except ValueError as err:
            self.torn.append((self.step, str(err)))
            return q * 1


@dataclass(frozen=True)
class UlyssesReport(StepsReport):
    """One rank's results (``StepsReport``), and what the judge reads of the release."""

    takes_kv: bool = False
    """The release's functions take ``num_kv_heads`` (the partition basis)."""
    torn: tuple[tuple[int, str], ...] = ()
    """(step, message) for each attention that found a GQA group torn on this rank."""


def run_ulysses_program(ctx: Any, program: UlyssesProgram) -> UlyssesReport:
    """Rank side: set DeepSpeed up (once per process), clear its head state, build the
    models in order, run the steps in order."""
    from deepspeed.module_inject import tp_shard  # untyped: Any
    from deepspeed.sequence import layer

    group = _setup(ctx)
    # the head count DeepSpeed keeps process-wide (before 0.19.7: tp_shard's
    # num_kv_heads, set by the first uneven call), cleared as a new job starts with it
    if hasattr(tp_shard, "num_kv_heads"):
        tp_shard.num_kv_heads = None
    rel = release()
    rank = ctx.rank
    built = []
    torn: list[tuple[int, str]] = []
    for m in program.models:
        # a GQA model passes num_kv_heads where DistributedAttention takes it (0.19.7
        # on); an MHA model leaves it to be read off the key tensor
        gqa = rel.attention_takes_kv and m.kv_heads != m.heads
        extra = {"num_kv_heads": m.kv_heads} if gqa else {}
        built.append(
            layer.DistributedAttention(
                _Attention(m.seq_dim, torn), group, scatter_idx=2, gather_idx=m.seq_dim, **extra
            )
        )

    def run_step(index: int) -> dict[str, torch.Tensor]:
        step = program.steps[index]
        model = program.models[step.model]
        b, seq = model.batch_dim_idx, model.seq_dim
        attention = built[step.model]
        attention.local_attn.step = index

        def chunk(tag: int) -> torch.Tensor:
            return _seq_chunk(program, index, _global(program, index, tag), rank)

        if step.kind == "attention":
            inputs = [chunk(tag).clone().requires_grad_(step.grad) for tag in (1, 2, 3)]
            out = attention(*inputs, b)
            result = {"output": out.detach().clone()}
            if step.grad:
                (out * chunk(4)).sum().backward()
                for name, t in zip(("q", "k", "v"), inputs, strict=True):
                    if t.grad is not None:
                        result[f"grad_{name}"] = t.grad.clone()
            return result
        x = chunk(1)
        if step.grad:
            xs = x.clone().requires_grad_()
            args = (None, None, None, True, model.kv_heads) if rel.apply_takes_kv else ()
            y = layer._SeqAllToAll.apply(group, xs, 2, seq, b, *args)
            (y * _heads_of(program, index, rank, rel.single_takes_kv, 4)).sum().backward()
            grad = xs.grad if xs.grad is not None else torch.zeros(0)
            return {"heads": y.detach().clone(), "grad_x": grad.clone()}
        extra = {"num_kv_heads": model.kv_heads} if rel.single_takes_kv else {}
        y = layer.single_all_to_all(x, 2, seq, b, group, **extra)
        result = {"heads": y.detach().clone()}
        if step.kind == "round-trip":
            z = layer.single_all_to_all(y, seq, 2, b, group, **extra)
            result["back"] = z.detach().clone()
        return result

    done = in_turn(len(program.steps), run_step)
    return UlyssesReport(done.steps, done.error, rel.single_takes_kv, tuple(torn))


def judge_ulysses(
    program: UlyssesProgram, reports: Sequence[UlyssesReport]
) -> list[tuple[str, str]]:
    """The failures of one program, as (aspect, message): ``raised`` (a rank raised
    where the oracle expects a result, or a refusal not on every rank), ``output``
    (a step's result is not the global tensor's slice), ``gradient``."""
    takes_kv = bool(reports) and reports[0].takes_kv
    errors = {r: rep.error for r, rep in enumerate(reports) if rep.error is not None}
    if program.refusal:
        if len(errors) == len(reports):
            return []
        raised = first_real_error(errors)
        ok = sorted(set(range(len(reports))) - set(errors))
        said = f"; rank {raised[0]} raised {raised[1]}" if raised else ""
        message = f"fewer key/value heads than ranks: ranks {ok} did not refuse{said}"
        return [("raised", message)]
    if errors:
        return [("raised", raised_message(errors, "step"))]
    for rank, rep in enumerate(reports):
        for index, message in rep.torn:
            return [("output", f"step {index} (attention), rank {rank}: {message}")]
    for index, step in enumerate(program.steps):
        for rank, rep in enumerate(reports):
            want = expected_heads(program, index, rank, takes_kv)
            where = f"step {index} ({step.kind}), rank {rank}"
            failures = differences(where, rep.steps[index], want, _OUTPUTS)
            if failures:
                return failures
    return []


_OUTPUTS: Final = {"output": "output", "heads": "output", "back": "output"}
"""The aspect of each result that is not a gradient."""


ROWS: Final = (
    ProgramRow(
        "seq-to-heads",
        "single_all_to_all from sequence to heads shards: each rank's heads of the whole "
        "sequence, both layouts, query and key/value tensors, even and uneven heads",
        lambda w: ulysses_programs(w, ("seq-to-heads",), grad=False),
        all_worlds,
    ),
    ProgramRow(
        "round-trip",
        "sequence -> heads -> sequence is the identity (single_all_to_all both ways)",
        lambda w: ulysses_programs(w, ("round-trip",)),
        all_worlds,
    ),
    ProgramRow(
        "gradient",
        "_SeqAllToAll.apply's backward: each rank's sequence chunk of the global upstream "
        "gradient (each rank's upstream differs)",
        lambda w: ulysses_programs(w, ("seq-to-heads",), grad=True),
        all_worlds,
    ),
    ProgramRow(
        "attention",
        "DistributedAttention, MHA and GQA, forward and backward: the global attention's "
        "sequence chunk, bit for bit",
        lambda w: ulysses_programs(w, ("attention",)),
        all_worlds,
    ),
    ProgramRow(
        "uneven-heads",
        "key/value head counts the sequence-parallel degree does not divide (remainder "
        "heads on the first ranks), every kind of call",
        lambda w: ulysses_programs(w, KINDS, steps=2, uneven=True),
        multi_worlds,
    ),
    ProgramRow(
        "programs",
        "several models with different head counts built in one process, then calls on "
        "them in turn (the process-wide head count of DeepSpeed #8291)",
        lambda w: ulysses_programs(w, KINDS, models=3, steps=4),
        multi_worlds,
    ),
    ProgramRow(
        "fewer-heads-than-ranks",
        "fewer key/value heads than ranks: every rank refuses (no hang, no crash)",
        lambda w: ulysses_programs(w, ("attention", "seq-to-heads"), refusal=True),
        multi_worlds,
    ),
)


def _prepare(progress: Progress) -> tuple[str, dict[str, str]]:
    """In the parent, before the ranks start: the release's signatures, and DeepSpeed's
    CPU communication op built once (a JIT build of about a minute on a cold cache,
    which the ranks then load instead of each building it within a case's timeout)."""
    import importlib

    progress.phase("reading the DeepSpeed release (first run: building its CPU comm op)")
    rel = release()
    with quiet_stdout():
        importlib.import_module("deepspeed.comm.torch").build_shm_op()  # untyped: Any
    takes = "takes num_kv_heads" if rel.single_takes_kv else "no num_kv_heads"
    header = f"DeepSpeed {rel.version} Ulysses: {TARGET.display} ({takes})"
    return header, {"deepspeed": rel.version}


TARGET: Final = ProgramTarget(
    display="deepspeed.sequence.layer",
    call="single_all_to_all / _SeqAllToAll.apply(group, x, 2, seq_dim, batch_dim_idx) / "
    "DistributedAttention(attn, group, 2, seq_dim)(q, k, v, batch_dim_idx)",
    rows=ROWS,
    run=run_ulysses_program,
    judge=judge_ulysses,
    describe=describe,
    scope={
        "--sequence": "divisible by the ranks (no release splits an uneven sequence)",
        "--heads": "at least the ranks (fewer: a refusal row)",
    },
    prepare=_prepare,
)
