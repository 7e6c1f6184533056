"""What the fuzz programs found, kept: every run replays these first, before it draws.

Not part of the pipeline. ``fuzz_stages.py`` replays ``STAGES`` (a target's name and
the arguments its body takes), ``fuzz_multirank.py`` replays ``MULTIRANK`` (an example
as its ``fuzz_one`` takes it), each entry with the issue or run that found it. A
finding is fixed at its root and kept in the test suite as an explicit example too;
here it guards the fuzz programs themselves (a harness change that stopped reaching it
would show as a failure here, not as silence). Hypothesis's example database
(``--db``) keeps what a run shrank on that machine only; this file travels with the
repository, so CI's smoke replays it on every push.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the test suite's NaN cases, as fuzz_multirank imports them
    sys.path.insert(0, ROOT)

from tests._nan_fns import NanCase  # noqa: E402  # needs the sys.path entry above
from vargather.testing.catalogues.reduce_scatter_v import ReduceScatterCase  # noqa: E402

NEG, POS = True, False  # a NaN's sign
Q, S = True, False  # its quiet bit


def _bf16(values: list[float], shape: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16).view(shape)


STAGES: list[tuple[str, str, tuple[Any, ...]]] = [
    (
        # Issue 36 in one process: inf + -inf folded on contiguous blocks (torch's
        # vectorized bfloat16 conversion writes 0xffff) against the oracle's strided
        # slices (the scalar one, 0x7fc0); both canonical now.
        "issue 36",
        "family_payload_layout",
        (
            (
                "reduce_scatter_v",
                [
                    _bf16([math.inf, 1.0, -0.0, 2.0, 3.0, -math.inf], (2, 3)),
                    _bf16([-math.inf, 1.0, -0.0, 2.0, math.nan, math.inf], (2, 3)),
                    _bf16([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2, 3)).t().contiguous().t(),
                ],
                (0, 1, 2),
                1,
            ),
        ),
    ),
    (
        # A fresh 8-minute run (stop 47): a one-rank world's meta tensor was accepted
        # (nothing communicates, so no device is refused) while the target's statement
        # of a valid call required the CPU in every world; the statement was wrong.
        "fuzz_stages run, 2026-12-04",
        "verdict_is_rank_independent",
        (
            [
                {
                    "x": torch.empty(0, 0, dtype=torch.bfloat16, device="meta"),
                    "dim": 0,
                    "sizes": None,
                    "contract": "sum",
                    "transport": "auto",
                    "validate": True,
                    "timeout": None,
                }
            ],
        ),
    ),
]

MULTIRANK: list[tuple[str, Any]] = [
    (
        "issue 36: reduce_scatter_v's NaN bits depended on the kernel path",
        ReduceScatterCase(
            world_size=3,
            sizes=(0, 1, 4),
            other=(2, 4),
            dim=1,
            dtype="bfloat16",
            requires_grad=False,
            special=True,
            seed=0,
            group=None,
            validate=False,
        ),
    ),
    (
        "issue 36's NaN property: torch's complex add made 0 + inf i a nan + inf i",
        NanCase(
            "all_gather_v",
            2,
            "complex64",
            (0, 1),
            1,
            0,
            values=((), (0, 0)),
            upstream=((0, 0), (0, "inf")),
        ),
    ),
    (
        "issue 36's NaN property: torch.sum's +0.0 start made -0.0 + -0.0 a +0.0",
        NanCase(
            "all_gather_v",
            2,
            "float16",
            (2, 1),
            1,
            -1,
            transport="alltoallv",
            values=((1, 2), (3,)),
            upstream=(("-0", 1, "-0"), ("-0", 2, "-0")),
        ),
    ),
    (
        "issue 36's NaN property: all_gather_list's complex mean, NaNs of both signs",
        NanCase(
            "all_gather_list",
            3,
            "complex64",
            (1, 0, 1),
            1,
            grad="mean",
            values=((1, (NEG, Q, 3)), (), ("inf", 2)),
            upstream=tuple(((NEG, Q, 7 + r), "-0", "inf", (POS, S, r + 1)) for r in range(3)),
        ),
    ),
]
