#!/usr/bin/env python3
"""Compile time against model depth: GPT-3 175B shapes (hidden 12288, 96 heads, seq 2048,
vocab 51200, batch 64) at 96 and 192 layers on mesh=pp:8,dp:4,tp:8 with 16 micro-batches,
bf16, sequence parallelism and ZeRO-1. Prints the best of --repeat wall times per depth
and the ratio (linear compile time: about 2x for twice the layers)."""
import argparse
import os
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--layers", type=int, nargs="+", default=[96, 192])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--options", default="mesh=pp:8,dp:4,tp:8 microbatches=16 precision=bf16 "
                                         "sequence-parallel=true zero=1")
    args = ap.parse_args()
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in args.layers:
            model = os.path.join(tmp, f"gpt{layers}.mlir")
            subprocess.run([os.path.join(args.bin, "ptc-model"), "gpt", "--layers", str(layers),
                            "--hidden", "12288", "--heads", "96", "--seq", "2048", "--vocab",
                            "51200", "--batch", "64", "-o", model], check=True)
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                subprocess.run([os.path.join(args.bin, "ptc-opt"), model,
                                f"--ptc-compile={args.options}", "-o", os.devnull], check=True)
                best = min(best, time.perf_counter() - start)
            times[layers] = best
            print(f"{layers:4d} layers: ptc-compile {best:6.2f} s (best of {args.repeat})")
    first = args.layers[0]
    for layers in args.layers[1:]:
        print(f"{layers} / {first} layers: {times[layers] / times[first]:.2f}x the time "
              f"for {layers / first:.1f}x the layers")


if __name__ == "__main__":
    main()
