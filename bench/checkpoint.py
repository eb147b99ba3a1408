#!/usr/bin/python3
"""Benchmark: what distributed checkpoints cost on the bench config (4 layers, hidden 256,
8 heads, seq 128, batch 8, vocab 256, AdamW): checkpoint size, the time one takes (sync and
async: the time training waits), and the median step time with a checkpoint every 10 steps
against none, on one process and on dp=2 (one rank per core), measured together.

usage: bench/checkpoint.py [--bin build/bin] [--steps 40] [--every 10]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=40)
    ap.add_argument("--every", type=int, default=10)
    a = ap.parse_args()
    b = lambda t: os.path.join(a.bin, t)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    print(f"config: {a.model}, layers {a.layers}, hidden {a.hidden}, heads {a.heads}, seq {a.seq}, "
          f"batch {a.batch}, vocab {a.vocab}, AdamW; {a.steps} steps, a checkpoint every {a.every}")
    with tempfile.TemporaryDirectory() as d:
        w = lambda n: os.path.join(d, n)
        common.write_data(w("data.bin"))
        for layout, ranks, threads in (("", 1, 2), ("mesh=dp:2", 2, 1)):
            plan = w("p.plan")
            common.compile_gpt(a, d, plan, "optimizer=adamw lr=1e-3 " + layout)
            results = {}
            for mode in ("none", "sync", "async"):
                ck = w(f"ck-{mode}")
                shutil.rmtree(ck, ignore_errors=True)
                cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(a.steps),
                       "--log-every", "0", "--threads", str(threads), "--metrics", w("m.jsonl")]
                if ranks > 1:
                    cmd += ["--np", str(ranks)]
                if mode != "none":
                    cmd += ["--checkpoint-dir", ck, "--checkpoint-every", str(a.every)]
                if mode == "async":
                    cmd.append("--async-checkpoint")
                out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
                rows = [json.loads(l) for l in open(w("m.jsonl"))]
                times = [a.batch * a.seq / r["tokens_per_s"] for r in rows[a.warmup:]]
                held = re.search(r"held training up ([0-9.]+) s in all \(([0-9.]+) ms each\)", out)
                size = 0
                if mode != "none":
                    step_dir = os.path.join(ck, sorted(n for n in os.listdir(ck) if n.startswith("step-"))[-1])
                    size = sum(os.path.getsize(os.path.join(step_dir, f)) for f in os.listdir(step_dir))
                results[mode] = (statistics.median(times), sum(times), held, size)
            base = results["none"]
            name = "1 process x 2 threads" if ranks == 1 else "dp=2 x 1 thread"
            print(f"{name}:")
            print(f"  no checkpoints:        median step {base[0] * 1e3:7.1f} ms, {base[1]:.2f} s of steps")
            for mode in ("sync", "async"):
                med, total, held, size = results[mode]
                print(f"  {mode:5s} every {a.every:3d} steps: median step {med * 1e3:7.1f} ms; each "
                      f"checkpoint {size / 1e6:.2f} MB, held training up {float(held.group(2)):.1f} ms "
                      f"({float(held.group(1)) / (total + float(held.group(1))):.1%} of the run)")


if __name__ == "__main__":
    main()
