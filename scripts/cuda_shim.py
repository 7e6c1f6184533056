"""vargather's collectives with each rank's tensor on a CUDA device: the gate's
implementation under test on a GPU machine (``scripts/cuda_check.py``).

Where it sits: a script module beside the package, never imported by it. The gate
(``python -m vargather check --op OP --impl cuda_shim:OP``, with ``scripts`` on
``PYTHONPATH``) imports it in every rank process. Each function here moves ``x`` (the
CPU tensor the gate drew) to ``DEVICE``, differentiably, so ``x``'s gradient flows back
through the copy; calls vargather's collective of the same name with every other
argument as given (tensors the gate passes as sizes go along too); checks that every
tensor that came back lies on ``DEVICE``, which a ragged collective must not change;
and returns it on the CPU, where the gate compares it bit for bit with the oracle. So
every row the gate runs (forward, gradient, misuse, subgroups, compiled steps) crosses
gloo with CUDA tensors. ``functools.wraps`` keeps vargather's signatures, so the gate
calls each function as it calls vargather's own.

``VARGATHER_SHIM_DEVICE`` names the device (default ``cuda``; ``cpu`` runs the same
code on a machine without a GPU, which only checks the wrapping).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

import vargather

DEVICE = torch.device(os.environ.get("VARGATHER_SHIM_DEVICE", "cuda"))
"""Where each rank's tensor goes: every rank of a one-GPU machine shares its device."""

__all__ = ["all_gather_list", "all_gather_v", "all_to_all_v", "reduce_scatter_v"]


def _there(value: Any) -> Any:
    """A CPU tensor moved to ``DEVICE`` (differentiably); anything else as it is (a
    tensor on another device, a meta one, stays: the misuse rows draw those)."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return value.to(DEVICE)
    return value


def _back(value: Any) -> Any:
    """What the collective returned, each tensor checked to lie on ``DEVICE`` and moved
    back to the CPU (tuples, lists and named tuples keep their kind)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != DEVICE.type:
            raise RuntimeError(
                f"returned a tensor on {value.device}, but the input was on {DEVICE}"
            )
        return value.cpu()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_back(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_back(v) for v in value)
    return value


def _on_device(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(x: Any, *args: Any, **kwargs: Any) -> Any:
        sizes = {k: _there(v) for k, v in kwargs.items() if k in ("sizes", "send_sizes")}
        return _back(fn(_there(x), *args, **{**kwargs, **sizes}))

    return call


all_gather_v = _on_device(vargather.all_gather_v)
reduce_scatter_v = _on_device(vargather.reduce_scatter_v)
all_to_all_v = _on_device(vargather.all_to_all_v)
all_gather_list = _on_device(vargather.all_gather_list)
