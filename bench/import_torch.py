#!/usr/bin/python3
"""Benchmark: the step time of a model imported from PyTorch (ptc-import-torch of the
nanoGPT-style module in test/e2e/torch_models) against the builder GPT of the same shape
(ptc-model gpt), same compile options, same thread count, measured alternately in one
invocation: the medians of each and their ratio (the patterns were recognised when it is ~1).

usage: bench/import_torch.py [--bin build/bin] [--layers 4] [--hidden 256] [--heads 8]
                             [--seq 128] [--batch 8] [--vocab 256] [--steps 20] [--rounds 3]
                             [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.model != "gpt" or a.precision != "fp32":
        ap.error("the imported module is the nanoGPT-style GPT in fp32: --model gpt --precision fp32")
    b = lambda t: os.path.join(a.bin, t)
    module = os.path.join(common.HERE, "..", "test", "e2e", "torch_models", "nanogpt_style.py")
    with tempfile.TemporaryDirectory() as work:
        w = lambda f: os.path.join(work, f)
        common.write_data(w("data.bin"))
        kwargs = dict(n_layer=a.layers, n_head=a.heads, n_embd=a.hidden, block_size=a.seq,
                      vocab_size=a.vocab)
        subprocess.run([b("ptc-import-torch"), module, "--class", "GPT", "--kwargs",
                        json.dumps(kwargs), "--input", f"tokens={a.batch}x{a.seq}:int64",
                        "--input", f"targets={a.batch}x{a.seq}:int64", "-o", w("imported.mlir")],
                       check=True)
        # The builder's plan (ptc-model gpt of the same shape) and the imported one.
        common.compile_gpt(a, work, w("builder.plan"), "optimizer=adamw lr=1e-3")
        subprocess.run([b("ptc-opt"), w("imported.mlir"), "--ptc-compile=optimizer=adamw lr=1e-3",
                        "-o", w("imported.plan")], check=True)
        times = {"imported": [], "builder": []}
        for _ in range(a.rounds):
            for tag in times:
                subprocess.run([b("ptc-run"), w(f"{tag}.plan"), "--data", w("data.bin"), "--steps",
                                str(a.steps + a.warmup), "--log-every", "0", "--threads", str(a.threads),
                                "--metrics", w(f"{tag}.jsonl")], check=True,
                               stdout=subprocess.DEVNULL)
                rows = [json.loads(l) for l in open(w(f"{tag}.jsonl"))][a.warmup:]
                times[tag] += [a.batch * a.seq / r["tokens_per_s"] for r in rows]
        print(f"GPT {a.layers} layers, hidden {a.hidden}, {a.heads} heads, seq {a.seq}, batch "
              f"{a.batch}, {a.threads} threads, median of {a.rounds} x {a.steps} steps:")
        imp, bld = statistics.median(times["imported"]), statistics.median(times["builder"])
        print(f"  imported from PyTorch (ptc-import-torch): {imp * 1e3:7.2f} ms/step")
        print(f"  builder (ptc-model gpt):                  {bld * 1e3:7.2f} ms/step")
        print(f"  imported / builder: {imp / bld:.3f}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
