#!/usr/bin/python3
"""Benchmark: context parallelism on this machine's CPU ranks, in one invocation: the bench GPT
at a long sequence (4 layers, hidden 256, 8 heads, seq 1024, batch 2) trained by one process with
2 threads, and by cp:2 (2 processes x 1 thread) with ring attention and with Ulysses; median step
times and their ratios to one rank. For the ring, where its time goes (`ptc-run --profile`: the
blocks' compute, passing and waiting for blocks, layout moves) and, run again with each transfer
completed before the step's compute (PTC_RING_SERIAL=1), how much transfer time the overlap hides.
(On CPU ranks Open MPI's shared-memory transport copies a large message when it is received, and
every core runs a rank, so little or nothing is hidden here.)

usage: bench/context_parallel.py [--bin build/bin] [--seq 1024] [--steps 8]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(here, "..", "build", "bin"))
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    b = lambda t: os.path.join(a.bin, t)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    with tempfile.TemporaryDirectory() as work:
        w = lambda f: os.path.join(work, f)
        subprocess.run([b("ptc-tokenize"), "-o", w("data.bin"), "/usr/share/common-licenses/GPL-3"],
                       check=True, capture_output=True)
        subprocess.run([b("ptc-model"), "gpt", "--layers", "4", "--hidden", "256", "--heads", "8",
                        "--seq", str(a.seq), "--vocab", "256", "--batch", str(a.batch), "-o",
                        w("gpt.mlir")], check=True)
        runs = {"one rank, 2 threads": ("", 1, 2, {}),
                "cp:2 ring, 2 x 1 thread": ("mesh=cp:2", 2, 1, {}),
                "cp:2 ring, transfers not overlapped": ("mesh=cp:2", 2, 1, {"PTC_RING_SERIAL": "1"}),
                "cp:2 ulysses, 2 x 1 thread": ("mesh=cp:2 cp-attention=ulysses", 2, 1, {})}
        times, rings = {}, {}
        ring_line = re.compile(r"ring attention \(this rank\): ([0-9.]+) ms per step .*blocks ([0-9.]+) ms, "
                               r"passing and waiting for blocks ([0-9.]+) ms \(([0-9.]+) MB")
        for name, (opts, ranks, threads, extra) in runs.items():
            plan = w("p.plan")
            subprocess.run([b("ptc-opt"), w("gpt.mlir"), f"--ptc-compile=optimizer=adamw {opts}", "-o",
                            plan], check=True)
            cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(a.steps + 2),
                   "--log-every", "0", "--threads", str(threads), "--metrics", w("m.jsonl")]
            if ranks > 1:
                cmd += ["--np", str(ranks)]
            if "ring" in name:
                cmd += ["--profile"]
            out = subprocess.run(cmd, check=True, env=dict(env, **extra), capture_output=True,
                                 text=True).stdout
            if "ring" in name:
                m = ring_line.search(out)
                rings[name] = [float(x) for x in m.groups()]
            rows = [json.loads(l) for l in open(w("m.jsonl"))][2:]
            times[name] = statistics.median(a.batch * a.seq / r["tokens_per_s"] for r in rows)
        base = times["one rank, 2 threads"]
        print(f"GPT 4 layers, hidden 256, 8 heads, seq {a.seq}, batch {a.batch}, AdamW; median of "
              f"{a.steps} steps")
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
