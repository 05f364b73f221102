"""Data parallelism on this machine's CPU cores: one process against two, with the book's
``DataParallelHooks`` (chapter "Scaling out", chapters/scaling_out.md, "When to use it").

Each setting trains the number-words model of ``TrainConfig`` made larger (``--d-model 256``,
``--d-ff 1024``, global batches of ``--batch-size 128`` numbers as in the command), so that a step's arithmetic is large
against the exchange of its gradients: the task where two processes could pay. The settings:

- one process, one thread: the reference;
- two processes of one thread each, started by ``torchrun --standalone --nproc_per_node=2`` and joined
  by gloo, each taking half of every global batch, their gradients combined by token share;
- one process with two threads: the other way to put two cores to work.

Every setting runs in fresh processes, takes ``--warmup`` steps and then ``--steps`` timed steps of
``run_steps``: the wall time per step (the median of the timed steps) and process 0's CPU time per
step (its own work, which the load of other programs does not inflate). The settings alternate, so
that a change of load on the machine hits each; the best of ``--repeats`` counts, since interference
only ever adds time. The load average is recorded before and after: on a machine whose cores other
programs already use, two processes have no idle core to run on.

    .venv/bin/python -m benchmarks.data_parallel                 # a few minutes on 2 cores
    .venv/bin/python -m benchmarks.data_parallel --repeats 5 --steps 10

The results go to ``benchmarks/data_parallel_results.json`` (``--out``): the command, the machine, its
cores, torch's version, the date, the load, and every run (its ``last_loss`` is process 0's loss at the
last step, on its own rows: with two processes, on half of the batch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
#: (processes, threads per process), in the order they run in each repeat; the first is the reference.
SETTINGS = ((1, 1), (2, 1), (1, 2))


def time_steps(args: argparse.Namespace) -> dict | None:
    """In this process, alone or as one of torchrun's: ``args.warmup + args.steps`` training steps;
    process 0's timings (None in the other processes)."""
    import torch  # noqa: PLC0415 (the parent process needs no torch)

    from transformer.tasks.numbers import source_vocab, split_numbers, target_vocab  # noqa: PLC0415
    from transformer.tasks.numbers_fit import training_batches  # noqa: PLC0415
    from transformer.training.config import TrainConfig, make_model, make_optimizer  # noqa: PLC0415
    from transformer.training.distributed import data_parallel_options, init_distributed  # noqa: PLC0415
    from transformer.training.loop import Callback, run_settings, run_steps  # noqa: PLC0415
    from transformer.training.losses import seq2seq_loss  # noqa: PLC0415

    class Clock(Callback):
        """The wall and CPU time at the end of every step."""

        def __init__(self) -> None:
            self.wall: list[float] = [time.perf_counter()]
            self.cpu: list[float] = [time.process_time()]

        def on_step_end(self, step: int, record: dict[str, float]) -> None:
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())

    torch.set_num_threads(args.threads)
    rank, world_size, device = init_distributed("cpu")
    src_vocab, tgt_vocab = source_vocab(), target_vocab()
    total = args.warmup + args.steps
    config = TrainConfig(d_model=args.d_model, num_heads=args.num_heads, num_layers=args.num_layers,
                         d_ff=args.d_ff, batch_size=args.batch_size, steps=total, warmup=total)
    with run_settings(config.seed, None):
        model = make_model(config, src_vocab, tgt_vocab)
    parallel = data_parallel_options(rank, world_size, tgt_vocab.pad_id)
    net = parallel["wrap_model"](model) if parallel else model
    optimizer, scheduler = make_optimizer(config, model)
    numbers = split_numbers(args.batch_size * total, 0, 0, seed=config.seed)[0]
    stream = training_batches(numbers, config.batch_size, src_vocab, tgt_vocab, seed=config.seed)
    clock, history = Clock(), {}
    try:
        run_steps(net, stream, optimizer, scheduler, seq2seq_loss(config.label_smoothing, tgt_vocab.pad_id),
                  total, history, callbacks=[*parallel.get("callbacks", []), clock])
    finally:
        if world_size > 1:
            torch.distributed.destroy_process_group()
    if rank != 0:
        return None
    wall = [b - a for a, b in zip(clock.wall, clock.wall[1:])][args.warmup:]
    cpu = [b - a for a, b in zip(clock.cpu, clock.cpu[1:])][args.warmup:]
    return {"processes": world_size, "threads": torch.get_num_threads(),
            "seconds_per_step": statistics.median(wall), "cpu_seconds_per_step": statistics.median(cpu),
            "step_seconds": wall, "parameters": sum(p.numel() for p in model.parameters()),
            "last_loss": history["loss"][-1]}


def run_child(processes: int, threads: int, sizes: list[str]) -> dict:
    """One setting in fresh processes; process 0's timings."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    for name in ("WORLD_SIZE", "RANK", "MKL_NUM_THREADS"):
        env.pop(name, None)
    child = ["-m", "benchmarks.data_parallel", "--one", "--threads", str(threads), *sizes]
    launcher = ([] if processes == 1 else
                ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"])
    done = subprocess.run([sys.executable, *launcher, *child], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{processes} process(es), {threads} thread(s) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=128, help="the global batch, in numbers")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting; the best counts")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data_parallel_results.json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: time one setting
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        timings = time_steps(args)
        if timings is not None:
            print(json.dumps(timings))
        return 0
    import torch  # noqa: PLC0415

    command = "python -m benchmarks.data_parallel" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    sizes = [f"--{name}={getattr(args, name.replace('-', '_'))}"
             for name in ("d-model", "num-heads", "num-layers", "d-ff", "batch-size", "warmup", "steps")]
    load_before, uptime_before = os.getloadavg(), uptime()
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}; {uptime_before}", flush=True)
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for processes, threads in SETTINGS:
            run = run_child(processes, threads, sizes)
            runs.append({"repeat": repeat, **run})
            print(f"  repeat {repeat}, {processes} process(es) x {threads} thread(s): "
                  f"{run['seconds_per_step']:.3f} s a step, process 0's CPU {run['cpu_seconds_per_step']:.3f} s",
                  flush=True)
    load_after = os.getloadavg()

    def best(key: str) -> dict[str, float]:
        return {f"{p}x{t}": min(r[key] for r in runs if (r["processes"], r["threads"]) == (p, t))
                for p, t in SETTINGS}

    wall, cpu = best("seconds_per_step"), best("cpu_seconds_per_step")
    results = {
        "command": command,
        "machine": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_before": [round(x, 2) for x in load_before], "uptime_before": uptime_before,
        "load_average_after": [round(x, 2) for x in load_after],
        "model": {"d_model": args.d_model, "num_heads": args.num_heads, "num_layers": args.num_layers,
                  "d_ff": args.d_ff, "parameters": runs[0]["parameters"]},
        "batch_size": args.batch_size, "warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
        "settings": [f"{p}x{t}" for p, t in SETTINGS],
        "best_seconds_per_step": wall, "best_cpu_seconds_per_step": cpu,
        "speedup_two_processes": wall["1x1"] / wall["2x1"], "speedup_two_threads": wall["1x1"] / wall["1x2"],
        "runs": runs,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"best of {args.repeats}, seconds a step: one process {wall['1x1']:.3f}, two processes "
          f"{wall['2x1']:.3f} ({results['speedup_two_processes']:.2f}x), one process with two threads "
          f"{wall['1x2']:.3f} ({results['speedup_two_threads']:.2f}x); results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
