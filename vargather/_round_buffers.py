"""The one round's kept buffers: bytes in and out, memmove close-up, cutters.

Where it sits: beneath both rounds (``_fused``, ``_family``), above ``_wire`` and
``_round_state``. It owns the bytes of a round on this rank: a call's tensors into a
payload slot, the received headers or rows read where they landed, the results cut
back out, the buffers a group keeps from call to call (``Round``, ``hand_back``) and
the in-place close-up of a received buffer (``move_left``). Nothing here decides
anything: what to send and what a call's verdict is belong to the rounds.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

import torch
import torch.distributed as dist

from ._args import CallRecord
from ._layout import Layout
from ._round_state import SMALL_BYTES, Memory, group_memory, within_waste
from ._wire import HEADER_BYTES, encode_headers, header_struct


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in row-major order, as flat bytes: a view when ``t`` is
    contiguous, a copy of a strided one. Never raises (a rank that raised here would
    leave its peers waiting in the round): viewing the new size-1 last dimension, whose
    stride is 1, as bytes works for any strides, which ``t.view(uint8)`` does not."""
    # A lazily conjugated or negated view has no bytes of its own to view: resolve it
    # first (free when the bit is not set).
    resolved = t.detach().resolve_conj().resolve_neg()
    return resolved.unsqueeze(-1).view(torch.uint8).reshape(-1)


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes, one after the other."""
    if len(tensors) == 1:
        return bytes_of(tensors[0])
    return (
        torch.cat([bytes_of(t) for t in tensors]) if tensors else torch.empty(0, dtype=torch.uint8)
    )


def unpack(regions: Sequence[torch.Tensor], layouts: Sequence[Layout]) -> list[torch.Tensor]:
    """The gathered tensors from each rank's payload bytes (``regions[r]``: rank r's
    tensors' bytes one after the other). One ``cat`` per tensor, exact for any dtype."""
    device = regions[0].device if regions else torch.device("cpu")
    return _joined(layouts, tensor_parts(regions, layouts), device)


def _joined(
    layouts: Sequence[Layout], per_tensor: Sequence[list[torch.Tensor]], device: torch.device | None
) -> list[torch.Tensor]:
    """Each result from every rank's part of it (``tensor_parts``): one ``cat`` each (a
    fresh empty tensor for one without elements; ``device`` ``None``: torch's default)."""
    outputs: list[torch.Tensor] = []
    for layout, parts in zip(layouts, per_tensor, strict=True):
        if layout.pre * layout.total * layout.post == 0:
            outputs.append(torch.empty(layout.output_shape, dtype=layout.dtype, device=device))
            continue
        joined = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].clone()
        outputs.append(joined.view(layout.dtype).view(layout.output_shape))
    return outputs


def payload_views(
    buf: torch.Tensor, at: int, own: Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, bool]]:
    """Where each tensor's bytes go in the uint8 ``buf``, one after the other from
    ``at``: a view with its dtype and shape where the offset allows (typed: one copy
    whatever the strides), else flat bytes (``copy_payload``)."""
    views = []
    for t in own:
        n = t.numel() * t.element_size()
        region = buf[at : at + n]
        if at % t.element_size() == 0:
            views.append((region.view(t.dtype).view(t.shape), True))
        else:
            views.append((region, False))
        at += n
    return views


def copy_payload(views: Sequence[tuple[torch.Tensor, bool]], own: Sequence[torch.Tensor]) -> None:
    """Each tensor of ``own`` into its ``payload_views`` view: the bytes ``pack`` gives."""
    for t, (view, typed) in zip(own, views, strict=True):
        if typed:
            view.copy_(t.detach() if t.requires_grad else t)
        else:
            view.copy_(bytes_of(t))


def header_bytes(slots: int, records: Sequence[CallRecord], k: int, flags: int) -> torch.Tensor:
    """``slots`` compact headers (``_wire``) as bytes: ``records`` and unused slots."""
    words = encode_headers(slots, records, k, flags)
    return torch.frombuffer(bytearray(header_struct(slots).pack(*words)), dtype=torch.uint8)


def read_headers(buf: torch.Tensor, at: Sequence[int], slots: int) -> tuple[tuple[int, ...], ...]:
    """Every rank's ``slots`` compact headers as int64 words, from the bytes of ``buf``
    at ``at[r]``: on the CPU read with ``struct`` where they landed, elsewhere copied to
    the host together."""
    fmt = header_struct(slots)
    if buf.device.type == "cpu":
        raw = _char_array(buf.numel()).from_address(buf.data_ptr())
        return tuple(fmt.unpack_from(raw, a) for a in at)
    head = slots * HEADER_BYTES
    words = torch.cat([buf[a : a + head] for a in at]).cpu().view(torch.int64)
    return tuple(tuple(row) for row in words.view(len(at), -1).tolist())


def landed_bytes(buf: torch.Tensor, at: Sequence[int], length: int) -> bytes:
    """The ``length`` bytes at each of ``at`` in the flat uint8 ``buf``, one after the
    other: every rank's received rows or headers (read where they landed on the CPU,
    else copied to the host together)."""
    if buf.device.type == "cpu":
        base = buf.data_ptr()
        return b"".join(ctypes.string_at(base + a, length) for a in at)
    host = torch.cat([buf[a : a + length] for a in at]).cpu()
    return ctypes.string_at(host.data_ptr(), host.numel())


@functools.lru_cache(maxsize=16)
def _char_array(n: int) -> type[ctypes.Array[ctypes.c_char]]:
    """The ctypes type of ``n`` bytes (made once per size: a type is costly to make)."""
    return ctypes.c_char * n


MOVE_CHUNK: Final = 1 << 20
"""Bytes moved at a time when the wide round compacts its buffer in place."""


def move_left(buf: torch.Tensor, dst: int, src: int, n: int) -> None:
    """``buf[dst : dst + n] = buf[src : src + n]`` for ``dst < src`` (ranges may
    overlap): one ``memmove`` on the CPU, else ``move_chunked``."""
    if buf.device.type == "cpu" and buf.is_contiguous():
        base = buf.data_ptr()
        ctypes.memmove(base + dst, base + src, n)
        return
    move_chunked(buf, dst, src, n)


def move_chunked(buf: torch.Tensor, dst: int, src: int, n: int) -> None:
    """``move_left`` with tensor copies: chunk by chunk, each through a copy of at most
    ``MOVE_CHUNK`` bytes when the chunk overlaps its destination; a write never reaches
    bytes not yet moved."""
    gap = src - dst
    at = 0
    while at < n:
        m = min(n - at, max(gap, MOVE_CHUNK))
        piece = buf[src + at : src + at + m]
        if m > gap:  # overlapping: through a temporary
            m = min(m, MOVE_CHUNK)
            piece = buf[src + at : src + at + m].clone()
        buf[dst + at : dst + at + m].copy_(piece)
        at += m


_KEPT_BUFFERS: Final = 2
"""Buffers kept per group and purpose. Two, not one: gloo's worker thread lets go of a
collective's tensors a moment after ``wait()`` returns, so the last call's buffer is
often still held when the next call starts (measured at 4 ranks, calls back to back:
in a quarter to a third of the calls); the one before it is free by then."""


_KEPT_LOCK: Final = threading.Lock()


KEEP_MIN: Final = 64 << 10
"""Buffers smaller than this are made fresh every call and never kept: the allocator
serves them from its heap, without page faults, for less than the cache's bookkeeping
(about 8 us a call for the pair of calls, 2 for ``torch.empty``)."""


def handed_back_buffer(
    pg: dist.ProcessGroup | None, purpose: str, size: int, device: torch.device
) -> torch.Tensor:
    """A buffer of ``size`` bytes for a round whose result is a view of it: one of the
    group's last ``_KEPT_BUFFERS`` when it is this size and its result is gone
    (``unreferenced``: no tensor, view, saved tensor or ``numpy()`` array holds it, nor
    gloo for a moment after a collective), else a fresh one (kept for the next calls).
    CPU only (another device's memory may still be in use by a stream).

    Why: a fresh buffer of a few MiB is often fresh pages, about one page fault per 4
    KiB touched: 1,000 for 4 MB, measured at 1-3 ms a call when other allocations come
    between two calls, as much as the collective. The group holds at most twice the
    last large result's size between calls, less what the caller still holds of them.
    """
    if pg is None or device.type != "cpu" or size < KEEP_MIN:
        return torch.empty(size, dtype=torch.uint8, device=device)
    kept = group_memory(pg).handed.get(purpose) or []
    with _KEPT_LOCK:  # taken out until handed back: another thread makes its own
        for i, buf in enumerate(kept):
            if buf.numel() == size and unreferenced(buf):
                return kept.pop(i)
    return torch.empty(size, dtype=torch.uint8)


def hand_back(pg: dist.ProcessGroup | None, purpose: str, buf: torch.Tensor) -> None:
    """Keep ``buf`` for ``handed_back_buffer`` after the round that received into it."""
    if pg is not None and buf.device.type == "cpu" and buf.numel() >= KEEP_MIN:
        with _KEPT_LOCK:
            kept = group_memory(pg).handed.setdefault(purpose, [])
            kept.insert(0, buf)
            del kept[_KEPT_BUFFERS:]


def unreferenced(buf: torch.Tensor) -> bool:
    """Whether nothing but ``buf`` itself holds its storage (no result, no view)."""
    storage = buf.untyped_storage()
    # ``storage`` is one reference of its own, ``buf`` the other (torch's private count
    # of the storage's owners; ``test_fused`` checks it against views and saved tensors).
    return torch._C._storage_Use_Count(storage._cdata) <= 2


Cut = Callable[[tuple[Layout, ...], tuple[int, ...]], list[torch.Tensor]]


def region_cutter(buf: torch.Tensor, starts: Sequence[int]) -> Cut:
    """The results from one rank-major payload buffer whose region r (rank r's slot)
    starts at ``starts[r]``."""

    def cut(layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
        w = len(needs)
        if len(layouts) == 1 and layouts[0].pre == 1:
            # One tensor whose blocks are adjacent in the result: compact in place
            # (nothing moves when every slot was a rank's exact need); the result is a
            # view of the received buffer, no second buffer.
            return [closed_up(buf, closing(tuple(starts), needs), layouts[0])]
        return unpack([buf[starts[r] : starts[r] + needs[r]] for r in range(w)], layouts)

    return cut


class Closing(NamedTuple):
    """How a buffer whose region ``r`` starts at ``starts[r]`` is closed up in place
    so its first ``length`` bytes are region ``r``'s first ``needs[r]`` bytes, one after
    the other: ``moves`` (``move_left``'s destination, source and length, in order)."""

    moves: tuple[tuple[int, int, int], ...]
    length: int


@functools.lru_cache(maxsize=64)
def closing(starts: tuple[int, ...], needs: tuple[int, ...]) -> Closing:
    """The ``Closing`` of regions at ``starts`` holding ``needs`` bytes (remembered: a
    steady round closes up the same way every call)."""
    moves, at = [], 0
    for start, n in zip(starts, needs, strict=False):
        if start != at and n:
            moves.append((at, start, n))
        at += n
    return Closing(tuple(moves), at)


def closed_up(buf: torch.Tensor, how: Closing, layout: Layout) -> torch.Tensor:
    """``buf`` closed up in place (``how``) and viewed as ``layout``'s result (a fresh
    empty tensor when it has no elements)."""
    for dst, src, n in how.moves:
        move_left(buf, dst, src, n)
    if layout.total == 0:
        return torch.empty(layout.output_shape, dtype=layout.dtype, device=buf.device)
    shape = layout.output_shape
    whole = buf if buf.numel() % layout.dtype.itemsize == 0 else buf[: how.length]
    return whole.view(layout.dtype).as_strided(shape, row_major_strides(shape))


@functools.lru_cache(maxsize=64)
def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides torch gives a contiguous tensor of ``shape`` (a 0 size counts as 1)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


_ZEROS: Final = bytes(SMALL_BYTES)


_KEEP_RECV_MAX: Final = 512 << 10
"""Past this many bytes received (``W x block``) a round whose one result's rank blocks
are adjacent receives into a fresh buffer that becomes the result (``Round``)."""


_REUSE_MAX_BYTES: Final = 4 << 20
"""The largest receive buffer (``W x block`` bytes) a group keeps between calls."""


class Round:
    """One group's send buffer (and, for a small round, its receive buffer) for the
    round of one collective, kept from call to call (CPU only): the headers rewritten
    only when they change, the payload copied into its slot in one copy per tensor (a
    ``memmove`` of a ``plain`` tensor's bytes, else a typed view's ``copy_``), the
    bytes that must be zero cleared only where an earlier payload left others.

    A round of at most ``_KEEP_RECV_MAX`` received bytes keeps its receive buffer (a
    ``bytearray``) and cuts every result out of it as a fresh tensor (``cut``): nothing
    returned aliases the kept buffers. A larger round receives into a buffer of its own
    per call (``receive``) and, for one tensor whose rank blocks are adjacent (``pre ==
    1``), closes it up in place and returns a view of it (``cutter``): keeping the
    buffer and copying out of it made a 1 MiB call's working set outgrow this machine's
    2 MiB L2, the copy-out alone 4x the 512 KiB one's (``docs/performance.md``). The
    result then holds the whole receive buffer, at most ``1 + WASTE_LIMIT`` times its
    bytes plus the headers (else it is cut out as from a kept buffer).

    ``lock`` keeps a second thread on the same group (already a misuse) from sharing
    the kept buffers: it takes fresh ones."""

    def __init__(self, world: int, slots: int, capacity: int) -> None:
        self.key = (world, slots, capacity)
        self.world = world
        self.head = slots * HEADER_BYTES
        self.block = self.head + capacity
        self.fmt = header_struct(slots)
        self.header_at = [r * self.block for r in range(world)]  # where each rank's headers land
        self.raw_send = bytearray(self.block)
        self.send = torch.frombuffer(self.raw_send, dtype=torch.uint8)
        self.send_at = self.send.data_ptr() + self.head  # the payload slot's address
        self.payload_at: list[int] = []  # where each rank's payload lands in ``recv``
        self.raw_recv = bytearray()  # the kept receive buffer, made at its first use
        self.recv: torch.Tensor | None = None
        self.payloads: Sequence[torch.Tensor] = ()
        self.slots = slots
        self.lock = threading.Lock()
        self.header_key: object = None  # what the headers in ``send`` encode
        self.slot_key: object = None  # the records the payload views are cut for
        self.slot_views: list[tuple[torch.Tensor, bool]] = []
        self.dirty = 0  # payload bytes of ``send`` that may be non-zero
        self.cut_key: object = None  # the layouts the output views are cut for
        self.cut_parts: list[list[torch.Tensor]] = []

    def fill(
        self,
        header_key: tuple[tuple[CallRecord, ...], int, int],
        own: Sequence[torch.Tensor],
        nbytes: int,
    ) -> None:
        """Headers (when changed), this rank's payload and zeros into ``send``."""
        records, k, flags = header_key
        if header_key != self.header_key:
            self.fmt.pack_into(self.raw_send, 0, *encode_headers(self.slots, records, k, flags))
            self.header_key = header_key
        filled = 0
        if own and all(plain(t) for t in own):
            at = self.send_at
            for t in own:  # each tensor's bytes as they lie, one ``memmove`` (no views)
                n = t.numel() * t.element_size()
                if n:
                    ctypes.memmove(at, t.data_ptr(), n)
                at += n
            filled = nbytes
        elif own:
            # The tensors' shapes too: ``_fused.exchange``'s ``parts`` need not be the
            # tensors the records describe.
            slot_key = (records, [t.shape for t in own])
            if slot_key != self.slot_key:
                self.slot_views = payload_views(self.send, self.head, own)
                self.slot_key = slot_key
            copy_payload(self.slot_views, own)
            filled = nbytes
        if self.dirty > filled:  # no stale memory to the peers
            lo, hi = self.head + filled, self.head + self.dirty
            if hi - lo <= len(_ZEROS):
                self.raw_send[lo:hi] = _ZEROS[: hi - lo]
            else:
                self.send[lo:hi].zero_()
        self.dirty = filled

    def receive(self, adjacent: bool, pg: dist.ProcessGroup | None) -> torch.Tensor:
        """The buffer this call's round receives into: one of its own (handed back, or
        fresh) for a large round whose one result's rank blocks are ``adjacent`` (it
        becomes the result) or one too large to keep, else the kept one. ``pg`` is
        passed, not kept: ``MEMORY`` is weakly keyed by it."""
        size = self.world * self.block
        if (adjacent and size > _KEEP_RECV_MAX) or size > _REUSE_MAX_BYTES:
            return handed_back_buffer(pg, "gather", size, torch.device("cpu"))
        if self.recv is None:
            self.raw_recv = bytearray(size)
            self.recv = torch.frombuffer(self.raw_recv, dtype=torch.uint8)
            self.payloads = self.recv.view(self.world, self.block)[:, self.head :].unbind(0)
            base = self.recv.data_ptr()
            self.payload_at = [base + r * self.block + self.head for r in range(self.world)]
        return self.recv

    def rows(self, recv: torch.Tensor) -> tuple[tuple[int, ...], ...]:
        """Every rank's received headers in ``recv`` as int64 words (``read_headers``)."""
        return read_headers(recv, self.header_at, self.slots)

    def cutter(self, recv: torch.Tensor) -> Cut:
        """How this call's results are cut out of ``recv`` (``receive``'s buffer)."""
        if recv is self.recv:
            return self.cut

        starts = [r * self.block + self.head for r in range(self.world)]
        in_place = region_cutter(recv, starts)  # the wide round's: closed up in place, or unpacked

        def cut(layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
            if not within_waste(recv.numel() - self.world * self.head, sum(needs)):
                # Too much padding to hand back with the result: cut it out.
                return unpack(
                    [recv[a : a + n] for a, n in zip(starts, needs, strict=True)], layouts
                )
            return in_place(layouts, needs)

        return cut

    def cut(self, layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
        """The results, fresh tensors, from the kept receive buffer (``unpack``'s values)."""
        if all(lay.pre == 1 for lay in layouts):
            return _copied_out(self.payload_at, layouts)
        if layouts is not self.cut_key:
            self.cut_parts = tensor_parts(self.payloads, layouts)
            self.cut_key = layouts
        return _joined(layouts, self.cut_parts, None)


def plain(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes, in row-major order, are the ``numel * element_size`` bytes
    at ``t.data_ptr()`` on the CPU (no subclass, no lazy bit, contiguous)."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    )


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for two uint8 ranges of the same length: one ``memmove`` on the
    CPU (both ``plain``), never torch's ``copy_`` there, which splits a large copy over
    the intra-op threads that, beside the peers' ranks on the same cores, wait for one
    another (measured at 16 MiB on 4 ranks of a 2-core machine: ``all_to_all_v``'s
    steady call 4-5x one ``all_to_all_single`` with ``copy_``, 0.9x by ``memmove``)."""
    if plain(dst) and plain(src):
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
    else:
        dst.copy_(src)


def plain_bytes(t: torch.Tensor) -> torch.Tensor:
    """A ``plain`` tensor's bytes as they lie, a flat uint8 view (``bytes_of`` without
    its handling of strides and lazy bits, which a plain tensor has none of: a few
    microseconds less on the paths that call it every call)."""
    flat = t.detach().view(-1)
    if flat.stride(0) != 1:  # an empty or one-element tensor is contiguous at any stride
        flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8)


def plain_in_blocks(x: object, dim: object) -> bool:
    """Whether ``x`` is a plain strided tensor (``plain``, no ``Parameter``) whose blocks
    along ``dim`` lie one after the other in its bytes: ``dim`` an int in range with no
    dimension before it but 1s. What the steady paths replay a call's payload from."""
    if type(x) is not torch.Tensor or type(dim) is not int:
        return False
    if x.layout != torch.strided or x.is_nested or not -x.ndim <= dim < x.ndim:
        return False
    return plain(x) and all(n == 1 for n in x.shape[: dim % x.ndim])


def _copied_out(at: Sequence[int], layouts: Sequence[Layout]) -> list[torch.Tensor]:
    """The results of a round on the CPU whose rank r's payload starts at address
    ``at[r]``, for layouts whose rank blocks are adjacent (``pre == 1``): each a fresh
    tensor filled by one ``memmove`` per rank, cutting no views (``tensor_parts`` would
    make 2 W of them per tensor, each a few microseconds of dispatch)."""
    src = list(at)
    outputs = []
    for lay in layouts:
        out = torch.empty(lay.output_shape, dtype=lay.dtype)
        dst = out.data_ptr()
        row = lay.row_bytes
        for r, n in enumerate(lay.sizes):
            nbytes = n * row
            if nbytes:
                ctypes.memmove(dst, src[r], nbytes)
                dst += nbytes
                src[r] += nbytes
        outputs.append(out)
    return outputs


def tensor_parts(
    payloads: Sequence[torch.Tensor], layouts: Sequence[Layout]
) -> list[list[torch.Tensor]]:
    """Per tensor, every rank's bytes of it as a ``(pre, n_r * row)`` view."""
    offsets = [0] * len(payloads)
    found = []
    for layout in layouts:
        row = layout.row_bytes
        parts = []
        for r, region in enumerate(payloads):
            n = layout.pre * layout.sizes[r] * row
            parts.append(
                region[offsets[r] : offsets[r] + n].view(layout.pre, layout.sizes[r] * row)
            )
            offsets[r] += n
        found.append(parts)
    return found


def round_for(
    mem: Memory | None, world: int, slots: int, capacity: int, device: torch.device
) -> Round | None:
    """The collective's kept buffers (``mem.round``) for a round of this size (made or
    remade), or ``None`` (no group, another device, another thread's round)."""
    if mem is None or device.type != "cpu":
        return None
    rnd = mem.round
    if not isinstance(rnd, Round) or rnd.key != (world, slots, capacity):
        if isinstance(rnd, Round) and rnd.lock.locked():
            return None  # another thread's round: leave it to it
        rnd = mem.round = Round(world, slots, capacity)
    return rnd
