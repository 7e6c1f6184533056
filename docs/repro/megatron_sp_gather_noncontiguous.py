"""megatron.core.tensor_parallel.mappings.gather_from_sequence_parallel_region(x, ...,
output_split_sizes=sizes) hands a non-contiguous x to torch.distributed.all_gather as
is; NCCL refuses it ("Tensors must be contiguous"). Its equal-split path, without
output_split_sizes, calls x.contiguous() first, so only the uneven (all-gather-v) path
fails. Seen with megatron-core 0.16.1 (_gather_along_first_dim, mappings.py line 150).

With two or more CUDA devices this runs on NCCL as is. Without them it runs on two CPU
gloo ranks and stands in for the two things a CPU build lacks, and nothing else: a
current device (torch.cuda.current_device() returns the CPU) and NCCL's uneven list
all_gather (one broadcast per rank), which first refuses a non-contiguous tensor as
ProcessGroupNCCL does.

Run: python docs/repro/megatron_sp_gather_noncontiguous.py
"""

import os
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

warnings.filterwarnings("ignore")  # megatron-core warns about Transformer Engine/Apex


def _nccl_like_all_gather(outputs, tensor, group=None, async_op=False):
    if not tensor.is_contiguous():
        raise RuntimeError("Tensors must be contiguous")  # ProcessGroupNCCL's check
    for src, out in enumerate(outputs):
        buf = tensor.clone() if src == dist.get_rank() else torch.empty_like(out)
        dist.broadcast(buf, src=src, group=group)
        out.copy_(buf)


def main(rank: int, world: int, gpus: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29657")
    if gpus:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world)
        device = torch.device("cuda", rank)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.cuda.current_device = lambda: torch.device("cpu")
        dist.all_gather = _nccl_like_all_gather
        device = torch.device("cpu")
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    try:
        sizes = [4, 5]
        base = torch.arange(2 * sizes[rank], dtype=torch.float32, device=device)
        x = base[::2]  # a strided view: sizes[rank] rows, not contiguous
        group = dist.group.WORLD
        out = gather_from_sequence_parallel_region(x.contiguous(), True, group, sizes)
        print(f"rank {rank}: contiguous x -> {out.tolist()}", flush=True)
        try:
            out = gather_from_sequence_parallel_region(x, True, group, sizes)
            print(f"rank {rank}: strided x -> {out.tolist()}", flush=True)
        except RuntimeError as err:
            print(f"rank {rank}: strided x -> RuntimeError: {err}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    mp.spawn(main, args=(2, gpus), nprocs=2)
