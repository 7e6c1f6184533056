"""vargather with CUDA tensors over gloo: one prepared run for a machine with a GPU.

Ranks share the machine's one GPU (NCCL refuses two ranks on one device), so they talk
over gloo with CUDA tensors: the metadata round stays on the CPU and the payload rides
gloo's CUDA collectives (it stages them through host memory). Two parts, both judged
by vargather's oracle, never by a tolerance:

* ``gate``: ``python -m vargather check --op OP --impl cuda_shim:OP`` for each
  collective (``--compile`` for ``all_gather_v``, the one catalogue with a compiled
  row), the four run side by side and beside the probe (``scripts/cuda_shim.py`` moves each
  rank's drawn tensor to the GPU, differentiably, calls vargather, checks the result's
  device and hands it back): every row of the gate (forward bit for bit with NaN,
  -0.0, bf16 and bool; gradients with per-rank upstream; misuse on every rank;
  subgroups; compiled steps) on CUDA tensors.
* ``probe``: a ``--ranks``-rank world (``mp.spawn``, ``FileStore`` rendezvous in a
  temporary directory) that runs what the gate's shim cannot show: results and
  gradients *stay* on the GPU (forward per dtype with special values, gradients
  with per-rank upstream, every collective, and 12 repeats of a call so its learned
  state settles); a rank whose tensor is on the CPU while its peers' are on CUDA
  (every rank must raise the same ``ArgumentMismatchError``, then the group goes on);
  each collective inside ``torch.compile(fullgraph=True)`` with arithmetic on CUDA
  around it (inductor's Triton kernels), sizes changing, an empty block on one rank,
  compared with the same step run eagerly; and the time of a gather of CUDA tensors
  beside the same gather of CPU tensors.

    python scripts/cuda_check.py --out DIR                  # on the GPU machine
    python scripts/cuda_check.py --out DIR --device cpu     # a dry run without one

Writes ``DIR/cuda-check.json`` (and each gate's JSON) and prints a summary. Exit status
0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vargather
from vargather import GradContract, oracle
from vargather.testing.asserts import bitwise_difference
from vargather.testing.values import make_upstream, make_values

OPS = ("all_gather_v", "reduce_scatter_v", "all_to_all_v", "all_gather_list")
DTYPES = (
    "float32",
    "float64",
    "bfloat16",
    "float16",
    "complex64",
    "int64",
    "int32",
    "uint8",
    "bool",
)
HERE = os.path.dirname(os.path.abspath(__file__))


# --- the gate, four collectives side by side ---------------------------------------------


def start_gates(out: str, device: str, examples: int) -> dict[str, Any]:
    """Each collective's gate against ``cuda_shim``, started side by side."""
    env = dict(os.environ, VARGATHER_SHIM_DEVICE=device)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    procs = {}
    for op in OPS:
        cmd = [
            sys.executable, "-m", "vargather", "check", "--op", op,
            "--impl", f"cuda_shim:{op}", "--no-progress",
            "--max-examples", str(examples), "--json", os.path.join(out, f"gate-{op}.json"),
        ]  # fmt: skip
        if op == "all_gather_v":  # the one catalogue with a compiled row
            cmd.append("--compile")
        log = open(os.path.join(out, f"gate-{op}.log"), "w")  # noqa: SIM115  # closed in finish_gates
        procs[op] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    return {"procs": procs, "start": time.perf_counter()}


def finish_gates(out: str, started: dict[str, Any]) -> dict[str, Any]:
    """Each gate's return code, its time since the start and the end of its log."""
    report = {}
    for op, (proc, log) in started["procs"].items():
        rc = proc.wait()
        log.close()
        report[op] = {"rc": rc, "seconds": round(time.perf_counter() - started["start"], 1)}
        with open(os.path.join(out, f"gate-{op}.log")) as f:
            report[op]["tail"] = f.read()[-1500:]
    return report


# --- the probe, on a world of CUDA ranks -------------------------------------------------


class Checks:
    """A rank's named checks: each holds, or fails with what was seen."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> None:
        try:
            problem = fn()
        except Exception as err:  # a check that raised failed, with what it raised
            problem = f"raised {type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"
        self.results.append({"check": name, "ok": problem is None, "problem": problem})


def _same_bits(
    got: torch.Tensor, want: torch.Tensor, what: str, device: torch.device
) -> str | None:
    """``None`` when ``got`` lies on ``device`` and holds ``want``'s dtype, shape and
    bytes exactly (the kit's ``bitwise_difference``, which reads any device)."""
    if got.device.type != device.type:
        return f"{what}: on {got.device}, expected {device}"
    problem = bitwise_difference(got, want)
    return None if problem is None else f"{what}: {problem}"


def _inputs(shapes: Sequence[Sequence[int]], dtype: str, seed: int) -> list[torch.Tensor]:
    """Every rank's input on the CPU (every rank builds all of them for the oracle):
    random bit patterns with special values (NaN payloads, -0.0, inf, extremes)."""
    dt = getattr(torch, dtype)
    return [make_values(s, dt, seed * 131 + r, "full") for r, s in enumerate(shapes)]


def _forward_checks(c: Checks, rank: int, w: int, device: torch.device) -> None:
    for i, dtype in enumerate(DTYPES):
        for dim in (0, 1):
            rows = [(3 * r + i) % 5 for r in range(w)]  # ragged, zeros among them
            shapes = [(n, 3) if dim == 0 else (2, n) for n in rows]
            xs = _inputs(shapes, dtype, seed=i * 2 + dim)
            x = xs[rank].to(device)

            def gather(
                dim: int = dim, x: torch.Tensor = x, xs: list[torch.Tensor] = xs
            ) -> str | None:
                got = vargather.all_gather_v(x, dim)
                return _same_bits(got, oracle.expected_output(xs, dim), "output", device)

            c.run(f"all_gather_v {dtype} dim={dim}", gather)
            send = [[(r + k + i) % 3 for k in range(w)] for r in range(w)]
            a2a_shapes = [(sum(s), 2) if dim == 0 else (2, sum(s)) for s in send]
            ys = _inputs(a2a_shapes, dtype, seed=100 + i * 2 + dim)

            def a2a(
                dim: int = dim, ys: list[torch.Tensor] = ys, send: list[list[int]] = send
            ) -> str | None:
                got = vargather.all_to_all_v(ys[rank].to(device), send[rank], dim)
                want = oracle.expected_all_to_all(ys, send, dim)[rank]
                return _same_bits(got, want, "output", device)

            c.run(f"all_to_all_v {dtype} dim={dim}", a2a)
            if dtype == "bool":
                continue  # a sum of bools is not a bool: reduce_scatter_v refuses it
            split = [(r + i) % 3 for r in range(w)]
            zs = [
                make_values((sum(split), 2) if dim == 0 else (2, sum(split)), getattr(torch, dtype), 200 + 7 * r + i, "special")
                for r in range(w)
            ]  # fmt: skip

            def rs(
                dim: int = dim, zs: list[torch.Tensor] = zs, split: list[int] = split
            ) -> str | None:
                got = vargather.reduce_scatter_v(zs[rank].to(device), split, dim)
                want = oracle.expected_reduce_scatter(zs, split, dim)[rank]
                return _same_bits(got, want, "output", device)

            c.run(f"reduce_scatter_v {dtype} dim={dim}", rs)
        list_shapes = [(r % 3, 2 + r) for r in range(w)]
        ls = _inputs(list_shapes, dtype, seed=300 + i)

        def gather_list(ls: list[torch.Tensor] = ls) -> str | None:
            got = vargather.all_gather_list(ls[rank].to(device))
            want = oracle.expected_gather_list(ls)
            for r, (g, e) in enumerate(zip(got, want, strict=True)):
                problem = _same_bits(g, e, f"output {r}", device)
                if problem:
                    return problem
            return None

        c.run(f"all_gather_list {dtype}", gather_list)


def _gradient_checks(c: Checks, rank: int, w: int, device: torch.device) -> None:
    for dtype in ("float64", "float32", "bfloat16"):
        dt = getattr(torch, dtype)
        rows = [(2 * r + 1) % 4 for r in range(w)]  # a rank with none
        xs = [
            make_values((n, 3), dt, 400 + r, "integers").requires_grad_()
            for r, n in enumerate(rows)
        ]
        up = [make_upstream((sum(rows), 3), dt, 7, j, "real") for j in range(w)]
        contracts: tuple[GradContract, ...] = ("sum", "local", "mean")
        for contract in contracts:

            def gather(
                contract: GradContract = contract,
                xs: list[torch.Tensor] = xs,
                up: list[torch.Tensor] = up,
            ) -> str | None:
                x = xs[rank].detach().to(device).requires_grad_()
                y = vargather.all_gather_v(x, 0, grad=contract)
                torch.autograd.backward(y, up[rank].to(device))
                assert x.grad is not None
                want = oracle.expected_input_grads(xs, up, 0, contract)[rank]
                return _same_bits(x.grad, want, "gradient", device)

            c.run(f"all_gather_v gradient {dtype} {contract}", gather)
        send = [[(r * 2 + k) % 3 for k in range(w)] for r in range(w)]
        ys = [
            make_values((sum(s), 2), dt, 500 + r, "integers").requires_grad_()
            for r, s in enumerate(send)
        ]
        outs = oracle.expected_all_to_all(ys, send)
        gs = [make_upstream(tuple(o.shape), dt, 8, r, "real") for r, o in enumerate(outs)]

        def a2a(
            ys: list[torch.Tensor] = ys, send: list[list[int]] = send, gs: list[torch.Tensor] = gs
        ) -> str | None:
            y = ys[rank].detach().to(device).requires_grad_()
            torch.autograd.backward(vargather.all_to_all_v(y, send[rank]), gs[rank].to(device))
            assert y.grad is not None
            want = oracle.expected_all_to_all_grads(ys, send, gs)[rank]
            return _same_bits(y.grad, want, "gradient", device)

        c.run(f"all_to_all_v gradient {dtype}", a2a)
        split = [(r + 2) % 3 for r in range(w)]
        zs = [
            make_values((sum(split), 2), dt, 600 + r, "integers").requires_grad_() for r in range(w)
        ]
        hs = [make_upstream((n, 2), dt, 9, r, "real") for r, n in enumerate(split)]

        def rs(
            zs: list[torch.Tensor] = zs, split: list[int] = split, hs: list[torch.Tensor] = hs
        ) -> str | None:
            z = zs[rank].detach().to(device).requires_grad_()
            torch.autograd.backward(vargather.reduce_scatter_v(z, split), hs[rank].to(device))
            assert z.grad is not None
            want = oracle.expected_reduce_scatter_grads(zs, split, hs)[rank]
            return _same_bits(z.grad, want, "gradient", device)

        c.run(f"reduce_scatter_v gradient {dtype}", rs)
        ls = [make_values((r % 3, 2), dt, 700 + r, "integers").requires_grad_() for r in range(w)]
        lg = [
            [make_upstream((r % 3, 2), dt, 10 + j, r, "real") for r in range(w)] for j in range(w)
        ]

        def gather_list(
            ls: list[torch.Tensor] = ls, lg: list[list[torch.Tensor]] = lg
        ) -> str | None:
            t = ls[rank].detach().to(device).requires_grad_()
            got = vargather.all_gather_list(t)
            torch.autograd.backward(got, [g.to(device) for g in lg[rank]])
            assert t.grad is not None
            want = oracle.expected_gather_list_grads(ls, lg)[rank]
            return _same_bits(t.grad, want, "gradient", device)

        c.run(f"all_gather_list gradient {dtype}", gather_list)


def _steady_checks(c: Checks, rank: int, w: int, device: torch.device) -> None:
    """A call repeated past the learned state's settling (``SHRINK_AFTER``), large
    enough for the wide rounds (blocks past 128 KiB), then once with other sizes."""
    for n in (3, 40_000):
        rows = [n + 17 * r for r in range(w)]
        xs = _inputs([(m, 4) for m in rows], "float32", seed=800 + n)
        send = [[n + 5 * ((r + k) % w) for k in range(w)] for r in range(w)]
        ys = _inputs([(sum(s), 4) for s in send], "float32", seed=900 + n)

        def repeat(
            xs: list[torch.Tensor] = xs, ys: list[torch.Tensor] = ys, send: list[list[int]] = send
        ) -> str | None:
            x, y = xs[rank].to(device), ys[rank].to(device)
            want_g = oracle.expected_output(xs, 0)
            want_a = oracle.expected_all_to_all(ys, send)[rank]
            for call in range(12):
                problem = _same_bits(
                    vargather.all_gather_v(x, 0), want_g, f"gather call {call}", device
                )
                problem = problem or _same_bits(
                    vargather.all_to_all_v(y, send[rank]), want_a, f"a2a call {call}", device
                )
                if problem:
                    return problem
            moved = [list(s) for s in send]
            for s in moved:
                s[0], s[-1] = s[0] + 1, s[-1] - 1
            got = vargather.all_to_all_v(y, moved[rank])
            return _same_bits(
                got, oracle.expected_all_to_all(ys, moved)[rank], "a2a, sizes moved", device
            )

        c.run(f"12 repeats, {n} rows a rank", repeat)


def _misuse_checks(c: Checks, rank: int, w: int, device: torch.device) -> None:
    """Rank 0's tensor on the CPU, its peers' on the GPU: every rank raises the same
    error, then the group serves a valid call."""
    for op in OPS:

        def mixed(op: str = op) -> str | None:
            on = torch.device("cpu") if rank == 0 else device
            x = torch.ones(4, 2, device=on)
            args: dict[str, tuple[Any, ...]] = {
                "all_gather_v": (), "reduce_scatter_v": ([1] * w,), "all_to_all_v": ([1] * w,),
                "all_gather_list": (),
            }  # fmt: skip
            fn = getattr(vargather, op)
            try:
                fn(x[: w if op != "all_gather_v" else 4], *args[op], timeout=30)
            except vargather.VarGatherError as err:
                message = f"{type(err).__name__}: {err}"
            else:
                return "no error raised" if device.type != "cpu" else None
            every: list[Any] = [None] * w
            dist.all_gather_object(every, message)
            if len(set(every)) != 1:
                return f"ranks raised differently: {every}"
            if "ArgumentMismatchError" not in message or "device" not in message:
                return f"unexpected error: {message}"
            after = vargather.all_gather_v(torch.full((rank,), float(rank), device=device))
            want = torch.cat([torch.full((r,), float(r)) for r in range(w)])
            return _same_bits(after, want, "the call after", device)

        c.run(f"{op}: one rank on the CPU", mixed)


def _compiled_checks(c: Checks, rank: int, w: int, device: torch.device) -> None:
    """Each collective in a ``fullgraph=True`` step with arithmetic on the GPU around it,
    sizes changing over three calls (an empty block on rank 0 in the last), against the
    same step run eagerly, bit for bit (values are integers: the arithmetic is exact)."""
    from torch._inductor import metrics

    def steps(op: str) -> Callable[..., torch.Tensor]:
        def step(
            x: torch.Tensor, s: torch.Tensor, sizes: list[int], other: list[Any]
        ) -> torch.Tensor:
            h = x * s + 1
            if op == "all_gather_v":
                y = vargather.all_gather_v(h, 0)
            elif op == "reduce_scatter_v":
                y = vargather.reduce_scatter_v(h, sizes)
            elif op == "all_to_all_v":
                y = vargather.all_to_all_v(h, sizes, recv_sizes=other)
            else:
                y = torch.cat(vargather.all_gather_list(h, shapes=other))
            return (y * 3 - 2).sum(0)

        return step

    for op in OPS:

        def compiled(op: str = op) -> str | None:
            torch._dynamo.reset()  # every rank alike: each collective's step compiles afresh
            eager = steps(op)
            fast = torch.compile(eager, fullgraph=True)
            before = metrics.generated_kernel_count
            for call in range(3):
                n = [0 if (call == 2 and r == 0) else 2 + (r + call) % 3 for r in range(w)]
                other: list[Any] = []
                if op == "reduce_scatter_v":
                    sizes, rows = n, sum(n)
                elif op == "all_to_all_v":
                    every = [
                        [0 if call == 2 and k == 0 else (r + k + call) % 3 for k in range(w)]
                        for r in range(w)
                    ]
                    sizes, other, rows = every[rank], [s[rank] for s in every], sum(every[rank])
                else:
                    sizes, rows = [], n[rank]
                    other = [(m, 4) for m in n]
                base = make_values((rows, 4), torch.float32, 1000 + call * 10 + rank, "integers")
                results = []
                for fn in (eager, fast):
                    x = base.to(device).requires_grad_()
                    s = torch.full((), 2.0, device=device, requires_grad=True)
                    y = fn(x, s, sizes, other)
                    torch.autograd.backward(y.sum())
                    assert x.grad is not None
                    assert s.grad is not None
                    results.append((y.detach(), x.grad, s.grad))
                for what, a, b in zip(
                    ("output", "x.grad", "s.grad"), results[0], results[1], strict=True
                ):
                    problem = _same_bits(b, a, f"call {call} {what}", device)
                    if problem:
                        return problem
            kernels = metrics.generated_kernel_count - before
            if device.type == "cuda" and kernels == 0:
                return "inductor generated no kernel"
            return None

        c.run(f"{op} compiled (fullgraph)", compiled)


def _timings(rank: int, w: int, device: torch.device) -> dict[str, float]:
    """Seconds a call of ``all_gather_v`` at 1 and 16 MiB in all, CUDA tensors and CPU
    tensors alternating, the slowest rank's median of 7 bursts of 5 calls."""
    out: dict[str, float] = {}
    for mib in (1, 16):
        n = mib * (1 << 20) // (4 * 64 * w)
        rows = n + (rank * n) // 4
        x_cpu = torch.ones(rows, 64)
        x_dev = x_cpu.to(device)
        times: dict[str, list[float]] = {"cuda": [], "cpu": []}
        for _ in range(8):
            for name, x in (("cuda", x_dev), ("cpu", x_cpu)):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(5):
                    vargather.all_gather_v(x, 0)
                if x.is_cuda:
                    torch.cuda.synchronize()
                took = torch.tensor([(time.perf_counter() - t0) / 5])
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                times[name].append(took.item())
        for name, ts in times.items():
            out[f"{mib} MiB {name}"] = sorted(ts[1:])[len(ts[1:]) // 2]
    return out


PROBE_PARTS = ("forward", "gradients", "steady", "misuse", "compiled", "timings")


def _rank(
    rank: int, store_path: str, w: int, device_name: str, out: str, wanted: list[str]
) -> None:
    torch.set_num_threads(1)
    # One step function per collective, each recompiled as its sizes change: past
    # dynamo's default limit (8) a rank would run the step eagerly, on its own.
    torch._dynamo.config.recompile_limit = 64
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU
    store = dist.FileStore(store_path, w)  # type: ignore[attr-defined]  # public, re-exported without "as"
    # A bounded wait: a path that hangs on CUDA tensors raises instead of using up the run.
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=w, timeout=timedelta(seconds=60)
    )
    c = Checks()
    started = time.perf_counter()
    parts: dict[str, float] = {}
    timings: dict[str, float] = {}

    def save() -> None:  # after every part: a run stopped at its limit still reports
        report = {
            "rank": rank,
            "checks": c.results,
            "seconds": parts,
            "total_seconds": round(time.perf_counter() - started, 1),
            "timings_s": timings,
        }
        with open(os.path.join(out, f"probe-rank{rank}.json"), "w") as f:
            json.dump(report, f, indent=1)

    for part, fn in (
        ("forward", _forward_checks),
        ("gradients", _gradient_checks),
        ("steady", _steady_checks),
        ("misuse", _misuse_checks),
        ("compiled", _compiled_checks),
    ):
        if part not in wanted:
            continue
        t0 = time.perf_counter()
        fn(c, rank, w, device)
        parts[part] = round(time.perf_counter() - t0, 1)
        dist.barrier()
        save()
        if rank == 0:
            failed = sum(not ch["ok"] for ch in c.results)
            print(
                f"probe {part}: {parts[part]} s, {len(c.results)} checks so far, {failed} failed",
                flush=True,
            )
    if "timings" in wanted:
        timings.update(_timings(rank, w, device))
        save()
    dist.destroy_process_group()


def run_probe(out: str, w: int, device: str, wanted: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), w, device, out, wanted), nprocs=w)  # type: ignore[attr-defined,no-untyped-call]  # torch's untyped spawn
    ranks = []
    for r in range(w):
        with open(os.path.join(out, f"probe-rank{r}.json")) as f:
            ranks.append(json.load(f))
    failed = sorted(
        {(ch["check"], ch["problem"]) for rk in ranks for ch in rk["checks"] if not ch["ok"]}
    )
    return {
        "checks": len(ranks[0]["checks"]),
        "failed": [{"check": n, "problem": p} for n, p in failed],
        "seconds": ranks[0]["seconds"],
        "timings_s": ranks[0]["timings_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--max-examples", type=int, default=10, help="per gate property")
    parser.add_argument("--parts", default="probe,gate")
    parser.add_argument("--probe-parts", default=",".join(PROBE_PARTS))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    parts = args.parts.split(",")
    report: dict[str, Any] = {"torch": torch.__version__, "vargather": vargather.__version__}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    gates = start_gates(args.out, args.device, args.max_examples) if "gate" in parts else None
    if "probe" in parts:  # beside the gates: the machine has the cores for both
        t0 = time.perf_counter()
        report["probe"] = run_probe(args.out, args.ranks, args.device, args.probe_parts.split(","))
        report["probe"]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(report["probe"], indent=1), flush=True)
    if gates is not None:
        report["gate"] = finish_gates(args.out, gates)
        for op, g in report["gate"].items():
            print(f"--- gate {op}: rc {g['rc']}, {g['seconds']} s\n{g['tail'][-700:]}", flush=True)
    with open(os.path.join(args.out, "cuda-check.json"), "w") as f:
        json.dump(report, f, indent=1)
    ok = not report.get("probe", {}).get("failed") and all(
        g["rc"] == 0 for g in report.get("gate", {}).values()
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
