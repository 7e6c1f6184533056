"""NCCL emulation on gloo: torch.distributed's collectives, intercepted in a rank process.

Where it sits: in the testing kit, beside the runner. ``python -m vargather check
--emulate nccl`` (and ``repro --emulate nccl``) marks the implementation under test;
the rank runner calls ``activate("nccl")`` in every rank process before it imports or
calls that implementation, so its ``torch.distributed`` calls behave as they would on
NCCL wherever gloo differs: what NCCL accepts and gloo refuses (uneven list
``all_gather``, list ``all_to_all``, ``reduce_scatter``) is carried out by broadcasts
and all_reduce, what NCCL refuses and gloo accepts (a non-contiguous tensor, a dtype in
``NCCL_REFUSED_DTYPES``) raises NCCL's error, and CUDA-only code runs on the CPU
(``CudaOnCpu``, ``torch.cuda.current_device()``). docs/conformance.md lists what is
emulated and what is not; a name bound with ``from torch.distributed import ...``
before the emulation was installed keeps gloo's behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import torch
from torch.overrides import TorchFunctionMode

NCCL_REFUSED_DTYPES: Final = ("int16", "uint16", "uint32", "uint64")
"""torch dtypes outside NCCL's type table (torch maps bool to NCCL's uint8)."""

INTERCEPTED: Final = (
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "all_reduce",
    "broadcast",
    "reduce_scatter",
    "reduce_scatter_tensor",
)

_INSTALLED: list[bool] = []
_ACTIVE: list[bool] = [False]
_MODES: list[TorchFunctionMode] = []  # the CUDA-to-CPU mode, while it is pushed


def _is_cuda(value: object) -> bool:
    """Whether ``value`` names a CUDA device (an int is a CUDA ordinal to torch)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return isinstance(value, torch.device) and value.type == "cuda"


class CudaOnCpu(TorchFunctionMode):
    """Every CUDA device a torch call is given (``device=0``, ``device="cuda"``,
    ``"cuda:1"``, ``torch.device("cuda")``, as a keyword or as ``Tensor.to``'s positional
    argument), rewritten to the CPU; ``Tensor.cuda()`` is the identity."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: object,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):
            return args[0]
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if name == "to":
            args = [
                "cpu" if i > 0 and not isinstance(a, torch.Tensor) and _is_cuda(a) else a
                for i, a in enumerate(args)
            ]
        return func(*args, **kwargs)


def _current_device(original: Callable[[], int]) -> Callable[[], Any]:
    def current_device() -> Any:
        if _ACTIVE[0]:
            # The CPU itself, not 0: an autograd Function's backward runs without the
            # torch-function mode, where device=0 would ask for an accelerator.
            return torch.device("cpu")
        return original()

    current_device.__wrapped__ = original  # type: ignore[attr-defined]  # functools.wraps' attribute
    return current_device


def refused_dtypes(backend: str) -> tuple[str, ...]:
    """The dtype names the emulated ``backend`` refuses."""
    if backend != "nccl":
        raise ValueError(f"no emulation of {backend!r}; known: nccl")
    return NCCL_REFUSED_DTYPES


class _Done:
    """The handle of an ``async_op=True`` collective the emulation already finished."""

    def wait(self, timeout: object = None) -> bool:
        del timeout
        return True

    def is_completed(self) -> bool:
        return True


def _check(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        if not t.is_contiguous():
            raise RuntimeError("Tensors must be contiguous (NCCL emulation)")
        name = str(t.dtype).removeprefix("torch.")
        if name in NCCL_REFUSED_DTYPES:
            raise RuntimeError(
                f"Unsupported data type for NCCL process group: {name} (NCCL emulation)"
            )


def _done(async_op: bool) -> Any:
    return _Done() if async_op else None


def _install() -> None:
    """Intercept ``torch.distributed``'s collectives in this process, once; each call goes
    to the emulation while ``_ACTIVE[0]``, to gloo's own function otherwise."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    orig: dict[str, Callable[..., Any]] = {name: getattr(dist, name) for name in INTERCEPTED}

    def group_ranks(group: Any) -> list[int]:
        if group is None or group is dist.group.WORLD:
            return list(range(dist.get_world_size()))
        return list(dist.get_process_group_ranks(group))

    def all_gather(
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        _check([tensor, *tensor_list])
        if len({t.shape for t in [tensor, *tensor_list]}) == 1:
            return orig["all_gather"](tensor_list, tensor, group=group, async_op=async_op)
        me = dist.get_rank()
        for i, src in enumerate(group_ranks(group)):
            if src == me:
                tensor_list[i].copy_(tensor)
            orig["broadcast"](tensor_list[i], src=src, group=group)
        return _done(async_op)

    def all_to_all(
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        _check([*output_tensor_list, *input_tensor_list])
        ranks = group_ranks(group)
        w = len(ranks)
        me = ranks.index(dist.get_rank())
        numels = torch.tensor([t.numel() for t in input_tensor_list], dtype=torch.int64)
        table = [torch.empty_like(numels) for _ in range(w)]
        orig["all_gather"](table, numels, group=group)
        dtype = input_tensor_list[me].dtype
        for src in range(w):
            for dst in range(w):
                n = int(table[src][dst])
                if src == me:
                    buf = input_tensor_list[dst].reshape(-1).clone()
                else:
                    buf = torch.empty(n, dtype=dtype)
                orig["broadcast"](buf, src=ranks[src], group=group)
                if dst == me:
                    output_tensor_list[src].copy_(buf.view(output_tensor_list[src].shape))
        return _done(async_op)

    def reduce_scatter(
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: Any = dist.ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        _check([output, *input_list])
        me = group_ranks(group).index(dist.get_rank())
        for j, part in enumerate(input_list):
            buf = part.clone()
            orig["all_reduce"](buf, op=op, group=group)
            if j == me:
                output.copy_(buf)
        return _done(async_op)

    def reduce_scatter_tensor(
        output: torch.Tensor,
        input: torch.Tensor,  # torch's parameter name
        op: Any = dist.ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        _check([output, input])
        w = len(group_ranks(group))
        return reduce_scatter(output, list(input.chunk(w)), op=op, group=group, async_op=async_op)

    def checked(name: str) -> Callable[..., Any]:
        fn = orig[name]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tensors: list[torch.Tensor] = []
            for a in [*args, *kwargs.values()]:
                if isinstance(a, torch.Tensor):
                    tensors.append(a)
                elif isinstance(a, (list, tuple)):
                    tensors.extend(t for t in a if isinstance(t, torch.Tensor))
            _check(tensors)
            return fn(*args, **kwargs)

        wrapper.__name__ = name
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]  # functools.wraps' attribute
        return wrapper

    replacements: dict[str, Callable[..., Any]] = {
        "all_gather": all_gather,
        "all_to_all": all_to_all,
        "reduce_scatter": reduce_scatter,
        "reduce_scatter_tensor": reduce_scatter_tensor,
    }
    for name in ("all_gather_into_tensor", "all_to_all_single", "all_reduce", "broadcast"):
        replacements[name] = checked(name)
    for name, fn in replacements.items():
        dispatch = _dispatcher(fn, orig[name])
        setattr(dist, name, dispatch)
        setattr(c10d, name, dispatch)
    torch.cuda.current_device = _current_device(torch.cuda.current_device)
    _INSTALLED.append(True)


def _dispatcher(emulated: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        fn = emulated if _ACTIVE[0] else original
        return fn(*args, **kwargs)

    dispatch.__name__ = original.__name__
    dispatch.__wrapped__ = original  # type: ignore[attr-defined]  # functools.wraps' attribute
    return dispatch


def activate(backend: str | None) -> None:
    """Emulate ``backend`` from now on in this process (installing the interception on
    first use), or, with ``None``, let the intercepted collectives behave as gloo's
    again (a shared rank pool serves emulated and plain checks alike)."""
    if backend is None:
        _ACTIVE[0] = False
        if _MODES:
            _MODES.pop().__exit__(None, None, None)  # type: ignore[no-untyped-call]  # untyped in torch
        return
    refused_dtypes(backend)
    if not _INSTALLED:
        _install()
    _ACTIVE[0] = True
    if not _MODES:
        mode = CudaOnCpu()
        mode.__enter__()  # type: ignore[no-untyped-call]  # TorchFunctionMode's dunder is untyped in torch
        _MODES.append(mode)
