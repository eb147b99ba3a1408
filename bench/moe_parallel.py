#!/usr/bin/python3
"""Benchmark: expert parallelism against data parallelism for one MoE model, in one invocation.
  ptc-run 1 process x 2 threads  vs  dp=2 (2 processes x 1 thread)  vs  ep=2 (2 x 1),
  same global batch; then the all_to_all bytes per step (from explain=true) against the
  closed form 4 x (MoE layers) x E x (B / ranks) x C x h x 4 bytes per device (two
  all_to_all forward and two backward per layer, each moving the rank's dispatch buffer
  [E, B/ranks, C, h] in f32; (ep-1)/ep of it leaves the device).
Prints median step times, ratios and bytes.

usage: bench/moe_parallel.py [--bin build/bin] [--steps 20] [--experts 8 --top-k 2
       --capacity-factor 1.25] [--layers 4 --hidden 256 --heads 8 --seq 128 --batch 8]
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=20)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    a = ap.parse_args()
    a.model_args = ["--moe-experts", str(a.experts), "--moe-top-k", str(a.top_k),
                    "--moe-capacity-factor", str(a.capacity_factor)]
    with tempfile.TemporaryDirectory() as d:
        common.write_data(os.path.join(d, "data.bin"))
        ptc = lambda mesh, ranks, threads: common.ptc_step_seconds(
            a, d, f"moe-{mesh or 1}", f"mesh={mesh}" if mesh else "", ranks, threads)
        one = ptc(None, 1, 2)
        dp = ptc("dp:2", 2, 1)
        ep = ptc("ep:2", 2, 1)
        report = subprocess.run(
            [os.path.join(a.bin, "ptc-opt"), os.path.join(d, "gpt.mlir"),
             f"--ptc-compile=plan={os.path.join(d, 'x.plan')} mesh=ep:2 explain=true", "-o",
             os.devnull], check=True, capture_output=True, text=True).stdout
    a2a = [int(m) for m in re.findall(r"ptc\.all_to_all over .*?: (\d+) bytes per device", report)]
    capacity = max(1, min(a.seq, math.ceil(a.capacity_factor * a.seq * a.top_k / a.experts)))
    closed = 4 * a.layers * a.experts * (a.batch // 2) * capacity * a.hidden * 4

    print(f"config: gpt {a.layers} layers, hidden {a.hidden}, heads {a.heads}, seq {a.seq}, "
          f"global batch {a.batch}; every MLP an MoE of {a.experts} experts (4h), top-{a.top_k}, "
          f"capacity factor {a.capacity_factor} (capacity {capacity} per sequence); AdamW; "
          f"median of {a.steps} steps; 2 cores")
    print(f"ptc-run 1 process x 2 threads : {one * 1e3:8.1f} ms/step")
    print(f"ptc-run dp=2 x 1 thread       : {dp * 1e3:8.1f} ms/step  ({dp / one:.2f}x the 1-process time)")
    print(f"ptc-run ep=2 x 1 thread       : {ep * 1e3:8.1f} ms/step  ({ep / one:.2f}x the 1-process "
          f"time, {ep / dp:.2f}x dp=2)")
    total = sum(a2a)
    print(f"ep=2 all_to_all per step and device: {len(a2a)} collectives, {total} bytes "
          f"(closed form {closed}: {'equal' if total == closed else 'DIFFERENT'}); "
          f"{total // 2} bytes leave the device")
    return 0 if total == closed else 1


if __name__ == "__main__":
    sys.exit(main())
