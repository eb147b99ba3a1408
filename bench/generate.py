#!/usr/bin/python3
"""Benchmark: ptc-generate's decode speed with the key/value cache against recomputing the
whole prefix for every token (--no-cache: one forward of the context's window per token), in
one invocation: greedy decoding of --new tokens after a --prompt-tokens prompt, tokens/s of
each and the ratio, and whether both produced the same tokens. The model: the bench GPT shape
(4 layers, hidden 256, 8 heads) with a context of prompt + new tokens (rounded up to 64),
weights from one training step.

usage: bench/generate.py [--bin build/bin] [--model gpt|llama] [--new 256] [--prompt-tokens 32]
                         [--layers 4] [--hidden 256] [--heads 8] [--threads 2]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(here, "..", "build", "bin"))
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama"])
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    b = lambda t: os.path.join(a.bin, t)
    context = -(-(a.prompt_tokens + a.new) // 64) * 64
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as work:
        w = lambda f: os.path.join(work, f)
        subprocess.run([b("ptc-tokenize"), "-o", w("data.bin"), "/usr/share/common-licenses/GPL-3"],
                       check=True, capture_output=True)
        subprocess.run([b("ptc-model"), a.model, "--layers", str(a.layers), "--hidden",
                        str(a.hidden), "--heads", str(a.heads), "--seq", str(context), "--vocab",
                        "256", "--batch", "1", "-o", w("model.mlir")], check=True)
        subprocess.run([b("ptc-opt"), w("model.mlir"), "--ptc-compile", "-o", w("train.plan")],
                       check=True)
        subprocess.run([b("ptc-run"), w("train.plan"), "--data", w("data.bin"), "--steps", "1",
                        "--log-every", "0", "--save", w("weights.safetensors")], check=True,
                       capture_output=True)
        prompt = " ".join(str(32 + i % 90) for i in range(a.prompt_tokens))
        print(f"ptc-generate, {a.model} {a.layers} layers hidden {a.hidden}, context {context}, "
              f"{a.prompt_tokens} prompt tokens, {a.new} new (greedy), {a.threads} threads")
        results = {}
        for name, extra in (("key/value cache", []), ("no cache (whole prefix each token)",
                                                      ["--no-cache"])):
            r = subprocess.run([b("ptc-generate"), w("model.mlir"), "--init",
                                w("weights.safetensors"), "--prompt-tokens", prompt,
                                "--max-new-tokens", str(a.new), "--temperature", "0",
                                "--print-tokens", *extra], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                print(r.stderr[-2000:])
                return 1
            m = re.search(r"first token ([0-9.]+) ms, then ([0-9.]+) tokens/s", r.stderr)
            tokens = r.stdout.strip().splitlines()[-1]
            results[name] = (float(m.group(1)), float(m.group(2)), tokens)
            print(f"  {name:36s} first token {float(m.group(1)):8.1f} ms   "
                  f"decode {float(m.group(2)):9.1f} tokens/s")
        (c_first, c_rate, c_tok), (n_first, n_rate, n_tok) = results.values()
        print(f"  cache / no cache: {c_rate / n_rate:.1f}x the tokens/s; same tokens: "
              f"{'yes' if c_tok == n_tok else 'NO'}")
        return 0 if c_tok == n_tok else 1


if __name__ == "__main__":
    sys.exit(main())
