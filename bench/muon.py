#!/usr/bin/python3
"""Muon against AdamW on the bench GPT (4 layers, hidden 256, 8 heads, seq 128, batch 8,
vocab 256) with the main job's data (every text under /usr/share/common-licenses, bytes as
tokens): each optimizer over a small learning-rate sweep, the same initial weights, the
same token windows, the same schedule (linear warmup, cosine decay to lr/10), weight
decay 0.1 and clipping at 1.0. Prints each run's mean training loss over the last 50
steps and its step time, then each optimizer at its best rate and the difference.

usage: bench/muon.py [--bin build/bin] [--steps 300] [--adamw-lrs ...] [--muon-lrs ...]
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--adamw-lrs", type=float, nargs="+", default=[2.5e-4, 5e-4, 1e-3, 2e-3])
    ap.add_argument("--muon-lrs", type=float, nargs="+", default=[4e-3, 8e-3, 1.6e-2, 3.2e-2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="ptc-muon-")
    os.makedirs(work, exist_ok=True)
    w = lambda name: os.path.join(work, name)
    b = lambda tool: os.path.join(a.bin, tool)
    run = lambda *cmd: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    texts = sorted(p for p in glob.glob("/usr/share/common-licenses/*")
                   if os.path.isfile(p) and not os.path.islink(p))
    run(b("ptc-tokenize"), "-o", w("corpus.bin"), *texts)
    run(b("ptc-model"), "gpt", "--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "128",
        "--vocab", "256", "--batch", "8", "-o", w("gpt.mlir"))
    warmup = max(1, a.steps // 15)
    results = {}
    print(f"{'optimizer':10s} {'lr':>8s} {'last-50 loss':>13s} {'ms/step':>8s}")
    for optimizer, lrs in (("adamw", a.adamw_lrs), ("muon", a.muon_lrs)):
        for lr in lrs:
            tag = f"{optimizer}-{lr:g}"
            opts = (f"plan={w(tag + '.plan')} optimizer={optimizer} lr={lr} beta2=0.95 "
                    f"weight-decay=0.1 max-grad-norm=1.0 lr-schedule=cosine "
                    f"warmup-steps={warmup} decay-steps={a.steps} min-lr={lr / 10}")
            run(b("ptc-opt"), w("gpt.mlir"), f"--ptc-compile={opts}", "-o", os.devnull)
            run(b("ptc-run"), w(tag + ".plan"), "--data", w("corpus.bin"), "--steps", str(a.steps),
                "--metrics", w(tag + ".jsonl"), "--threads", str(a.threads), "--log-every", "0")
            rows = [json.loads(line) for line in open(w(tag + ".jsonl"))]
            loss = statistics.fmean(r["loss"] for r in rows[-50:])
            times = [r2["elapsed_s"] - r1["elapsed_s"] for r1, r2 in zip(rows[4:], rows[5:])]
            ms = 1000 * statistics.median(times)
            results[(optimizer, lr)] = loss
            print(f"{optimizer:10s} {lr:8.2g} {loss:13.4f} {ms:8.1f}", flush=True)
    best = {}
    for (optimizer, lr), loss in results.items():
        if optimizer not in best or loss < best[optimizer][1]:
            best[optimizer] = (lr, loss)
    for optimizer, (lr, loss) in best.items():
        print(f"best {optimizer}: lr {lr:g}, last-50 loss {loss:.4f}")
    diff = best["muon"][1] - best["adamw"][1]
    print(f"muon - adamw at their best rates after {a.steps} steps (same tokens): {diff:+.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
