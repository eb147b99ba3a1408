#!/usr/bin/python3
"""Benchmark: pipeline parallelism on this machine, in one invocation.
  ptc-run 1 process x 2 threads (whole batch), the same with M micro-batches (gradient
  accumulation), and 2 pipeline stages (2 processes x 1 thread) with each schedule,
  against PyTorch eager at its best on the same 2 cores (one process at every intra-op x BLAS
  thread combination; same model, batches and optimizer).
Prints median step times, ratios, and each schedule's closed-form bubble: with equal stages
and two threads that scale perfectly in one process, a 2-stage pipeline of one thread per
stage takes 1 / (1 - bubble) of the 1-process time (less when one process does not scale).

usage: bench/pipeline.py [--bin build/bin] [--microbatches 4] [--steps 20] [model options]
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "test", "e2e"))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=20)
    ap.add_argument("--microbatches", type=int, default=4)
    a = ap.parse_args()
    m = a.microbatches
    with tempfile.TemporaryDirectory() as d:
        common.write_data(os.path.join(d, "data.bin"))
        ptc = lambda tag, options, ranks, threads: common.ptc_step_seconds(
            a, d, tag, options, ranks, threads)
        one = ptc("one", "", 1, 2)
        acc = ptc("acc", f"microbatches={m}", 1, 2)
        schedules = [("gpipe", "schedule=gpipe"),
                     ("1f1b", "schedule=1f1b"),
                     ("interleaved-1f1b v=2", "schedule=interleaved-1f1b virtual-stages=2"),
                     ("zb-h1", "schedule=zb-h1")]
        bubbles = {"gpipe": 1 / (m + 1), "1f1b": 1 / (m + 1), "interleaved-1f1b v=2": 1 / (2 * m + 1),
                   "zb-h1": 1 / (3 * m + 1)}
        pipe = {name: ptc(name.split()[0], f"mesh=pp:2 microbatches={m} {opts}", 2, 1)
                for name, opts in schedules}

    sweep = common.torch_thread_sweep(a, 2)
    print(f"config: layers {a.layers}, hidden {a.hidden}, heads {a.heads}, seq {a.seq}, "
          f"global batch {a.batch}, {m} micro-batches, AdamW; median of {a.steps} steps; 2 cores")
    best_name, torch_step = common.print_torch_sweep(sweep)
    print(f"PyTorch eager at its best ({best_name.split('  ', 1)[1]}): {torch_step * 1e3:8.1f} ms/step")
    print(f"ptc-run 1 process x 2 threads         : {one * 1e3:8.1f} ms/step  "
          f"({one / torch_step:.2f}x PyTorch)")
    print(f"ptc-run 1 process, {m} micro-batches    : {acc * 1e3:8.1f} ms/step  "
          f"({acc / one:.2f}x the whole-batch step)")
    for name, t in pipe.items():
        best = 1 / (1 - bubbles[name])
        print(f"ptc-run pp=2 {name:21s}: {t * 1e3:8.1f} ms/step  ({t / one:.2f}x 1 process, "
              f"{t / torch_step:.2f}x PyTorch; bubble {bubbles[name]:.3f}, expected {best:.2f}x)")


if __name__ == "__main__":
    main()
