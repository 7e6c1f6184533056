"""DTensor returns a wrong tensor, with no error and on every rank, when a tensor dim
sharded over two mesh dims is gathered while a flattened view of those mesh dims exists.

The setup is the one trainers build (torchtitan's ParallelDims, FSDP2 with TP): a 2x2
world mesh with named dims and its flattened view ``mesh["a", "b"]._flatten()``, kept
alive. torch itself suggests the flattened view: without it, this redistribute warns
"2 sequential all_gather operations will be performed ... flatten mesh dimensions so
DTensor can use a single operation instead".

A tensor of 2 rows placed ``[Shard(0), Shard(0)]`` is cut as ``torch.chunk`` cuts it,
mesh dim "a" first: rows 1/0/1/0 on ranks 0-3 (rank (0, 0) holds row 0, rank (1, 0)
row 1). With the flattened view alive, ``redistribute`` to ``[Replicate(), Replicate()]``
merges the two all_gathers into one all_gather over the flattened mesh
(``_optimize_transform_infos`` in ``torch/distributed/tensor/_redistribute.py``), which
pads and unpads as if the 4 ranks held ``torch.chunk``'s flat pieces 1/1/0/0: row 1 is
lost and padding takes its place. The reduce_scatter branch of the same merge refuses an
uneven dim ("uneven_tensor_shape"); the all_gather branch has no such guard.
``full_tensor()`` takes the same path. The script redistributes the same DTensor twice:
before the flattened view exists (right, with torch's warning) and after (wrong), then
calls ``full_tensor()`` (wrong too).

Seen with torch 2.13.0 on CPU (gloo). Open fix upstream: pytorch/pytorch PR 194457
("[DTensor] Do not flatten all_gather when shard dim is not evenly divisible").

Run: python docs/repro/dtensor_flattened_uneven_all_gather.py
Prints the expected and the got tensors; exits 1 when torch is wrong, 0 when right.
Spawns its own 4 gloo ranks (FileStore rendezvous in a temporary folder, no ports).
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4


def rank_main(
    rank: int, store_path: str, results: "mp.Queue[tuple[int, str, list[float]]]"
) -> None:
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        full = torch.arange(2.0)
        x = distribute_tensor(full, mesh, [Shard(0), Shard(0)])
        results.put((rank, "local", x.to_local().tolist()))
        before = x.redistribute(mesh, [Replicate(), Replicate()]).to_local()
        results.put((rank, "before", before.tolist()))
        mesh["a", "b"]._flatten()  # the flattened view trainers build (the mesh keeps it)
        got = x.redistribute(mesh, [Replicate(), Replicate()]).to_local()
        results.put((rank, "got", got.tolist()))
        results.put((rank, "full", x.full_tensor().tolist()))
    finally:
        dist.destroy_process_group()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [
            ctx.Process(target=rank_main, args=(r, os.path.join(tmp, "store"), results))
            for r in range(WORLD)
        ]
        for p in procs:
            p.start()
        seen = {}
        for _ in range(4 * WORLD):
            rank, what, value = results.get(timeout=120)
            seen[rank, what] = value
        for p in procs:
            p.join(timeout=60)
        if any(p.exitcode != 0 for p in procs):
            print("a rank failed:", [p.exitcode for p in procs])
            return 2
    expected = torch.arange(2.0).tolist()
    print(f"torch {torch.__version__}; 2x2 mesh ('a', 'b'), then mesh['a', 'b']._flatten()")
    print("global tensor arange(2.), placements [Shard(0), Shard(0)] -> [Replicate(), Replicate()]")
    wrong = False
    for rank in range(WORLD):
        got = seen[rank, "got"]
        print(
            f"rank {rank}: local shard {seen[rank, 'local']}  expected {expected}  "
            f"got {seen[rank, 'before']} before the flattened view, {got} with it "
            f"(full_tensor(): {seen[rank, 'full']})"
        )
        wrong |= got != expected or seen[rank, "full"] != expected
    print("WRONG: torch returned a different tensor" if wrong else "right")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
