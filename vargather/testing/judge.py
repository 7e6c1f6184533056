"""The testing kit's judge: the ranks' reports against the oracle, as structured failures.

Where it sits: above ``cases``, below ``runner`` and ``properties`` (which keeps the
failures whose ``aspect`` its claim is about). The judge returns ``Failure`` records,
never text to be parsed back: the command line's report is rendered from their fields.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import torch

from .asserts import bitwise_difference
from .asserts import mismatch_detail as _mismatch_detail
from .cases import GatherCase, Implementation, RankReport, TensorBytes, as_real
from .pool_types import RankCrashed
from .values import _check_choice, dtype_name

if TYPE_CHECKING:
    from .cases import Expected

ASPECTS: Final = ("output", "sizes", "gradient", "adjoint", "call")
"""What a failure is about; ``call``: the call itself did not complete (it raised, a
rank crashed or hung, a rank sent no report), which counts against every property."""

KINDS: Final = ("mismatch", "error", "crash", "hang")
"""How it failed: a wrong value; the implementation raised; a rank process died; a
rank did not reply in time."""


@dataclass(frozen=True)
class Failure:
    """One way a case failed, on the group ranks ``ranks`` (empty: not tied to ranks).

    ``call`` is the call as the message names it (``all_gather_v(dim=1)``);
    ``group_size`` the size of the gather group. ``detail`` (a traceback, a pool's diagnosis) follows
    the message in reports. ``property`` is set by the catalogue that counted it.
    ``nan_payload``: a reduction's result that differs from the oracle's only in the
    payload bits of NaNs, a NaN wherever the oracle has one (``--nan-payloads backend``
    reports it without failing, unless ``--strict``).
    """

    aspect: str
    kind: str
    message: str
    ranks: tuple[int, ...] = ()
    group_size: int = 0
    call: str = ""
    detail: str = ""
    nan_payload: bool = False

    def __post_init__(self) -> None:
        _check_choice("aspect", self.aspect, ASPECTS)
        _check_choice("kind", self.kind, KINDS)

    @property
    def where(self) -> str:
        """``all_gather_v(dim=1) on ranks 0, 2 of 3`` (empty when not tied to ranks)."""
        if not self.ranks:
            return self.call
        r = self.ranks
        if len(r) == 1:
            on = f"rank {r[0]} of {self.group_size}"
        elif len(r) == self.group_size:
            on = f"every rank of {self.group_size}"
        else:
            on = f"ranks {', '.join(map(str, r))} of {self.group_size}"
        return f"{self.call} on {on}" if self.call else on

    def render(self) -> str:
        """The failure in words: message, ``[where]``, then the detail's lines."""
        where = self.where
        text = f"{self.message} [{where}]" if where else self.message
        return f"{text}\n{self.detail}" if self.detail else text

    # Declared last: the builtin ``property`` decorates the methods above.
    property: str = ""


_ADDRESS: Final = re.compile(r" at 0x[0-9a-fA-F]+>")


def without_addresses(text: str) -> str:
    """``text`` with the memory addresses of object reprs (``<ProcessGroup object at
    0x7f3c...>``) written ``0x...``: an error names the same object alike on every rank
    and in every run, so ranks that raised alike are one failure and a report reads the
    same every run."""
    return _ADDRESS.sub(" at 0x...>", text)


_KILLED: Final = "All rank processes were killed"


def world_failure_text(exc: BaseException) -> str:
    """``exc``'s text (the world failed), in the same words every run: the sections of
    the ranks that did not die (which of them had replied, raised or were still waiting
    for the dead one when the world was killed depends on timing) become one line."""
    if not isinstance(exc, RankCrashed):
        return without_addresses(str(exc))
    lines: list[str] = []
    kept, others = True, False
    for line in str(exc).splitlines():
        if line.startswith("--- rank ") or line.startswith(_KILLED):
            kept = line.startswith(_KILLED) or " died" in line.split("(", 1)[0]
            others = others or not kept
            if line.startswith(_KILLED) and others:
                lines.append("--- the other ranks: killed with the world, wherever they were")
        if kept:
            lines.append(line)
    return without_addresses("\n".join(lines))


# --- comparing tensors ---------------------------------------------------------------------


def _compare_grad(
    case: GatherCase, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor | None
) -> str | None:
    if case.grads_exact() or bound is None:
        if torch.equal(got, want):
            return None
        bad = (got != want) | (got.isnan() & ~want.isnan())
        return "differs from the oracle (exact comparison) " + _mismatch_detail(got, want, bad)
    info = torch.finfo(case.torch_dtype.to_real())
    w = case.group_size
    tol = (w + 1) * info.eps * bound + w * info.tiny * info.eps
    diff = (as_real(got).to(torch.float64) - as_real(want).to(torch.float64)).abs()
    bad_parts = ~(diff <= tol)
    if not bool(bad_parts.any()):
        return None
    # Complex: a tensor of shape want.shape + (2,) (real and imaginary parts).
    bad = bad_parts.any(-1) if got.is_complex() else bad_parts
    first = int(bad.reshape(-1).nonzero()[0, 0].item())
    allowed = tol.amin(-1) if got.is_complex() else tol
    note = f", allowed |difference| <= {float(allowed.reshape(-1)[first]):.3g}"
    return (
        f"differs from the oracle beyond (W+1)*eps*sum|g| (eps={info.eps:.3g}) "
        + _mismatch_detail(got, want, bad, note)
    )


def _inner(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((as_real(a).to(torch.float64) * as_real(b).to(torch.float64)).sum().item())


def judge(
    case: GatherCase, impl: Implementation, per_rank: Sequence[object], *, call: str = ""
) -> list[Failure]:
    """Every failure of one case from every world rank's report (empty: passed).

    ``per_rank[g]`` is world rank ``g``'s report (``RankReport``; ``None`` from a rank
    outside the case's subgroup). A failure that several ranks produce alike is one
    ``Failure`` naming them all. ``call`` names the call in failures (default:
    ``ATTR(dim=...)``; a tensor of a coalesced call names itself).
    """
    exp = case.expected()
    w = case.group_size
    call = call or f"{impl.short_name}(dim={case.dim})"
    members = case.members if case.members is not None else tuple(range(case.world_size))
    reports: dict[int, RankReport] = {}
    found: dict[tuple[str, str, str, str], list[int]] = {}

    def add(problems: Sequence[tuple[str, str, str, str]], rank: int | None) -> None:
        for key in problems:
            ranks = found.setdefault(key, [])
            if rank is not None:
                ranks.append(rank)

    for global_rank, rep in enumerate(per_rank):
        if global_rank not in members:
            if isinstance(rep, RankReport) and rep.error is not None:
                name, message, _ = rep.error
                message = without_addresses(message)
                text = f"raised {name}: {message} (world rank {global_rank}, not a member)"
                add([("call", "error", text, "")], None)
            elif rep is not None and not (isinstance(rep, RankReport) and rep.skipped):
                text = f"world rank {global_rank}, not a member, reported {rep!r}"
                add([("call", "error", text, "")], None)
            continue
        rank = members.index(global_rank)
        if not isinstance(rep, RankReport):
            text = f"no report from the rank (got {type(rep).__name__})"
            add([("call", "error", text, "")], rank)
        elif rep.error is not None:
            name, message, tb = rep.error
            tail = without_addresses("\n".join(tb.rstrip().splitlines()[-12:]))
            add([("call", "error", f"raised {name}: {without_addresses(message)}", tail)], rank)
        elif rep.skipped:
            add([("call", "error", f"not run: {rep.skipped}", "")], rank)
        else:
            reports[rep.rank] = rep
            add(_judge_rank(case, impl, rep, exp), rank)
    failures = [
        Failure(
            aspect, kind, message, tuple(ranks), w if ranks else 0, call if ranks else "", detail
        )
        for (aspect, kind, message, detail), ranks in found.items()
    ]
    if len(reports) == w and case.adjoint_applies() and not failures:
        lhs = rhs = 0.0
        for r in range(w):
            report = reports[r]
            assert report.out is not None  # judged above without failure
            assert report.grad is not None
            lhs += _inner(report.grad.to_tensor(), case.shard_values(r))
            # A digested output equalled the oracle's (judged above): use that.
            got = exp.output if report.out.digest else report.out.to_tensor()
            rhs += _inner(case.upstream_grad(r), got)
        if lhs != rhs:
            failures.append(
                Failure(
                    "adjoint",
                    "mismatch",
                    f"adjoint identity fails: sum_r <dx_r, x_r> = {lhs!r}, but "
                    f"sum_j <g_j, out_j> = {rhs!r}",
                    call=f"{call}, grad='sum', {w} ranks",
                )
            )
    return failures


_Problem = tuple[str, str, str, str]  # (aspect, kind, message, detail)


def _wrong(aspect: str, message: str) -> _Problem:
    return (aspect, "mismatch", message, "")


def _judge_rank(
    case: GatherCase, impl: Implementation, rep: RankReport, exp: Expected
) -> list[_Problem]:
    out = rep.out
    if out is None:
        return [_wrong("output", f"returned a {rep.out_type}, but should return a tensor")]
    failures: list[_Problem] = []
    want_dtype = dtype_name(case.torch_dtype)
    if out.dtype != want_dtype:
        failures.append(_wrong("output", f"out.dtype={out.dtype}, but should be {want_dtype}"))
    if out.shape != case.output_shape:
        failures.append(
            _wrong("output", f"out.shape={out.shape}, but should be {case.output_shape}")
        )
    if out.device != "cpu":
        failures.append(
            _wrong("output", f"out.device={out.device}, but should be cpu (the input's)")
        )
    if not failures and out.digest:
        if out.digest != exp.output_digest:
            where = out.mismatch or (
                "(the rank found no differing element: its digest differs from the oracle's)"
            )
            failures.append(
                _wrong(
                    "output",
                    f"out differs from torch.cat(x, dim) (compared on the rank, "
                    f"{case.output_nbytes} bytes) {where}",
                )
            )
    elif not failures and out.data != exp.output_bytes:
        difference = bitwise_difference(out.to_tensor(), exp.output)
        assert difference is not None  # same dtype and shape, different bytes
        failures.append(
            _wrong("output", f"out differs from torch.cat(x, dim) (bytes compared) {difference}")
        )
    if not rep.input_intact:
        failures.append(_wrong("output", "the input x was modified in place"))
    failures.extend(_judge_extra(case, impl, rep))
    if case.differentiable:
        failures.extend(_judge_grad(case, rep, exp))
    return failures


def _sizes_text(value: TensorBytes) -> str:
    """Returned sizes as values (``[2, 0, 3]``), or their dtype and shape when they are
    not a 1-d integer tensor."""
    if len(value.shape) == 1 and value.dtype.startswith(("int", "uint")):
        return str([int(v) for v in value.to_tensor().tolist()])
    return f"a {value.dtype} tensor of shape {value.shape}"


def _judge_extra(case: GatherCase, impl: Implementation, rep: RankReport) -> list[_Problem]:
    kind = rep.extra[0]
    distributed = case.initialized and case.world_size > 1
    if kind == "sizes":
        value = rep.extra[1]
        assert value is None or isinstance(value, TensorBytes)  # what the runner sends
        true = list(case.sizes)
        if value is None:
            # None outside a multi-rank world (as the seed returns), or from a list
            # return, which may carry no sizes at all.
            if distributed and impl.returns != "list":
                return [_wrong("sizes", f"sizes=None, but should be {true}")]
            return []
        if value.dtype != "int64" or len(value.shape) != 1 or value.device != "cpu":
            return [
                _wrong(
                    "sizes",
                    f"sizes={_sizes_text(value)} (dtype {value.dtype}, shape {value.shape}, "
                    f"device {value.device}), but should be a 1-d int64 tensor on cpu "
                    f"holding {true}",
                )
            ]
        got = [int(v) for v in value.to_tensor().tolist()]
        if got != true:
            also = "" if distributed else " (or None: not distributed)"
            return [_wrong("sizes", f"sizes={got}, but should be {true}{also}")]
        return []
    if kind == "layout":
        fields = rep.extra[1]
        assert isinstance(fields, dict)  # what the runner sends for a layout
        d = case.normalized_dim
        offsets = tuple(itertools.accumulate((0, *case.sizes[:-1])))
        want: dict[str, object] = {
            "sizes": case.sizes,
            "offsets": offsets,
            "total": sum(case.sizes),
            "max_size": max(case.sizes),
            "dim": d,
            "leading_shape": case.shapes[0][:d],
            "trailing_shape": case.shapes[0][d + 1 :],
            "dtype": case.dtype,
            "rank": rep.rank,
            "world_size": case.group_size,
        }
        return [
            _wrong("sizes", f"layout.{k}={fields.get(k)!r}, but should be {v!r}")
            for k, v in want.items()
            if fields.get(k) != v
        ]
    if kind == "other":
        return [_wrong("sizes", f"returned (tensor, {rep.extra[1]}): expected sizes or a layout")]
    return []


def _judge_grad(case: GatherCase, rep: RankReport, exp: Expected) -> list[_Problem]:
    if not rep.out_requires_grad:
        return [_wrong("gradient", "out.requires_grad=False, but should be True (x requires grad)")]
    if rep.backward_note:
        return [_wrong("gradient", rep.backward_note)]
    if rep.grad is None:
        shape = case.shapes[rep.rank]
        return [
            _wrong("gradient", f"x.grad={rep.grad_type}, but should be a tensor of shape {shape}")
        ]
    assert exp.input_grads is not None  # the case is differentiable
    want = exp.input_grads[rep.rank]
    if rep.grad.dtype != dtype_name(want.dtype) or rep.grad.shape != tuple(want.shape):
        return [
            _wrong(
                "gradient",
                f"x.grad has dtype {rep.grad.dtype} and shape {rep.grad.shape}, but should "
                f"have {dtype_name(want.dtype)} and {tuple(want.shape)}",
            )
        ]
    bound = exp.grad_bounds[rep.rank] if exp.grad_bounds is not None else None
    problem = _compare_grad(case, rep.grad.to_tensor(), want, bound)
    if problem is None:
        return []
    return [_wrong("gradient", f"x.grad (grad={case.contract!r}) {problem}")]
