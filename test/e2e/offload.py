#!/usr/bin/python3
"""Optimizer offload (offload=optimizer, ZeRO-Offload) on the discrete CPU device, where
host and device memory are distinct: the fp32 master weights, the optimizer state and the
update live in host memory and run on the host, only the low-precision working copies,
gradients and activations on the device.

For every layout: the per-step losses of 10 steps are bitwise equal to the same layout
without offload (the same kernels run, only elsewhere); ptc-run's allocation equals the
compiler's prediction on the device and in host memory; and the device's persistent
tensors (parameters, state, inputs, constants) fall by at least 90%: every master weight
and optimizer state tensor leaves it, what remains is the batch (what ZeRO-Offload saves).
A checkpoint written under offload resumes bitwise under offload and without it.

usage: offload.py --bin BUILD/bin --workdir DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LAYOUTS = [
    ("bf16", "precision=bf16", 1),
    ("fp32", "", 1),
    ("bf16 adafactor", "precision=bf16 optimizer=adafactor lr=1e-2", 1),
    ("f16 dynamic scale", "precision=f16 dynamic-loss-scale=true max-grad-norm=1", 1),
    ("bf16 cosine sgd", "precision=bf16 optimizer=sgd momentum=0.9 lr=0.05 lr-schedule=cosine "
                        "warmup-steps=2 decay-steps=20", 1),
    ("bf16 dp:2", "precision=bf16 mesh=dp:2", 2),
    ("bf16 dp:2 zero=1", "precision=bf16 mesh=dp:2 zero=1", 2),
    ("bf16 dp:2 zero=3", "precision=bf16 mesh=dp:2 zero=3", 2),
    ("bf16 tp:2 sp", "precision=bf16 mesh=tp:2 sequence-parallel=true", 2),
    ("bf16 pp:2 1f1b", "precision=bf16 mesh=pp:2 microbatches=4", 2),
    ("bf16 pp:2 x dp:2 zero=1", "precision=bf16 mesh=pp:2,dp:2 microbatches=4 zero=1", 4),
    ("bf16 cp:2 ring", "precision=bf16 mesh=cp:2", 2),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    w, b, run = harness.tools(args.bin, args.workdir)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    run(b("ptc-tokenize"), "-o", w("data.bin"), "/usr/share/common-licenses/GPL-3")
    run(b("ptc-model"), "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16",
        "--vocab", "256", "--batch", "8", "-o", w("gpt.mlir"))

    def compile_plan(tag, options):
        plan = w(f"{tag}.plan")
        run(b("ptc-opt"), w("gpt.mlir"), f"--ptc-compile=plan={plan} {options}", "-o", os.devnull)
        return plan

    def train(tag, plan, ranks, extra=()):
        cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(args.steps),
               "--metrics", w(f"{tag}.jsonl"), "--log-every", "0", "--threads", "1",
               "--device", "cpu-discrete", "--memory-report", *extra]
        if ranks > 1:
            cmd += ["--np", str(ranks)]
        out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
        losses = [json.loads(line)["loss"] for line in open(w(f"{tag}.jsonl"))]
        return losses, out

    def memory(out):
        """Per rank: (device tensors, allocated, predicted, host, predicted host)."""
        ranks = {}
        for m in re.finditer(r"memory \(rank (\d+)\): allocated (\d+) B \(tensors (\d+) .*?"
                             r"predicted (\d+) B", out):
            ranks[int(m[1])] = [int(m[3]), int(m[2]), int(m[4]), 0, 0]
        for m in re.finditer(r"memory \(rank (\d+)\): offloaded to host memory (\d+) B, "
                             r"predicted (\d+) B", out):
            ranks[int(m[1])][3:] = [int(m[2]), int(m[3])]
        return ranks

    ok = True
    for name, options, ranks in LAYOUTS:
        tag = re.sub(r"[^a-z0-9]+", "_", name)
        base, base_out = train(tag + "_base", compile_plan(tag + "_base", options), ranks)
        offl, offl_out = train(tag + "_offload",
                               compile_plan(tag + "_offload", options + " offload=optimizer"),
                               ranks)
        mb, mo = memory(base_out), memory(offl_out)
        exact = offl == base and len(offl) == args.steps
        predicted = all(v[1] == v[2] and v[3] == v[4] and v[3] > 0 for v in mo.values())
        saved = min(mb[r][0] - mo[r][0] for r in mo)
        moved = all(mb[r][0] - mo[r][0] >= 0.9 * mb[r][0] for r in mo)
        good = exact and predicted and moved and mo and mo.keys() == mb.keys()
        ok &= good
        print(f"{name:26s} losses {'bitwise equal' if exact else 'DIFFER'}; device tensors "
              f"{max(v[0] for v in mb.values())} -> {max(v[0] for v in mo.values())} B "
              f"(-{saved} B), host {max(v[3] for v in mo.values())} B, allocation "
              f"{'= prediction' if predicted else '!= PREDICTION'}: {'ok' if good else 'FAIL'}")
        if not exact:
            print("  without offload:", base, "\n  with offload:   ", offl)

    # Checkpoints: written under offload, resumed under offload and without it (the
    # checkpoint does not depend on where tensors live): bitwise both.
    plan = compile_plan("ck_offload", "precision=bf16 offload=optimizer")
    full, _ = train("ck_full", plan, 1)
    ckpt = w("ckpt")
    subprocess.run(["rm", "-rf", ckpt], check=True)
    half = args.steps // 2
    subprocess.run([b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(half),
                    "--log-every", "0", "--threads", "1", "--device", "cpu-discrete",
                    "--checkpoint-dir", ckpt], check=True, env=env, stdout=subprocess.DEVNULL)
    resumed, _ = train("ck_resumed", plan, 1, ["--resume", ckpt])
    same = resumed[-(args.steps - half):] == full[half:]
    other, _ = train("ck_other", compile_plan("ck_plain", "precision=bf16"), 1, ["--resume", ckpt])
    same_plain = other[-(args.steps - half):] == full[half:]
    good = same and same_plain
    ok &= good
    print(f"checkpoint under offload: resumed bitwise under offload {'yes' if same else 'NO'}, "
          f"without offload {'yes' if same_plain else 'NO'}: {'ok' if good else 'FAIL'}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
