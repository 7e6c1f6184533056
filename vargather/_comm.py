"""Thin layer over torch.distributed, below every stage: every collective goes here.

Where it sits: the stages communicate only through the wrappers here; nothing here
knows about a ``Layout`` or padding. Each wrapper runs one collective under
``translate_collective_errors``: a backend ``RuntimeError`` surfaces as a vargather
``CollectiveError`` (``CollectiveTimeoutError``, ``PeerLostError``) naming the ranks
that never arrived (``_census``), under the call's own ``timeout`` if any
(``_group.call_timeout``); and a dtype the backend refuses travels as its bytes
(``movable``). ``GroupInfo``, ``resolve_group`` and ``group_timeout`` (``_group``) are
re-exported here, where the testing kit has always found them.
"""

from __future__ import annotations

import contextlib
import math
import re
import weakref
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from datetime import timedelta
from typing import Any, Final

import torch
import torch.distributed as dist

from ._census import ARRIVALS
from ._dtypes import NATIVE_DTYPES
from ._errors import CollectiveError, CollectiveTimeoutError, PeerLostError
from ._group import GroupInfo, call_timeout, group_timeout


def _seconds(t: timedelta) -> str:
    s = t.total_seconds()
    return f"{s:g} s" if s < 120 or not math.isfinite(s) else f"{s / 60:g} min"


_TIMEOUT_PATTERN = re.compile(r"timed? ?out|timeout|deadline", re.IGNORECASE)
_PEER_LOST_PATTERN = re.compile(
    r"connection (closed|reset|refused)|broken pipe|closed by peer|reset by peer|"
    r"socket|EOF|peer .* (crash|died)",
    re.IGNORECASE,
)
_OUT_OF_STEP: Final = (
    " The group is now out of step (its ranks disagree on which collective comes "
    "next): destroy it and create a new one before communicating again."
)


_ISSUED: MutableSequence[int] = [0]  # collectives this process has entered through this module


def collectives_issued() -> int:
    """How many collectives this process has entered through ``_comm`` so far (a
    batch counts one): tests read it before and after a call to count its round trips."""
    return _ISSUED[0]


def swap_issued_counter(counter: MutableSequence[int]) -> MutableSequence[int]:
    """Count the collectives entered from now on in ``counter[0]``; return the counter
    it replaces (put it back when done). For the scale simulation, which plays every
    rank on a thread of one process (a ``counter`` whose item 0 is per thread)."""
    global _ISSUED
    before, _ISSUED = _ISSUED, counter
    return before


def translate_collective_errors(
    what: str, info: GroupInfo, *, arrival: int | None = None
) -> contextlib.AbstractContextManager[None]:
    """Run one collective: record the arrival (unless ``arrival`` is given), apply the
    call's timeout, and re-raise backend failures as ``CollectiveError``s that name the
    ranks that never arrived."""
    if info.timeout is None:  # the group's own timeout: nothing to set and restore
        return _Translated(what, info, arrival)
    return _translated_with_timeout(what, info, arrival)


class _Translated:
    """``translate_collective_errors`` without a per-call timeout, as a plain class (a
    generator-based context manager costs microseconds on every collective)."""

    __slots__ = ("arrival", "count", "info", "what")

    def __init__(self, what: str, info: GroupInfo, arrival: int | None) -> None:
        self.what, self.info, self.arrival, self.count = what, info, arrival, 0

    def __enter__(self) -> None:
        _ISSUED[0] += 1
        if self.arrival is None:
            self.count = ARRIVALS.arrive(self.info, self.what)
        else:
            self.count = self.arrival

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: Any
    ) -> None:
        if isinstance(err, RuntimeError):
            _translate(err, self.what, self.info, self.count)


@contextlib.contextmanager
def _translated_with_timeout(what: str, info: GroupInfo, arrival: int | None) -> Iterator[None]:
    _ISSUED[0] += 1
    count = ARRIVALS.arrive(info, what) if arrival is None else arrival
    try:
        with call_timeout(info):
            yield
    except RuntimeError as err:
        _translate(err, what, info, count)
        raise


def _translate(err: RuntimeError, what: str, info: GroupInfo, count: int) -> None:
    """Raise ``err`` (a backend failure) as the ``CollectiveError`` it stands for; return
    when it already is one."""
    if isinstance(err, CollectiveError):
        return
    text = " ".join(str(err).split())[:400]
    where = f"{what} on rank {info.rank} of {info.world_size}"
    if _TIMEOUT_PATTERN.search(text):
        missing, census = ARRIVALS.census(info, count, what, timed_out=True)
        limit = info.timeout or group_timeout(info)
        within = f"within {_seconds(limit)}" if limit is not None else "in time"
        whose = "this call's timeout" if info.timeout is not None else "the group's timeout"
        raise CollectiveTimeoutError(
            f"{where} timed out: a peer did not arrive {within} ({whose}).{census}"
            f"{_OUT_OF_STEP} (backend said: {text})",
            ranks=missing,
        ) from err
    if _PEER_LOST_PATTERN.search(text):
        missing, census = ARRIVALS.census(info, count, what, timed_out=False)
        raise PeerLostError(
            f"{where}: a peer closed its connection mid-collective, it probably "
            f"died.{census}{_OUT_OF_STEP} (backend said: {text})",
            ranks=missing,
        ) from err
    # Anything else failed locally (a dtype the backend refuses, say), likely on
    # every rank at once: a census would only race with the peers' arrivals.
    raise CollectiveError(f"{where} failed (backend said: {text})") from err


def movable(t: torch.Tensor, *, rows: bool) -> torch.Tensor:
    """``t`` for a pure data-movement collective (all_gather, all_to_all, broadcast):
    itself, or its bytes when the backend may not carry its dtype. Exact, as nothing is
    computed. ``rows``: keep every dimension (dim 0 is alltoallv's split dimension) by
    viewing each element as a row of bytes, always a view of ``t``; else flat bytes: a
    view of a contiguous ``t`` (a receive buffer must be one, so the bytes land in
    it), a copy of a strided one (fine to send)."""
    if t.dtype in NATIVE_DTYPES:
        return t
    as_rows = t.unsqueeze(-1).view(torch.uint8)  # any strides: the new last one is 1
    # Size-1 tensors may carry any stride and still report contiguous, which is why
    # this does not go through t.view(uint8).
    return as_rows if rows else as_rows.reshape(-1)


def _all_gather_single() -> Callable[..., Any]:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecates
    # the old name; older torch releases only have the old one.
    fn = getattr(dist, "all_gather_single", None)
    return fn if fn is not None else dist.all_gather_into_tensor


def _reduce_scatter_single() -> Callable[..., Any]:
    fn = getattr(dist, "reduce_scatter_single", None)
    return fn if fn is not None else dist.reduce_scatter_tensor


def all_gather_equal(
    output: torch.Tensor, local: torch.Tensor, info: GroupInfo, *, what: str = "all_gather"
) -> None:
    """``output`` (``W * k`` elements) receives every rank's ``local`` (``k`` each)."""
    # Flat views: backends disagree on which output shapes they accept (gloo takes
    # only the "cat along dim 0" form); 1-d is accepted everywhere.
    with translate_collective_errors(what, info):
        _all_gather_single()(  # 1-d already (the fused round's buffers): no new views
            movable(output if output.dim() == 1 else output.view(-1), rows=False),
            movable(local if local.dim() == 1 else local.reshape(-1), rows=False),
            group=info.group,
        )


def all_gather_list(
    outputs: Sequence[torch.Tensor],
    local: torch.Tensor,
    info: GroupInfo,
    *,
    what: str = "all_gather (list)",
) -> None:
    """``outputs[r]`` receives rank r's ``local`` (``dist.all_gather``; sizes may differ
    on NCCL, must be equal on gloo)."""
    with translate_collective_errors(what, info):
        dist.all_gather(
            [movable(o, rows=True) for o in outputs], movable(local, rows=True), group=info.group
        )


def reduce_scatter_equal(
    output: torch.Tensor, full: torch.Tensor, info: GroupInfo, *, what: str = "reduce_scatter"
) -> None:
    """``output`` (``k``) receives the sum over ranks of chunk ``rank`` of ``full``."""
    with translate_collective_errors(what, info):
        _reduce_scatter_single()(
            output.view(-1), full.reshape(-1), op=dist.ReduceOp.SUM, group=info.group
        )


def reduce_scatter_uneven(
    output: torch.Tensor,
    chunks: Sequence[torch.Tensor],
    info: GroupInfo,
    *,
    what: str = "reduce_scatter",
) -> None:
    """``output`` receives the sum over ranks of ``chunks[rank]`` (chunks may differ)."""
    with translate_collective_errors(what, info):
        dist.reduce_scatter(output, list(chunks), op=dist.ReduceOp.SUM, group=info.group)


def all_to_all_uneven(
    output: torch.Tensor,
    send: torch.Tensor,
    output_splits: Sequence[int],
    input_splits: Sequence[int],
    info: GroupInfo,
    *,
    what: str = "all_to_all",
) -> None:
    """alltoallv along dim 0: rank ``j`` receives ``input_splits[j]`` rows from each peer.

    On a gloo group a real (non-complex) pair of tensors goes straight to the process
    group's ``all_to_all_single``, which is all ``dist.all_to_all_single`` does there
    after its checks (every one of which holds here: two dense tensors of one dtype, a
    group this rank is in) and its logging wrapper: about 25 us of the calling thread's
    CPU a call (4 ranks, 16 KiB), a fifth of a 64 KiB ``all_to_all_v``'s own work."""
    out, inp = movable(output, rows=True), movable(send, rows=True)
    with translate_collective_errors(what, info):
        _alltoallv(out, inp, list(output_splits), list(input_splits), info)


def _alltoallv(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: list[int],
    in_splits: list[int],
    info: GroupInfo,
) -> None:
    """One alltoallv, awaited (``_post_alltoallv``)."""
    work = _post_alltoallv(out, inp, out_splits, in_splits, info, async_op=False)
    if work is not None:  # as dist.all_to_all_single: a backend may sync in C++
        work.wait()


def _post_alltoallv(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_splits: list[int],
    in_splits: list[int],
    info: GroupInfo,
    *,
    async_op: bool,
) -> Any:
    """Post one alltoallv and return its work (``None`` when it already ran): on a gloo
    group (``gloo_group``) with real tensors of one dtype, the process group's own;
    else ``dist.all_to_all_single`` (whose checks then speak; ``async_op`` passed only
    when set, so a stand-in with the blocking signature serves the blocking call)."""
    pg = gloo_group(info)
    if pg is None or out.dtype != inp.dtype or out.is_complex() or inp.is_complex():
        return dist.all_to_all_single(
            out,
            inp,
            output_split_sizes=out_splits,
            input_split_sizes=in_splits,
            group=info.group,
            **({"async_op": True} if async_op else {}),
        )
    opts = _ASYNC_ALL_TO_ALL if async_op else _SYNC_ALL_TO_ALL
    return _pg_all_to_all(pg)(out, inp, out_splits, in_splits, opts)


def _all_to_all_options(async_op: bool) -> dist.AllToAllOptions:
    opts = dist.AllToAllOptions()
    opts.asyncOp = async_op  # as dist.all_to_all_single sets it
    return opts


_SYNC_ALL_TO_ALL: Final = _all_to_all_options(False)
"""The options of every blocking alltoallv vargather posts (read only by the backend;
the timeout is left unset: the group's, which ``call_timeout`` sets for a per-call
one)."""

_ASYNC_ALL_TO_ALL: Final = _all_to_all_options(True)
"""The same for the alltoallvs of ``all_to_all_round``, posted before any is awaited."""


AllToAll = tuple[torch.Tensor, torch.Tensor, Sequence[int], Sequence[int]]
"""One alltoallv of uint8 buffers: ``(output, input, output_splits, input_splits)``."""


def all_to_all_round(exchanges: Sequence[AllToAll], info: GroupInfo, *, what: str) -> None:
    """Several alltoallvs of flat uint8 buffers (``AllToAll``) as one round, one
    collective call as the census and the issued count see it: every one posted, in
    the same order on every rank, before any is awaited. On gloo each runs on one of
    the group's worker threads, its own block copied there (gloo requires
    ``output_splits[rank] == input_splits[rank]``); a peer's message may be shorter
    than the room its receiver gave it (gloo takes any message of at most that)."""
    with translate_collective_errors(what, info):
        works = [
            _post_alltoallv(out, inp, list(outs), list(ins), info, async_op=True)
            for out, inp, outs, ins in exchanges
        ]
        for work in works:
            if work is not None:
                work.wait()


def _pg_all_to_all(pg: dist.ProcessGroup) -> Callable[..., Any]:
    """The process group's alltoallv: ``all_to_all_single`` (torch 2.13) or
    ``alltoall_base`` (earlier releases)."""
    method = getattr(pg, "all_to_all_single", None)
    return method if method is not None else pg.alltoall_base


def gloo_group(info: GroupInfo) -> dist.ProcessGroup | None:
    """The group's ``ProcessGroup`` when it is a real gloo one, whose methods vargather
    may call directly, else ``None`` (NCCL, MPI, a simulated group)."""
    pg = info.group if info.group is not None else dist.group.WORLD
    if type(pg) is not dist.ProcessGroup:
        return None
    known = _GLOO.get(pg)
    if known is None:
        backend_name = getattr(pg, "_get_backend_name", None)  # private in torch 2.x: guarded
        known = _GLOO[pg] = backend_name is not None and backend_name() == "gloo"
    return pg if known else None


_GLOO: Final = weakref.WeakKeyDictionary[dist.ProcessGroup, bool]()
"""Per group (weakly): whether ``gloo_group`` calls it a gloo one (its backend is
fixed when it is made)."""


def all_reduce_sum(t: torch.Tensor, info: GroupInfo, *, what: str = "all_reduce") -> None:
    """``t`` becomes the sum over ranks of every rank's ``t``, in place."""
    with translate_collective_errors(what, info):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=info.group)


def _global_rank(info: GroupInfo, group_rank: int) -> int:
    """The global rank of ``group_rank`` (what ``dist.broadcast(src=...)`` expects)."""
    if info.group is None:
        return group_rank
    return dist.get_global_rank(info.group, group_rank)


def broadcast_from_each(
    blocks: Sequence[torch.Tensor],
    info: GroupInfo,
    *,
    what: str | None = None,
    sources: Sequence[int] | None = None,
) -> None:
    """Block ``i`` of every rank receives block ``i`` of rank ``sources[i]`` (default:
    rank ``i``): one broadcast per non-empty block (every rank knows every size), all
    issued in the same order on every rank, so the backend pairs them by sequence
    number and gloo runs them concurrently, then awaited. Every block must be a
    contiguous receive buffer."""
    src = range(len(blocks)) if sources is None else sources
    with translate_collective_errors(what or f"broadcast x{len(blocks)}", info):
        works = [
            dist.broadcast(
                movable(block, rows=False),  # its bytes when the backend refuses the dtype
                src=_global_rank(info, r),
                group=info.group,
                async_op=True,
            )
            for r, block in zip(src, blocks, strict=True)
            if block.numel() > 0
        ]
        for work in works:
            if work is not None:
                work.wait()


P2P_TAG: Final = 0x5647  # "VG": vargather's sends never match a caller's untagged recv
"""The tag of ``send_receive``'s first message to a peer by default (message ``i``:
``P2P_TAG + i``; gloo keys a point-to-point message by peer and tag, apart from its
collectives' slots): the all_gather-shaped round's."""

BLOCKS_TAG: Final = P2P_TAG + 16
"""The first tag of the all_to_all-shaped round's direct sends: apart from the
all_gather-shaped round's, so a rank in one beside a peer in the other never receives
a message of the other's length (gloo cannot survive that): both wait, and time out
naming each other."""


def exchange_with_each(
    blocks: Sequence[torch.Tensor], info: GroupInfo, *, what: str | None = None
) -> None:
    """``broadcast_from_each`` by direct sends: this rank's block to every peer, each
    peer's received in place, 2 (W - 1) operations (``send_receive``). Every block must
    be a contiguous receive buffer of the same size on every rank."""
    own = (blocks[info.rank],)
    send_receive([own] * len(blocks), [(b,) for b in blocks], info, what=what)


def send_receive(
    outgoing: Sequence[Sequence[torch.Tensor]],
    incoming: Sequence[Sequence[torch.Tensor]],
    info: GroupInfo,
    *,
    what: str | None = None,
    tag: int = P2P_TAG,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Direct sends: message ``i`` of ``outgoing[q]`` goes to rank ``q`` and lands in
    message ``i`` of rank ``q``'s ``incoming[rank]``, for every peer ``q`` (the entries
    at this rank's own index are ignored), every byte over one link once.

    Every operation is posted before any is awaited, one batch (``_post``), peers taken
    from the next rank up so that no rank is every rank's first destination. Message
    ``i`` travels under tag ``tag + i``, so a payload and a header to the same peer (or
    rounds given tags apart) never match each other's receive. Empty messages are
    skipped by both sides alike: every size must be known to both (a size mismatch is
    not survivable on gloo), every received message a contiguous buffer.

    On gloo the waits take the call's timeout, else the group's, explicitly: its
    point-to-point waits follow neither ``ProcessGroup.set_timeout`` nor the group's
    timeout, and a missing peer must raise ``CollectiveTimeoutError`` like a
    collective's. NCCL's waits stay asynchronous (a timed wait would block the host
    until the GPU finished); its watchdog applies the group's timeout. ``meanwhile``:
    run once every operation is posted, before any is awaited (a copy that needs no
    message, overlapped with them).
    """
    w, rank = info.world_size, info.rank
    posts: list[tuple[bool, torch.Tensor, int, int]] = []  # (sending, tensor, peer, tag)
    peers = [(rank + k) % w for k in range(1, w)]
    for sending, messages in ((False, incoming), (True, outgoing)):  # receives first
        for q in peers:
            for i, t in enumerate(messages[q]):
                if t.numel() > 0:
                    posts.append((sending, movable(t, rows=False), q, tag + i))
    if not posts:
        return
    with translate_collective_errors(what or f"send/recv x{len(posts)}", info):
        limit = None if info.backend == "nccl" else info.timeout or group_timeout(info)
        works = _post(posts, info)
        if meanwhile is not None:
            meanwhile()
        for work in works:
            if limit is None:
                work.wait()
            else:
                work.wait(limit)


def _post(posts: Sequence[tuple[bool, torch.Tensor, int, int]], info: GroupInfo) -> list[Any]:
    """Post the point-to-point operations ``(sending, tensor, group peer, tag)``, all
    before any is awaited; their works. On gloo each goes straight to the process group
    (``ProcessGroup.send`` / ``recv``), as ``dist.batch_isend_irecv`` does there (gloo
    does not coalesce) without its Python: the lookups and checks of each
    ``isend``/``irecv`` cost about 60 us of the calling thread's CPU per 6 operations (4
    ranks; a third of a 1 MiB gather's own work). Elsewhere (NCCL groups them into one
    launch) and for a simulated group, one ``dist.batch_isend_irecv``."""
    pg = gloo_group(info)
    if pg is not None:
        works = []
        for sending, t, q, tag in posts:
            t = torch.view_as_real(t) if t.is_complex() else t  # as isend / irecv do
            works.append(pg.send([t], q, tag) if sending else pg.recv([t], q, tag))
        return works
    ops = [
        dist.P2POp(
            dist.isend if sending else dist.irecv, t, group=info.group, tag=tag, group_peer=q
        )
        for sending, t, q, tag in posts
    ]
    return list(dist.batch_isend_irecv(ops))
