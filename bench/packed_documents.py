#!/usr/bin/python3
"""Packed documents: what the document mask saves. One GPT plan of packed documents
(ptc-model --document-end 255) trains on windows of one document (no end token in the
data) and on windows of 8 documents (an end token every seq/8 tokens), the same shapes;
the plain causal model (no --document-end) on the one-document data is the reference.
Prints each run's median step time and attention time per step (ptc-run --profile: the
CausalAttention* instructions, forward and backward) and the ratios. With --cp N, then the
same model on cp:N with ring attention: each rank's attention FLOPs per step (the query-key
pairs the mask leaves, ptc-run --profile) and max/min, for the plain model and for windows of
one document, of `--docs` equal documents and of documents of random lengths (1 .. seq/2).

usage: bench/packed_documents.py [--bin build/bin] [--seq 1024] [--docs 8] [--steps 6] [--cp 4]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--docs", type=int, default=8, help="documents per window in the packed data")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cp", type=int, default=0, help="also the ring's balance on cp:N")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="ptc-documents-")
    os.makedirs(work, exist_ok=True)
    w = lambda name: os.path.join(work, name)
    b = lambda tool: os.path.join(a.bin, tool)
    run = lambda *cmd: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    end = 255

    # Token files (uint16): random bytes below the end token; the packed one ends a
    # document every seq/docs tokens.
    rng = np.random.default_rng(0)
    n = a.seq * a.batch * (a.steps + 2) + a.seq + 1
    stream = rng.integers(0, end, size=n, dtype=np.uint16)
    stream.astype("<u2").tofile(w("one.bin"))
    packed = stream.copy()
    packed[a.seq // a.docs - 1::a.seq // a.docs] = end
    packed.astype("<u2").tofile(w("packed.bin"))
    ragged = stream.copy()
    at = 0
    while True:
        at += int(rng.integers(1, a.seq // 2 + 1))
        if at >= n:
            break
        ragged[at] = end
    ragged.astype("<u2").tofile(w("ragged.bin"))

    shape = ["--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
             "--seq", str(a.seq), "--vocab", "256", "--batch", str(a.batch)]
    run(b("ptc-model"), "gpt", *shape, "--document-end", str(end), "-o", w("documents.mlir"))
    run(b("ptc-model"), "gpt", *shape, "-o", w("plain.mlir"))
    for name in ("documents", "plain"):
        run(b("ptc-opt"), w(name + ".mlir"), f"--ptc-compile=plan={w(name + '.plan')} lr=1e-4",
            "-o", os.devnull)

    def measure(plan, data, tag):
        out = subprocess.run(
            [b("ptc-run"), w(plan), "--data", w(data), "--steps", str(a.steps), "--threads",
             str(a.threads), "--log-every", "0", "--profile", "--metrics", w(tag + ".jsonl")],
            check=True, capture_output=True, text=True).stdout
        times = [1e3 * a.batch * a.seq / json.loads(line)["tokens_per_s"]
                 for line in open(w(tag + ".jsonl"))]
        attention = sum(float(m.group(1)) for m in
                        re.finditer(r"^\s+CausalAttention\w*\s+([0-9.]+) ms", out, re.M))
        return statistics.median(times[1:]), attention

    rows = [("plain causal, 1 document per window", "plain.plan", "one.bin"),
            ("packed documents, 1 document per window", "documents.plan", "one.bin"),
            (f"packed documents, {a.docs} documents per window", "documents.plan", "packed.bin")]
    results = []
    print(f"GPT {a.layers} x {a.hidden}, {a.heads} heads, seq {a.seq}, batch {a.batch}, "
          f"{a.threads} threads, median of {a.steps - 1} steps")
    for label, plan, data in rows:
        step, attention = measure(plan, data, label.split(",")[0].replace(" ", "-") + data)
        results.append((step, attention))
        print(f"  {label:44s} step {step:8.1f} ms   attention {attention:8.1f} ms/step")
    (s0, a0), (s1, a1), (s8, a8) = results
    print(f"{a.docs} documents vs 1 (same plan): step {s8 / s1:.2f}x, attention {a8 / a1:.2f}x; "
          f"1 document, packed plan vs plain: step {s1 / s0:.2f}x, attention {a1 / a0:.2f}x")
    if a.cp > 1:
        for name in ("documents", "plain"):
            run(b("ptc-opt"), w(name + ".mlir"),
                f"--ptc-compile=plan={w(name + '-cp.plan')} lr=1e-4 mesh=cp:{a.cp}", "-o", os.devnull)
        print(f"ring attention on cp:{a.cp}, FLOPs per step by rank (the mask's query-key pairs):")
        for label, plan, data in [("plain causal", "plain-cp.plan", "one.bin"),
                                  ("1 document per window", "documents-cp.plan", "one.bin"),
                                  (f"{a.docs} documents per window", "documents-cp.plan", "packed.bin"),
                                  ("documents of random lengths", "documents-cp.plan", "ragged.bin")]:
            out = subprocess.run(
                [b("ptc-run"), w(plan), "--np", str(a.cp), "--data", w(data), "--steps", "2",
                 "--threads", "1", "--log-every", "0", "--profile"],
                check=True, capture_output=True, text=True).stdout
            line = next(l for l in out.splitlines() if l.startswith("ring attention FLOPs"))
            print(f"  {label:30s} {line.split(':', 1)[1].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
