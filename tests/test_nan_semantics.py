"""NaN semantics on gloo worlds (issue 36): a reduction's NaN is its dtype's canonical
quiet NaN, data movement keeps every payload, both bit for bit against the oracle.

The property draws every rank's values and upstream gradients element by element
(``tests/_nan_fns.Atom``): NaNs of both signs, quiet and signalling, with payload bits
drawn, ``-0.0``, infinities of both signs (``inf + -inf`` makes a NaN) and small
integers (exact sums, so every result is a function of its operands alone). It runs
``reduce_scatter_v``'s forward and the backwards that sum (``all_gather_v``,
``all_gather_v_coalesced``, ``all_gather_list`` under ``sum`` and ``mean``) as well as
those that only move data (``local``, ``reduce_scatter_v``'s and ``all_to_all_v``'s),
eagerly and through the custom operators behind ``torch.compile``, and compares every
output and gradient with ``vargather.oracle`` bit for bit; a reducing result's NaNs
must moreover all be the canonical pattern.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings

from ._nan_fns import NanCase, check, nan_cases

pytestmark = pytest.mark.multirank

Q, S = True, False  # a NaN's quiet bit
NEG, POS = True, False  # its sign


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(  # issue 36's shape: bfloat16 along dim 1, inf + -inf on contiguous blocks
    NanCase(
        "reduce_scatter_v",
        3,
        "bfloat16",
        (0, 1, 2),
        2,
        1,
        values=(
            ("inf", 1, 2, "-0", 3, (NEG, Q, 5)),
            ("-inf", 1, 2, "-0", 3, 0),
            (1, (POS, S, 9), 2, "-0", "inf", "-inf"),
        ),
    )
)
@example(  # NaN payloads of both signs summed by gloo in all_gather_v's backward
    NanCase(
        "all_gather_v",
        2,
        "float32",
        (1, 2),
        2,
        0,
        transport="padded",
        values=((1, 2), (3, 4, 5, 6)),
        upstream=(
            ((NEG, Q, 77), "inf", "-0", 1, 2, 3),
            ((POS, S, 3), "-inf", "-0", (NEG, Q, 0), 5, 6),
        ),
    )
)
@example(  # the same through the custom operator, mean, float16
    NanCase(
        "all_gather_v",
        2,
        "float16",
        (2, 1),
        1,
        -1,
        grad="mean",
        transport="alltoallv",
        ops=True,
        values=((1, 2), (3,)),
        upstream=(("inf", (NEG, S, 1), "-0"), ("-inf", (POS, Q, 9), "-0")),
    )
)
@example(  # all_gather_list's mean of complex NaNs, per component
    NanCase(
        "all_gather_list",
        3,
        "complex64",
        (1, 0, 1),
        1,
        grad="mean",
        values=((1, (NEG, Q, 3)), (), ("inf", 2)),
        upstream=tuple(((NEG, Q, 7 + r), "-0", "inf", (POS, S, r + 1)) for r in range(3)),
    )
)
@example(  # data movement keeps payloads and -0.0: reduce_scatter_v's backward
    NanCase(
        "reduce_scatter_v",
        2,
        "float64",
        (1, 1),
        1,
        strided=True,
        values=((1, 2), (3, 4)),
        upstream=(((NEG, S, 5),), ("-0",)),
    )
)
@example(  # and all_to_all_v's
    NanCase(
        "all_to_all_v",
        2,
        "bfloat16",
        (0, 0),
        1,
        send=((1, 1), (0, 2)),
        ops=True,
        values=((1, 2), ((NEG, Q, 1), "-0")),
        upstream=(((POS, S, 3),), ((NEG, Q, 2), "-0", "-inf")),
    )
)
@example(  # found by the property: torch's complex add is a + (1+0i)*b, so 0 + inf i
    # gave nan + inf i in the alltoallv backward's local sum (now per component)
    NanCase(
        "all_gather_v",
        2,
        "complex64",
        (0, 1),
        1,
        0,
        values=((), (0, 0)),
        upstream=((0, 0), (0, "inf")),
    )
)
@example(  # found with it: the same sum through torch.sum lost -0.0 (its +0.0 start)
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
    )
)
@given(nan_cases())
def test_nan_results_against_the_oracle(case: NanCase) -> None:
    check(case)


@pytest.mark.parametrize("grad", ["sum", "mean"])
def test_coalesced_backward_sums_nans_canonically(grad: str) -> None:
    """Every tensor of a coalesced gather takes its own sum in the backward."""
    check(
        NanCase(
            "all_gather_v_coalesced",
            2,
            "bfloat16",
            (2, 1),
            2,
            1,
            grad=grad,
            values=((1, 2, 3, 4), (5, 6)),
            upstream=(
                ("inf", (NEG, Q, 3), "-0", 1, 2, (POS, S, 1)),
                ("-inf", (POS, Q, 1), "-0", 1, 2, 3),
            ),
        )
    )
