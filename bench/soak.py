#!/usr/bin/python3
"""Soak test (outside CI): long runs with RSS and throughput sampled over time, printed as a
table, to see leaks and slow drifts. Defaults as issue 18 asks: 100k steps of a 2-layer,
hidden-64 GPT on one process, then 20k steps on 2 ranks (dp=2).

usage: bench/soak.py [--bin build/bin] [--steps 100000] [--dp-steps 20000] [--every 10]
       (--every: seconds between samples)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rss_kib(pids):
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def ptc_pids(root):
    """root and its descendants that run ptc-run."""
    out, pending = [], [root]
    while pending:
        pid = pending.pop()
        try:
            children = open(f"/proc/{pid}/task/{pid}/children").read().split()
            name = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if name == "ptc-run":
            out.append(pid)
        pending += [int(c) for c in children]
    return out


def soak(a, plan, data, steps, ranks, threads, label, workdir):
    metrics = os.path.join(workdir, f"{label}.jsonl")
    cmd = [os.path.join(a.bin, "ptc-run"), plan, "--data", data, "--steps", str(steps),
           "--log-every", "0", "--threads", str(threads), "--metrics", metrics]
    if ranks > 1:
        cmd += ["--np", str(ranks)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    print(f"{label}: {steps} steps, {ranks} rank(s) x {threads} thread(s)")
    print(f"  {'elapsed s':>9} {'step':>8} {'tokens/s (window)':>18} {'RSS MiB (all ranks)':>20}")
    start, last_step, last_time, rows = time.time(), 0, 0.0, []
    while True:
        done = proc.poll() is not None
        if not done:
            time.sleep(a.every)
        lines = open(metrics).read().splitlines() if os.path.exists(metrics) else []
        if lines:
            row = json.loads(lines[-1])
            step, elapsed = row["step"], row["elapsed_s"]
            if step > last_step and elapsed > last_time:
                # Tokens per second over the window since the last sample.
                rate = (step - last_step) * a.tokens_per_step / (elapsed - last_time)
                rss = rss_kib(ptc_pids(proc.pid)) / 1024
                if rss == 0 and rows:  # the run just ended: its last sample stands
                    rss = rows[-1][3]
                rows.append((time.time() - start, step, rate, rss))
                print(f"  {rows[-1][0]:9.0f} {step:8d} {rate:18.0f} {rss:20.1f}", flush=True)
                last_step, last_time = step, elapsed
        if done:
            break
    rates = [r[2] for r in rows[1:]]  # the first window includes start-up
    if len(rates) >= 4:
        q = max(1, len(rates) // 4)
        first, last = sum(rates[:q]) / q, sum(rates[-q:]) / q
        print(f"  throughput first quarter {first:.0f} tok/s, last quarter {last:.0f} tok/s "
              f"({(last - first) / first:+.1%}); RSS {rows[0][3]:.1f} -> {rows[-1][3]:.1f} MiB")
    return proc.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--dp-steps", type=int, default=20000)
    ap.add_argument("--every", type=float, default=10.0)
    a = ap.parse_args()
    a.tokens_per_step = 8 * 64
    b = lambda t: os.path.join(a.bin, t)
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "data.bin")
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk("/usr/share/common-licenses") for f in fs)
        subprocess.run([b("ptc-tokenize"), "-o", data, *files], check=True, stdout=subprocess.DEVNULL)
        mlir = os.path.join(d, "gpt.mlir")
        subprocess.run([b("ptc-model"), "gpt", "--layers", "2", "--hidden", "64", "--heads", "4",
                        "--seq", "64", "--vocab", "256", "--batch", "8", "-o", mlir], check=True)
        status = 0
        for label, layout, steps, ranks, threads in (("single", "", a.steps, 1, 2),
                                                     ("dp2", "mesh=dp:2", a.dp_steps, 2, 1)):
            if steps <= 0:
                continue
            plan = os.path.join(d, f"{label}.plan")
            subprocess.run([b("ptc-opt"), mlir, f"--ptc-compile=plan={plan} optimizer=adamw lr=1e-3 {layout}",
                            "-o", os.devnull], check=True)
            status |= soak(a, plan, data, steps, ranks, threads, label, d)
        return status


if __name__ == "__main__":
    sys.exit(main())
