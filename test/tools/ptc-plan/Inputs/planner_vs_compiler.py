"""The planner's memory per device against the compiler's for its chosen layouts.

Runs ptc-plan on a builder preset, then compiles the model in each of the top
rows' layouts with ptc-opt, writing the plan (so pipelined layouts get the
activation stash the export simulates on the plan), and checks the compiler's
predicted peak (with the stash) equals the row's memory within --tolerance.

usage: planner_vs_compiler.py WORK_DIR --preset P --seq S --global-batch B --gpus N
       [--cluster C] [--top K] [--compile-options OPTS] [--tolerance 0.03]
The tools (ptc-plan, ptc-model, ptc-opt) are found on PATH.
"""
import argparse
import json
import os
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--preset", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--cluster", default="h100-ib")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--compile-options", default="")
    ap.add_argument("--tolerance", type=float, default=0.03)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rows_json = os.path.join(a.work, "rows.json")
    subprocess.run(["ptc-plan", "--preset", a.preset, "--seq", str(a.seq),
                    "--global-batch", str(a.global_batch), "--gpus", str(a.gpus), "--cluster", a.cluster,
                    "--top", str(a.top), "--json", rows_json]
                   + (["--compile-options", a.compile_options] if a.compile_options else []), check=True)
    rows = json.load(open(rows_json))
    if len(rows) < a.top:
        sys.exit(f"ptc-plan returned {len(rows)} rows, expected {a.top}")
    model = os.path.join(a.work, "model.mlir")
    subprocess.run(["ptc-model", "llama" if "llama" in a.preset else "gpt",
                    "--preset", a.preset, "--seq", str(a.seq), "--batch", str(a.global_batch), "-o", model],
                   check=True)
    plan = os.path.join(a.work, "layout.plan")
    worst = 0.0
    for r in rows:
        out = subprocess.run(["ptc-opt", model,
                              "--ptc-compile=" + " ".join(filter(None, [r["options"], a.compile_options]))
                              + f" report-memory=true plan={plan}",
                              "-o", os.devnull], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"ptc-opt refused the planner's layout {r['layout']}:\n{out.stderr}")
        text = out.stdout + out.stderr
        stash = re.search(r"predicted peak with the stash: (\d+) B", text)
        plain = re.search(r"predicted peak\s+(\d+) B", text)
        compiled = int((stash or plain).group(1))
        planned = r["memory_bytes"]
        error = abs(planned - compiled) / compiled
        worst = max(worst, error)
        print(f"{r['layout']:44s} planner {planned / 2**30:8.2f} GiB  compiler {compiled / 2**30:8.2f} GiB"
              f"  difference {100 * error:.2f}%  {'exact' if r.get('memory_exact') else 'estimated'}")
        if error > a.tolerance:
            sys.exit(f"{r['layout']}: the planner's {planned:.0f} B and the compiler's {compiled} B differ "
                     f"by {100 * error:.2f}% (more than {100 * a.tolerance:.0f}%)")
    print(f"largest difference: {100 * worst:.2f}% over {len(rows)} layouts")


if __name__ == "__main__":
    main()
