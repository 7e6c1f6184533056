"""Imported by the forkserver the suite's worlds fork from (``conftest``, through
``vargather.testing.pool.preload``): compiles and runs one tiny training step on
aot_eager and on inductor, so that every rank forked afterwards starts with the compile
stack's one-time setup done (lazy imports, caches, inductor's first C++ kernel) instead
of paying it in each rank: the suite's compile tests take 41 s instead of 57 s alone.
Not the kit's: a short ``check`` run forks too few compiling ranks to repay the ~5 s of
CPU it costs a server (measured: 20 s more CPU over the suite's gate tests)."""

from __future__ import annotations

import torch
import torch._dynamo

from vargather.testing.rank_side import set_inductor_rank_defaults

set_inductor_rank_defaults()


def _warm() -> None:
    # one thread, as in every rank: no OpenMP team exists in the server a rank forks
    # from, and inductor's kernels are generated for the ranks' one thread
    torch.set_num_threads(1)
    for backend in ("aot_eager", "inductor"):
        step = torch.compile(lambda t: (t * 2).sum(), backend=backend, fullgraph=True)
        step(torch.ones(3, requires_grad=True)).backward()
    torch._dynamo.reset()


_warm()
