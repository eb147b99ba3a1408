#!/usr/bin/python3
"""Benchmark: training step time of ptc-run vs PyTorch eager on the same GPT (or, with
--model llama, the same Llama: RMSNorm, rotary, 8 heads over 4 kv heads, SwiGLU 688), same
machine and cores, in one invocation. PyTorch runs at every combination of intra-op
threads and OpenBLAS threads from 1 to --threads, each in its own process with the
environment set before PyTorch and OpenBLAS start; ptc-run is compared with the best.
PyTorch also runs with OpenBLAS unpinned (this machine's OPENBLAS_CORETYPE/L2 settings
unset for that command), where the environment sets them. Prints per-step times, the
ratio, and model FLOP/s as a fraction of the faster of oneDNN's and OpenBLAS's sgemm
throughput on the same threads (the GEMM bound). With
--precision bf16, ptc-run's fp32 step runs too and the bf16 / fp32 ratio is printed.
The ratios are medians over --rounds paired rounds: after the sweep picks PyTorch's best
configuration, ptc-run and that configuration run one after the other, round after
round, so that a drift of this machine's speed (it changes over minutes) moves both
sides of each ratio.

usage: bench/step_time.py [--bin build/bin] [--threads 2] [--steps 30] [--rounds 3]
       [--model gpt|llama] [--precision fp32|bf16]
       [--layers 4 --hidden 256 --heads 8 --seq 128 --batch 8 --vocab 256]
       [--kv-heads 4 --intermediate 688]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "e2e"))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="paired rounds of ptc-run and PyTorch's best (the ratios' medians)")
    a = ap.parse_args()
    L, H, A, S, B, V = a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab
    binp = lambda t: os.path.join(a.bin, t)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))

    sgemm_out = subprocess.run([binp("ptc-bench-sgemm"), "1024", str(a.threads)], env=env,
                               check=True, capture_output=True, text=True).stdout
    # The GEMM bound: the faster library's sgemm on its own threads (ptc's
    # kernels call oneDNN's or OpenBLAS's, whichever this CPU runs a product faster).
    sgemm_name, sgemm = max(((lib, float(re.search(lib + r" +sgemm .*?([0-9.]+) GFLOP/s",
                                                   sgemm_out).group(1)) * 1e9)
                             for lib in ("oneDNN", "OpenBLAS")), key=lambda x: x[1])

    with tempfile.TemporaryDirectory() as d:
        w = lambda n: os.path.join(d, n)
        common.write_data(w("data.bin"))

        def compile_plan(precision):
            plan = w(f"gpt-{precision}.plan")
            common.compile_gpt(a, d, plan, "optimizer=adamw lr=1e-3" +
                               (" precision=bf16" if precision == "bf16" else ""))
            return plan

        def ptc_step(plan):
            """ptc-run's median step of `plan`."""
            subprocess.run([binp("ptc-run"), plan, "--data", w("data.bin"), "--steps",
                            str(a.steps + a.warmup), "--threads", str(a.threads), "--log-every",
                            "0", "--metrics", w("run.jsonl")], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            rows = [json.loads(l) for l in open(w("run.jsonl"))][a.warmup:]
            return statistics.median(B * S / r["tokens_per_s"] for r in rows)

        plan = compile_plan(a.precision)
        # bf16: ptc's own fp32 step too, in the same rounds, for the bf16 / fp32 ratio.
        fp32_plan = compile_plan("fp32") if a.precision == "bf16" else None

        # bf16 on a CPU without bf16 instructions: ptc-run widens to f32 (its log
        # says so), and PyTorch's autocast falls to kernels that take seconds per
        # step, so PyTorch runs 3 steps (after 1) per measurement there.
        native_bf16 = True
        if a.precision == "bf16":
            probe = subprocess.run([binp("ptc-run"), plan, "--data", w("data.bin"), "--steps", "1",
                                    "--threads", str(a.threads), "--log-every", "0"], env=env,
                                   check=True, capture_output=True, text=True)
            native_bf16 = "widened to f32" not in probe.stdout + probe.stderr
        torch_a = a
        if not native_bf16:
            torch_a = argparse.Namespace(**vars(a))
            torch_a.steps, torch_a.warmup = 3, 1

        # PyTorch at every (intra-op, BLAS) thread combination picks its best
        # configuration; then the paired rounds.
        torch_runs = common.torch_thread_sweep(torch_a, a.threads)
        best_key = min(torch_runs, key=torch_runs.get)
        runs = [("ptc", lambda: ptc_step(plan))]
        if fp32_plan:
            runs.append(("ptc-fp32", lambda: ptc_step(fp32_plan)))
        runs.append(("pytorch", lambda: common.torch_step_seconds(torch_a, best_key)))
        rounds = common.paired_rounds(a.rounds, runs)

    flops = common.flops_of(a)
    llama = f" ({a.kv_heads} kv heads, intermediate {a.intermediate})" if a.model == "llama" else ""
    print(f"config: {a.model}, layers {L}, hidden {H}, heads {A}{llama}, seq {S}, batch {B}, "
          f"vocab {V}, AdamW, {a.precision}{' (PyTorch: CPU autocast)' if a.precision == 'bf16' else ''}, "
          f"{a.threads} threads, median of {a.steps} steps")
    print(sgemm_out.rstrip())
    if not native_bf16:
        print("this CPU has no bf16 instructions: ptc-run widens bf16 to f32 (bf16 matmul: widened "
              "to f32), PyTorch's autocast runs its fallback kernels (median of 3 steps after 1)")
    print(f"model FLOPs per step: {flops / 1e9:.2f} GFLOP")
    for key, t in sorted(torch_runs.items()):
        print(f"{common.sweep_name(key)}: {t * 1e3:8.1f} ms{'  <- best' if key == best_key else ''}")
    for i in range(a.rounds):
        print(f"round {i + 1}: " + ", ".join(f"{name} {rounds[name][i] * 1e3:.1f} ms"
                                             for name, _ in runs))
    ptc_step, torch_step = statistics.median(rounds["ptc"]), statistics.median(rounds["pytorch"])
    for name, t in (("ptc-run", ptc_step), ("pytorch", torch_step)):
        rate = flops / t
        print(f"{name:8s} step {t * 1e3:8.1f} ms  {B * S / t:9.0f} tok/s  "
              f"{rate / 1e9:6.1f} GFLOP/s  = {rate / sgemm:5.1%} of {sgemm_name} sgemm  "
              f"(median of {a.rounds} rounds)")
    ratio, ratios = common.median_ratio(rounds["ptc"], rounds["pytorch"])
    print(f"ptc-run ({a.threads} threads) / pytorch at its best ({common.sweep_name(best_key)[9:]}): "
          f"{ratio:.2f}x (median of the rounds' ratios {', '.join(f'{r:.2f}' for r in ratios)})")
    if fp32_plan:
        ratio, ratios = common.median_ratio(rounds["ptc"], rounds["ptc-fp32"])
        print(f"ptc-run fp32 step {statistics.median(rounds['ptc-fp32']) * 1e3:8.1f} ms; "
              f"ptc-run bf16 / ptc-run fp32: {ratio:.2f}x "
              f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
