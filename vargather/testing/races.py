"""A failure whose ranks raced: one rank's refusal against its peers' waiting.

Where it sits: in the gate's engine, beneath ``evaluate``, which settles every failing
case's failures here before it reports them and decides how far to shrink. When one
rank raises (a backend refusing a dtype, a local check) while its peers wait for it
inside a collective, what the gate sees of the peers depends on timing (their timeout
errors, a hang, or nothing yet); that must not decide the report (issue 34: the same
seed gave a 4-rank timeout in one run and a 1-rank refusal in the other), so ``settle``
reports the refusal, the same every run. ``evaluate`` stops shrinking at a failure
where any peer waited (``is_wait``): each further attempt would wait again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .judge import Failure

WAIT_MARKS: Final = (
    "Timed out",
    "timed out",
    "Connection closed by peer",
    "Connection reset by peer",
    "CollectiveTimeoutError",
    "PeerLostError",
)
"""What a rank that waited for a peer which never came raises (gloo's timeout and
lost-connection errors, vargather's own)."""


def is_wait(failure: Failure) -> bool:
    """Whether ``failure`` is a rank waiting for a peer: a hang, or an error whose text
    is a timeout or a lost connection."""
    if failure.kind == "hang":
        return True
    if failure.kind != "error":
        return False
    text = failure.render()
    return any(mark in text for mark in WAIT_MARKS)


PEERS_WAITED: Final = (
    "its peers waited for it in the collective until they timed out (or the pool stopped "
    "waiting for them)"
)
"""What a settled failure says of the peers' waiting, whichever form it took."""


def settle(failures: Sequence[Failure]) -> list[Failure]:
    """``failures`` with the peers' waiting, when some rank raised a real error, as one
    fixed note after the real errors (the order of those kept); unchanged otherwise."""
    if not raced(failures):
        return list(failures)
    real = [f for f in failures if not is_wait(f)]
    note = Failure(real[0].aspect, "error", PEERS_WAITED, call=real[0].call)
    return [*real, note]


def raced(failures: Sequence[Failure]) -> bool:
    """Whether ``settle`` drops something from ``failures``: a real error on some rank
    while others waited."""
    real = any(f.kind == "error" and not is_wait(f) for f in failures)
    return real and any(is_wait(f) for f in failures)
