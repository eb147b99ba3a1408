#!/usr/bin/python3
"""Benchmark: context parallelism on this machine's CPU ranks, in one invocation: the bench GPT
at a long sequence (4 layers, hidden 256, 8 heads, seq 1024, batch 2) trained by one process with
2 threads, and by cp:2 (2 processes x 1 thread) with ring attention and with Ulysses; median step
times and their ratios to one rank. For the ring, where its time goes (`ptc-run --profile`: the
blocks' compute, passing and waiting for blocks, layout moves) and, run again with each transfer
completed before the step's compute (PTC_RING_SERIAL=1), how much transfer time the overlap hides.
(On CPU ranks Open MPI's shared-memory transport copies a large message when it is received, and
every core runs a rank, so little or nothing is hidden here.)

usage: bench/context_parallel.py [--bin build/bin] [--seq 1024] [--batch 2] [--steps 8]
       [--layers 4 --hidden 256 --heads 8 --vocab 256] [--model gpt|llama]
"""
import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=8)
    ap.set_defaults(seq=1024, batch=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        common.write_data(os.path.join(work, "data.bin"))
        runs = {"one rank, 2 threads": ("", 1, 2, {}),
                "cp:2 ring, 2 x 1 thread": ("mesh=cp:2", 2, 1, {}),
                "cp:2 ring, transfers not overlapped": ("mesh=cp:2", 2, 1, {"PTC_RING_SERIAL": "1"}),
                "cp:2 ulysses, 2 x 1 thread": ("mesh=cp:2 cp-attention=ulysses", 2, 1, {})}
        times, rings = {}, {}
        ring_line = re.compile(r"ring attention \(this rank\): ([0-9.]+) ms per step .*blocks ([0-9.]+) ms, "
                               r"passing and waiting for blocks ([0-9.]+) ms \(([0-9.]+) MB")
        for i, (name, (opts, ranks, threads, extra)) in enumerate(runs.items()):
            ring = "ring" in name
            times[name], out = common.ptc_run(a, work, f"run{i}", opts, ranks, threads,
                                              ["--profile"] if ring else [], extra)
            if ring:
                rings[name] = [float(x) for x in ring_line.search(out).groups()]
        base = times["one rank, 2 threads"]
        print(f"{a.model} {a.layers} layers, hidden {a.hidden}, {a.heads} heads, seq {a.seq}, "
              f"batch {a.batch}, AdamW; median of {a.steps} steps")
        for name, t in times.items():
            print(f"  {name:36s} {t * 1e3:8.1f} ms/step   {t / base:5.2f}x one rank")
        for name, (total, blocks, transfer, mb) in rings.items():
            print(f"  {name}: ring attention {total:.1f} ms/step on rank 0: blocks {blocks:.1f} ms, "
                  f"passing and waiting for blocks {transfer:.1f} ms ({mb:.1f} MB)")
        overlapped = rings["cp:2 ring, 2 x 1 thread"][2]
        serial = rings["cp:2 ring, transfers not overlapped"][2]
        print(f"  the ring's transfers: {serial:.1f} ms/step when each completes before the compute, "
              f"{overlapped:.1f} ms exposed when posted before it: {serial - overlapped:.1f} ms hidden")
        return 0


if __name__ == "__main__":
    sys.exit(main())
