"""The public API in this process, where torch.distributed is not initialized: the
gather is the identity with gradients flowing, and bad input gets a clear error."""

from __future__ import annotations

import pytest
import torch

import vargather
from vargather import compat, oracle


@pytest.fixture(autouse=True)
def _no_process_group() -> None:
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("grad", vargather.CONTRACTS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_uninitialized_is_identity_with_gradient(grad: str, dim: int) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    out = vargather.all_gather_v(x, dim, grad=grad)  # type: ignore[arg-type]
    assert torch.equal(out, oracle.expected_output([x], dim))
    upstream = torch.randn(3, 4)
    out.backward(upstream)
    assert x.grad is not None
    want = oracle.expected_input_grads([x], [upstream], dim, grad)[0]
    assert torch.equal(x.grad, want)


@pytest.mark.parametrize("shape", [(0, 0), (3, 2)])
def test_without_a_world_every_collective_is_the_identity_on_any_device(
    shape: tuple[int, int],
) -> None:
    """Nothing communicates, so no device is refused: a meta tensor (shape inference,
    fake tensors) comes back as it went in (a fuzz finding pinned the rule)."""
    x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    n = shape[0]
    for y in (
        vargather.all_gather_v(x, 0),
        vargather.reduce_scatter_v(x, [n]),
        vargather.all_to_all_v(x, [n]),
        *vargather.all_gather_list(x),
    ):
        assert (y.device.type, y.shape, y.dtype) == ("meta", x.shape, x.dtype)


def test_layout_of_a_one_process_world() -> None:
    layout = vargather.gather_layout(torch.zeros(2, 5, 3), dim=-2)
    assert layout.sizes == (5,)
    assert layout.offsets == (0,)
    assert (layout.dim, layout.total, layout.max_size) == (1, 5, 5)
    assert (layout.leading_shape, layout.trailing_shape) == ((2,), (3,))
    assert (layout.rank, layout.world_size, layout.dtype) == (0, 1, torch.float32)


@pytest.mark.parametrize(
    ("x", "dim", "kwargs", "error", "fragment"),
    [
        (torch.tensor(1.0), 0, {}, vargather.InputShapeError, "0-d tensor"),
        ([1, 2], 0, {}, vargather.InputTypeError, "expected a torch.Tensor, got list"),
        (torch.zeros(2, 3), 2, {}, vargather.DimError, "dim=2 is out of range"),
        (torch.zeros(2, 3), -3, {}, vargather.DimError, "expected -2 <= dim < 2"),
        (torch.zeros(2, 3), 0, {"grad": "summ"}, vargather.ArgumentError, "grad must be one of"),
        (torch.zeros(2, 3), 0, {"sizes": [3]}, vargather.SizesError, "sizes[0] = 3"),
        (
            torch.zeros(2, 3),
            0,
            {"sizes": [2, 2]},
            vargather.SizesError,
            "len(sizes) == world size 1",
        ),
        (torch.zeros(2, 3), 0, {"sizes": [2.0]}, vargather.SizesTypeError, "integers"),
        (torch.zeros(2, 3), 0, {"sizes": [-2]}, vargather.SizesError, ">= 0"),
    ],
)
def test_bad_input_raises_a_named_error(
    x: object, dim: int, kwargs: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as info:
        vargather.all_gather_v(x, dim, **kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert "rank 0" in str(info.value)
    assert isinstance(info.value, vargather.VarGatherError)


def test_error_leaves_subclass_the_fitting_builtin() -> None:
    assert issubclass(vargather.DTypeMismatchError, TypeError)
    assert issubclass(vargather.ShapeMismatchError, ValueError)
    assert issubclass(vargather.DimError, IndexError)
    assert issubclass(vargather.CollectiveTimeoutError, TimeoutError)
    assert issubclass(vargather.SizesTypeError, TypeError)
    assert vargather.DTypeMismatchError.__module__ == "vargather"


def test_a_group_without_torch_distributed_is_refused() -> None:
    with pytest.raises(vargather.GroupError, match="not initialized"):
        vargather.all_gather_v(torch.zeros(2), group=object())  # type: ignore[arg-type]


def test_compat_outside_a_distributed_world_matches_the_seed() -> None:
    x = torch.randn(4, 2, requires_grad=True)
    out, sizes = compat.all_gather(x, 0, None)
    assert sizes is None  # the seed's AllGather returns (x, None) when not distributed
    assert torch.equal(out, x)
    gathered, sizes_t = compat.all_gather_variable_dim(x, 1)
    assert torch.equal(gathered, x)
    assert not gathered.requires_grad
    assert sizes_t.tolist() == [2]
    assert sizes_t.dtype == torch.long
    assert compat.exists(0)
    assert not compat.exists(None)


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_pad_dim_to(dim: int) -> None:
    t = torch.arange(6.0).reshape(2, 3)
    padded = compat.pad_dim_to(t, 5, dim)
    assert padded.shape[dim] == 5
    assert torch.equal(padded.narrow(dim, 0, t.shape[dim]), t)
    assert not padded.narrow(dim, t.shape[dim], 5 - t.shape[dim]).any()
    assert compat.pad_dim_to(t, t.shape[dim], dim) is t
