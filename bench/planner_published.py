#!/usr/bin/env python3
"""ptc-plan against published results.

1. Megatron-LM's weak-scaling table (Narayanan et al. 2021, "Efficient Large-Scale
   Language Model Training on GPU Clusters Using Megatron-LM", Table 1): GPT models
   from 1.7B to 1T parameters on DGX A100 nodes (8 GPUs, InfiniBand), sequence 2048,
   vocabulary 51200, mixed precision, activation recomputation. For every row the
   planner searches Megatron's space (no ZeRO, full recomputation, 1F1B or
   interleaved 1F1B) on the dgx-a100-ib preset and prints its chosen (t, p) against
   the paper's; then it evaluates the paper's (t, p) and prints the predicted
   TFLOP/s per GPU in the paper's convention (96 B s l h^2 (1 + s/6h + V/16lh) per
   step, recomputation included) against the measured one.
2. ZeRO's Table 1 (Rajbhandari et al. 2020): model-state memory per device of
   7.5B, 128B and 1T parameter models under ZeRO stages 1-3 for 1 to 1024
   data-parallel devices, against the planner's prediction for GPT models of those
   sizes (its memory is the compiler's report of the compiled probes).

    /usr/bin/python3 bench/planner_published.py [--rows 1.7B,18.4B] [--no-zero]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# params, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU (Table 1)
MEGATRON = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200

# ZeRO Table 1: per-device GB for P_os, P_os+g, P_os+g+p (K = 12) by DP degree.
ZERO_PAPER = {
    "7.5B": {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88),
             256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    "128B": {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128), 64: (536, 284, 32),
             256: (518, 263, 8), 1024: (513, 257, 2)},
    "1T": {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000), 64: (4187, 2218, 250),
           256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}
# GPT shapes of about those sizes: heads, hidden, layers.
ZERO_MODELS = {"7.5B": (32, 4096, 36), "128B": (80, 10240, 102), "1T": (160, 25600, 128)}


def plan(bin_dir, wd, args):
    out = os.path.join(wd, "rows.json")
    start = time.time()
    r = subprocess.run([os.path.join(bin_dir, "ptc-plan"), *args, "--json", out], capture_output=True, text=True)
    if r.returncode:
        return None, time.time() - start, r.stderr.strip().splitlines()[-1]
    return json.load(open(out)), time.time() - start, ""


def megatron_flops(batch, layers, hidden):
    return 96 * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--rows", help="comma-separated Megatron rows (default: all)")
    ap.add_argument("--no-zero", action="store_true", help="skip the ZeRO table")
    a = ap.parse_args()
    rows = [r for r in MEGATRON if not a.rows or r[0] in a.rows.split(",")]
    with tempfile.TemporaryDirectory() as wd:
        print("Megatron-LM Table 1 (Narayanan et al. 2021) on dgx-a100-ib, Megatron's space "
              "(zero 0, full recomputation, 1f1b / interleaved)")
        print(f"{'model':>8s} {'GPUs':>5s} {'paper t,p':>9s} {'chosen':>24s} {'search':>8s} "
              f"{'paper TFLOP/s':>13s} {'predicted':>9s} {'error':>7s}   {'at chosen':>9s}")
        matches, errors = 0, []
        for name, heads, hidden, layers, t, p, gpus, batch, tflops in rows:
            model = ["--model", "gpt", "--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads),
                     "--seq", str(SEQ), "--vocab", str(VOCAB), "--global-batch", str(batch), "--gpus", str(gpus),
                     "--cluster", "dgx-a100-ib", "--zero", "0", "--recompute", "full",
                     "--schedules", "1f1b,interleaved-1f1b", "--micro-batch-sizes", "1,2,4,8", "--top", "1"]
            best, secs, err = plan(a.bin, wd, model)
            at_paper, _, err2 = plan(a.bin, wd, model + ["--tp", str(t), "--pp", str(p)])
            if best is None or at_paper is None:
                print(f"{name:>8s} {gpus:5d} {t:>4d},{p:<4d} planner failed: {err or err2}")
                continue
            b, q = best[0], at_paper[0]
            chosen = f"t={b['tp']} p={b['pp']} ({b['layout'].split(' mb')[1].split()[0]})"
            same = (b["tp"], b["pp"]) == (t, p)
            matches += same
            flops = megatron_flops(batch, layers, hidden)
            predicted = flops / (q["step_seconds"] * gpus) / 1e12
            at_chosen = flops / (b["step_seconds"] * gpus) / 1e12
            e = predicted / tflops - 1
            errors.append(abs(e))
            print(f"{name:>8s} {gpus:5d} {t:>4d},{p:<4d} {chosen + (' =' if same else ''):>24s} {secs:7.1f}s "
                  f"{tflops:13d} {predicted:9.1f} {100 * e:+6.1f}%   {at_chosen:9.1f}", flush=True)
        if errors:
            print(f"(t, p) matches the paper in {matches} of {len(errors)} rows; predicted TFLOP/s at the paper's "
                  f"(t, p): mean absolute error {100 * sum(errors) / len(errors):.1f}%, largest "
                  f"{100 * max(errors):.1f}%")
        if a.no_zero:
            return
        print("\nZeRO Table 1 (Rajbhandari et al. 2020): model-state GB per device, paper (K = 12: fp16 weights and "
              "gradients, fp32 Adam) / ptc-plan, bf16 (bf16 working copies 2 + fp32 master weights 4 + fp32 "
              "gradients 4 + Adam 8 bytes; ZeRO-1 and ZeRO-2 both shard the master weights, the gradient the update "
              "reads and the Adam state and keep the bf16 copies whole; ZeRO-3 shards the copies too)")
        print(f"{'model':>6s} {'params':>8s} {'DP':>5s} {'zero-1 paper/ptc':>18s} {'zero-2 paper/ptc':>18s} "
              f"{'zero-3 paper/ptc':>18s}")
        for name, (heads, hidden, layers) in ZERO_MODELS.items():
            params = 12 * layers * hidden ** 2 + (VOCAB + SEQ) * hidden
            for dp, paper in ZERO_PAPER[name].items():
                cells = []
                for stage in (1, 2, 3):
                    layout = f"dp={dp},mbs=1" + (f",zero={stage}" if dp > 1 else "")
                    got, _, err = plan(a.bin, wd, ["--model", "gpt", "--layers", str(layers), "--hidden", str(hidden),
                                                   "--heads", str(heads), "--seq", str(SEQ), "--vocab", str(VOCAB),
                                                   "--global-batch", str(dp), "--gpus", str(dp), "--cluster",
                                                   "dgx-a100-ib", "--layout", layout])
                    gb = got[0]["model_state_bytes"] / 1e9 if got else None
                    mine = "-" if gb is None else f"{gb:.0f}" if gb >= 100 else f"{gb:.3g}"
                    cells.append(f"{paper[stage - 1]:>8g} / {mine:<8s}")
                print(f"{name:>6s} {params / 1e9:7.2f}B {dp:5d} " + " ".join(f"{c:>18s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
