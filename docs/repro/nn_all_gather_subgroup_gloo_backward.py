"""torch.distributed.nn.functional.all_gather's backward raises on gloo for a subgroup
whose members are not the world's first ranks: "ValueError: Global rank 1 is not part
of group ...". Its gloo path (_AllGather.backward -> _AlltoAll.forward) calls
dist.scatter(out_tensor_list[i], to_send, i, group=group) with the group rank i as
src, which dist.scatter reads as a global rank. The forward is right; the same call on
the world group, or on the subgroup of ranks [0, 1], works. Seen with torch 2.13.0+cpu.

Run: python docs/repro/nn_all_gather_subgroup_gloo_backward.py   (three local gloo ranks,
a subgroup of ranks 0 and 2)
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.multiprocessing as mp


def main(rank: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29657")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        group = dist.new_group([0, 2])  # every rank creates it; ranks 0 and 2 gather
        if rank in (0, 2):
            x = torch.full((2,), float(rank), requires_grad=True)
            parts = dist_nn.all_gather(x, group)
            print(f"rank {rank}: forward -> {[p.tolist() for p in parts]}", flush=True)
            try:
                torch.cat(parts).sum().backward()
                print(f"rank {rank}: backward -> x.grad = {x.grad.tolist()}", flush=True)
            except ValueError as err:
                print(f"rank {rank}: backward -> ValueError: {err}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(3,), nprocs=3)
