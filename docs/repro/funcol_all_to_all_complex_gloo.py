"""torch.distributed._functional_collectives.all_to_all_single(_autograd) raises
"RuntimeError: Invalid scalar type" for a complex tensor on gloo, where
torch.distributed.all_to_all_single, called with the same arguments, returns the
right result (it hands gloo a real view of the complex tensor; the functional form
hands gloo the complex tensor as is). Seen with torch 2.13.0+cpu.

Run: python docs/repro/funcol_all_to_all_complex_gloo.py   (two local gloo ranks)
"""

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp


def main(rank: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29655")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x = torch.full((2,), complex(rank, -rank), dtype=torch.complex64)
        out = torch.empty(2, dtype=torch.complex64)
        dist.all_to_all_single(out, x, [1, 1], [1, 1])
        print(f"rank {rank}: dist.all_to_all_single -> {out.tolist()}", flush=True)
        try:
            y = funcol.all_to_all_single_autograd(x, [1, 1], [1, 1], dist.group.WORLD)
            print(f"rank {rank}: funcol -> {y.wait().tolist()}", flush=True)
        except RuntimeError as err:
            print(f"rank {rank}: funcol -> RuntimeError: {err}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
