"""Megatron-core's uneven sequence-parallel paths hand a non-contiguous input to
torch.distributed as it is; their equal-split paths call input_.contiguous() first.
Seen with megatron-core 0.16.1 (megatron/core/tensor_parallel/mappings.py):

* gather_from_sequence_parallel_region(x, True, group, output_split_sizes=sizes)
  (_gather_along_first_dim, line 150) gives the strided x to
  torch.distributed.all_gather, which NCCL refuses ("Tensors must be contiguous").
* reduce_scatter_to_sequence_parallel_region(x, group, input_split_sizes=sizes)
  (_reduce_scatter_along_first_dim, lines 185-193) splits the strided x and gives the
  strided pieces to torch.distributed.reduce_scatter. What NCCL does with them was not
  run here (no two GPUs): torch 2.13's ProcessGroupNCCL sends unequal pieces through
  _reduce_oop, one ncclReduce over input.numel() elements from input.data_ptr(), and
  that path has no contiguity check in its source. vargather's NCCL emulation refuses
  such a piece as NCCL's all_gather does.

With two or more CUDA devices this runs on NCCL as is. Without them it runs on two CPU
gloo ranks and stands in for what a CPU build lacks, and nothing else: a current device
(torch.cuda.current_device() returns the CPU); NCCL's uneven list all_gather (one
broadcast per rank), which first refuses a non-contiguous tensor as ProcessGroupNCCL
does; and reduce_scatter / reduce_scatter_tensor (an all_reduce of contiguous copies),
which record whether the tensors Megatron handed them were contiguous.

Run: python docs/repro/megatron_sp_noncontiguous.py
"""

import os
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

warnings.filterwarnings("ignore")  # megatron-core warns about Transformer Engine/Apex

SEEN: list[str] = []


def _nccl_like_all_gather(outputs, tensor, group=None, async_op=False):
    if not tensor.is_contiguous():
        raise RuntimeError("Tensors must be contiguous")  # ProcessGroupNCCL's check
    for src, out in enumerate(outputs):
        buf = tensor.clone() if src == dist.get_rank() else torch.empty_like(out)
        dist.broadcast(buf, src=src, group=group)
        out.copy_(buf)


def _reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    SEEN.append(f"reduce_scatter pieces contiguous: {[p.is_contiguous() for p in input_list]}")
    summed = torch.cat([p.contiguous() for p in input_list])
    dist.all_reduce(summed, group=group)
    start = sum(p.shape[0] for p in input_list[: dist.get_rank(group)])
    output.copy_(summed[start : start + output.shape[0]])


def _reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    SEEN.append(f"reduce_scatter_tensor input contiguous: {input.is_contiguous()}")
    summed = input.contiguous().clone()
    dist.all_reduce(summed, group=group)
    n, rank = output.shape[0], dist.get_rank(group)
    output.copy_(summed[rank * n : (rank + 1) * n])


def _show(rank: int, what: str, call) -> None:
    SEEN.clear()
    try:
        got = call().tolist()
    except RuntimeError as err:
        got = f"RuntimeError: {err}"
    print(f"rank {rank}: {what} -> {got}  {'; '.join(SEEN)}", flush=True)


def main(rank: int, world: int, gpus: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29657")
    if gpus:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world)
        device = torch.device("cuda", rank)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.cuda.current_device = lambda: torch.device("cpu")
        device = torch.device("cpu")
    from megatron.core.tensor_parallel import mappings

    if not gpus:
        dist.all_gather = _nccl_like_all_gather
        dist.reduce_scatter = _reduce_scatter
        mappings.dist_reduce_scatter_func = _reduce_scatter_tensor
    group = dist.group.WORLD
    try:
        print("-- gather_from_sequence_parallel_region, sizes [4, 5]", flush=True)
        sizes = [4, 5]
        base = torch.arange(2 * sizes[rank], dtype=torch.float32, device=device)
        x = base[::2]  # a strided view: sizes[rank] rows, not contiguous
        gather = mappings.gather_from_sequence_parallel_region
        _show(rank, "contiguous x", lambda: gather(x.contiguous(), True, group, sizes))
        _show(rank, "strided x", lambda: gather(x, True, group, sizes))

        print("-- reduce_scatter_to_sequence_parallel_region, x a transposed (6, 2)", flush=True)
        y = torch.arange(12, dtype=torch.float32, device=device).reshape(2, 6).t()
        scatter = mappings.reduce_scatter_to_sequence_parallel_region
        _show(rank, "equal split", lambda: scatter(y, group, None))
        _show(rank, "input_split_sizes=[2, 4]", lambda: scatter(y, group, [2, 4]))
        print(f"rank {rank}: expected rows of {(2 * y).tolist()}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    mp.spawn(main, args=(2, gpus), nprocs=2)
