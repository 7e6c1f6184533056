"""``scripts/cuda_shim.py``, the gate's implementation on a GPU machine, checked here
without one: it keeps vargather's signatures (the gate picks its call from them),
moves CPU tensors only, refuses a result off its device, and hands back what
vargather returned, in kind."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest
import torch

import vargather

from ._by_path import import_path

SHIM = Path(__file__).resolve().parents[1] / "scripts" / "cuda_shim.py"


@pytest.fixture
def shim(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("VARGATHER_SHIM_DEVICE", "cpu")
    return import_path("cuda_shim", SHIM)


@pytest.mark.parametrize(
    "name", ["all_gather_v", "reduce_scatter_v", "all_to_all_v", "all_gather_list"]
)
def test_each_function_keeps_vargathers_signature(shim: ModuleType, name: str) -> None:
    assert inspect.signature(getattr(shim, name)) == inspect.signature(getattr(vargather, name))


def test_only_cpu_tensors_move_and_a_result_off_the_device_is_refused(
    shim: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shim, "DEVICE", torch.device("meta"))
    assert shim._there(torch.ones(2)).device.type == "meta"
    assert shim._there([1, 2]) == [1, 2]
    with pytest.raises(RuntimeError, match="returned a tensor on cpu, but the input was on meta"):
        shim._back(torch.ones(2))
    monkeypatch.setattr(shim, "DEVICE", torch.device("cpu"))
    result = vargather.AllToAllResult(torch.ones(2), None, (2,))  # type: ignore[arg-type]  # no layout needed here
    back = shim._back(result)
    assert type(back) is vargather.AllToAllResult
    assert back.send_sizes == (2,)
    assert isinstance(shim._back([torch.ones(1), torch.ones(2)]), list)


def test_a_call_without_a_world_is_the_identity_with_its_gradient(shim: ModuleType) -> None:
    x = torch.arange(6.0).reshape(3, 2).requires_grad_()
    y = shim.all_gather_v(x, 0, sizes=torch.tensor([3]))
    assert torch.equal(y, x.detach())
    torch.autograd.backward(y, torch.full((3, 2), 2.0))
    assert x.grad is not None
    assert torch.equal(x.grad, torch.full((3, 2), 2.0))
    assert [t.shape for t in shim.all_gather_list(x)] == [(3, 2)]
