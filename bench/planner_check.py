#!/usr/bin/env python3
"""Predicted vs measured step time on this machine, for every calibrated layout.

Calibrates this machine (ptc-plan --calibrate: ptc's kernels, a real step of a
calibration model that is not the bench configuration, the MPI links) unless
--calibrated names a file, then for the bench configuration on 1 rank, dp=2,
tp=2, pp=2 and 4 ranks (dp=2 x tp=2, oversubscribed on 2 cores: labelled so)
asks ptc-plan for the layout's predicted step time and its ptc-compile options,
compiles them, trains with ptc-run and prints predicted, measured and the error.

    /usr/bin/python3 bench/planner_check.py [--calibrated calib.json] [--steps 15]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

LAYOUTS = [  # name, ptc-plan --layout, ranks (each with cores / ranks threads, at least 1)
    ("1 rank x 2 threads", "dp=1,mbs=8", 1),
    ("dp=2", "dp=2,mbs=4", 2),
    ("tp=2", "tp=2,mbs=8", 2),
    ("pp=2 (4 micro-batches)", "pp=2,mbs=2", 2),
    ("dp=2 x tp=2 (4 ranks)", "dp=2,tp=2,mbs=4", 4),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_model_options(ap, steps=15)
    ap.add_argument("--calibrated", help="a ptc-plan --calibrate file (default: calibrate now)")
    ap.add_argument("--tolerance", type=float, default=0.25)
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as wd:
        plan_tool = os.path.join(a.bin, "ptc-plan")
        calib = a.calibrated or os.path.join(wd, "calib.json")
        if not a.calibrated:
            subprocess.run([plan_tool, "--calibrate", "-o", calib], check=True)
        common.write_data(os.path.join(wd, "data.bin"))
        model = ["--model", "gpt", "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
                 "--seq", str(a.seq), "--vocab", str(a.vocab), "--global-batch", str(a.batch)]
        print(f"bench config: {a.layers} layers, hidden {a.hidden}, {a.heads} heads, seq {a.seq}, batch {a.batch}, "
              f"vocab {a.vocab}, AdamW, fp32; {cores} cores; median of {a.steps} steps after {a.warmup}")
        print(f"{'layout':38s} {'ranks x threads':>15s} {'predicted':>10s} {'measured':>10s} {'error':>8s}  options")
        worst = 0.0
        for name, layout, ranks in LAYOUTS:
            threads = max(1, cores // ranks)
            out = os.path.join(wd, "row.json")
            subprocess.run([plan_tool, *model, "--gpus", str(ranks), "--calibrated", calib, "--layout", layout,
                            "--json", out], check=True, stdout=subprocess.DEVNULL)
            row = json.load(open(out))[0]
            tag = layout.replace("=", "").replace(",", "_")
            measured = common.ptc_step_seconds(a, wd, tag, row["options"], ranks, threads)
            err = row["step_seconds"] / measured - 1
            worst = max(worst, abs(err))
            label = name + (" OVERSUBSCRIBED" if ranks > cores else "")
            print(f"{label:38s} {ranks:>7d} x {threads:<7d} {row['step_seconds'] * 1e3:8.1f} ms "
                  f"{measured * 1e3:8.1f} ms {100 * err:+7.1f}%  {row['options']}", flush=True)
        verdict = "within" if worst <= a.tolerance else "NOT within"
        print(f"largest error {100 * worst:.1f}%: {verdict} {100 * a.tolerance:.0f}% on every layout")
        if worst > a.tolerance:
            sys.exit(1)


if __name__ == "__main__":
    main()
