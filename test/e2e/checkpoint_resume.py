#!/usr/bin/python3
"""Distributed checkpoints: a run interrupted and resumed equals the uninterrupted run.

Same layout: losses and saved weights bitwise equal (one rank, dp:2 x tp:2,
pp:2 x dp:2 with ZeRO-3, bf16 with dynamic loss scaling, and asynchronous checkpoints). Another layout (and
rank count): within 1e-5 relative (losses) and 1e-5 absolute (weights) of the
uninterrupted run; with dropout (the masks keyed by the checkpointed seed and
step) the same, and resuming with another --seed warns. Crash safety: rank 0 killed while writing a checkpoint leaves
the previous one, which resumes to the same losses; Muon's state resumes the same way
(bitwise in its layout, within the bounds across layouts) and other Muon settings warn; packed
documents resume with the same boundaries (bitwise in cp:2, within the bounds cp:2 -> pp:2); a truncated or corrupted
shard and a checkpoint of another model are one clear error. Restarts: a rank
killed mid-run under --max-restarts 2 -> the job completes with the losses of the
uninterrupted run; a job that fails before its first step is not restarted.

usage: checkpoint_resume.py --bin BUILD/bin --workdir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import reference_gpt as ref  # noqa: E402

STEPS, CUT = 10, 6
BASE = "optimizer=adamw lr=2e-3 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0 " \
       "lr-schedule=cosine warmup-steps=2 decay-steps=20"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    w, b, run = harness.tools(args.bin, args.workdir)
    run(b("ptc-tokenize"), "-o", w("data.bin"), "/usr/share/common-licenses/GPL-3")
    run(b("ptc-model"), "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
        "--vocab", "256", "--batch", "8", "-o", w("gpt.mlir"))
    run(b("ptc-model"), "gpt", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "32",
        "--vocab", "256", "--batch", "8", "-o", w("other.mlir"))

    def compile_(tag, layout, extra="", model="gpt.mlir"):
        plan = w(f"{tag}.plan")
        run(b("ptc-opt"), w(model), f"--ptc-compile=plan={plan} {BASE} {layout} {extra}", "-o",
            os.devnull)
        return plan

    def ranks(layout):
        n = 1
        for part in layout.split():
            if part.startswith("mesh="):
                for axis in part[5:].split(","):
                    n *= int(axis.split(":")[1])
        return n

    def train(plan, n, tag, steps, extra=(), check=True, env=None):
        # A resumed run appends to its metrics file: start each run's file afresh,
        # so that an earlier invocation's rows never mix in.
        if os.path.exists(w(f"{tag}.jsonl")):
            os.remove(w(f"{tag}.jsonl"))
        cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(steps), "--log-every",
               "0", "--threads", "1", "--metrics", w(f"{tag}.jsonl"), "--save",
               w(f"{tag}.safetensors"), *extra]
        if n > 1:
            cmd += ["--np", str(n)]
        e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 OMPI_MCA_rmaps_base_oversubscribe="1", **(env or {}))
        r = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check and r.returncode != 0:
            print(r.stdout[-3000:])
            raise SystemExit(f"FAILED: {' '.join(cmd)}")
        return r

    def error_line(r):
        return next((l for l in r.stdout.splitlines() if "error" in l), "(no error)")[:120]

    def losses(tag):
        by_step = {}
        for line in open(w(f"{tag}.jsonl")):
            row = json.loads(line)
            by_step[row["step"]] = row["loss"]  # a restarted run repeats steps: the last counts
        return [by_step[s] for s in sorted(by_step)]

    def weights(tag):
        return ref.load_safetensors(w(f"{tag}.safetensors"))

    ok = True

    def report(name, good, detail):
        nonlocal ok
        ok &= good
        print(f"{name:44s} {detail}: {'ok' if good else 'MISMATCH'}")

    def compare(name, tag, base, exact):
        a, b_ = losses(tag), losses(base)
        wa, wb = weights(tag), weights(base)
        if exact:
            same = a == b_ and all((wa[k] == wb[k]).all().item() for k in wb)
            report(name, same and len(a) == STEPS, "bitwise" if same else f"losses {a} vs {b_}")
            return
        loss_err = max(abs(x - y) / abs(y) for x, y in zip(a, b_))
        weight_err = max((wa[k] - wb[k]).abs().max().item() for k in wb)
        report(name, len(a) == STEPS and loss_err <= 1e-5 and weight_err <= 1e-5,
               f"loss rel err {loss_err:.1e}, weight abs err {weight_err:.1e}")

    def interrupted(tag, plan_a, n_a, plan_b, n_b):
        """CUT steps with plan_a writing checkpoints, then plan_b resumes to STEPS."""
        ck = w(f"{tag}.ckpt")
        shutil.rmtree(ck, ignore_errors=True)
        train(plan_a, n_a, f"{tag}.first", CUT, ["--checkpoint-dir", ck, "--checkpoint-every", "3"])
        shutil.copy(w(f"{tag}.first.jsonl"), w(f"{tag}.jsonl"))
        r = train(plan_b, n_b, f"{tag}.second", STEPS, ["--resume", ck])
        with open(w(f"{tag}.jsonl"), "a") as out:
            out.write(open(w(f"{tag}.second.jsonl")).read())
        shutil.copy(w(f"{tag}.second.safetensors"), w(f"{tag}.safetensors"))
        return r

    # Same layout: bitwise.
    layouts = {"1": "", "dp2tp2": "mesh=dp:2,tp:2", "pp2dp2z3": "mesh=pp:2,dp:2 microbatches=4 zero=3",
               "bf16dyn": "precision=bf16 dynamic-loss-scale=true loss-scale-init=1e6 loss-scale-window=3",
               "dp4z3": "mesh=dp:4 zero=3", "tp2": "mesh=tp:2", "pp2": "mesh=pp:2 microbatches=4"}
    plans = {tag: compile_(tag, layout) for tag, layout in layouts.items()}
    for tag in ("1", "dp2tp2", "pp2dp2z3", "bf16dyn"):
        n = ranks(layouts[tag])
        train(plans[tag], n, f"full-{tag}", STEPS)
        interrupted(f"resumed-{tag}", plans[tag], n, plans[tag], n)
        compare(f"same layout {tag}", f"resumed-{tag}", f"full-{tag}", exact=True)
    # Asynchronous checkpoints (written by a thread, published a step later) resume the same.
    ck = w("async.ckpt")
    shutil.rmtree(ck, ignore_errors=True)
    train(plans["dp2tp2"], 4, "async.first", CUT,
          ["--checkpoint-dir", ck, "--checkpoint-every", "3", "--async-checkpoint"])
    shutil.copy(w("async.first.jsonl"), w("async.jsonl"))
    train(plans["dp2tp2"], 4, "async.second", STEPS, ["--resume", ck])
    with open(w("async.jsonl"), "a") as out:
        out.write(open(w("async.second.jsonl")).read())
    shutil.copy(w("async.second.safetensors"), w("async.safetensors"))
    compare("same layout dp2tp2, --async-checkpoint", "async", "full-dp2tp2", exact=True)
    # Another layout: the uninterrupted single-rank run is the reference.
    for a, b_ in (("dp2tp2", "1"), ("1", "pp2dp2z3"), ("dp4z3", "tp2"), ("pp2", "dp2tp2")):
        interrupted(f"cross-{a}-{b_}", plans[a], ranks(layouts[a]), plans[b_], ranks(layouts[b_]))
        compare(f"{a} -> {b_}", f"cross-{a}-{b_}", "full-1", exact=False)

    # Dropout: the masks are keyed by (seed, step), which the checkpoint keeps: a resumed run
    # draws the uninterrupted run's masks (bitwise in the same layout, and in another).
    run(b("ptc-model"), "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
        "--vocab", "256", "--batch", "8", "--dropout", "0.1", "-o", w("dropout.mlir"))
    drop = {tag: compile_(f"dropout-{tag}", layout, model="dropout.mlir")
            for tag, layout in (("1", ""), ("dp2tp2", "mesh=dp:2,tp:2"),
                                ("pp2", "mesh=pp:2 microbatches=4"))}
    train(drop["1"], 1, "dropout-full-1", STEPS)
    train(drop["dp2tp2"], 4, "dropout-full-dp2tp2", STEPS)
    interrupted("dropout-resumed-dp2tp2", drop["dp2tp2"], 4, drop["dp2tp2"], 4)
    compare("dropout 0.1, same layout dp2tp2", "dropout-resumed-dp2tp2", "dropout-full-dp2tp2",
            exact=True)
    interrupted("dropout-cross", drop["dp2tp2"], 4, drop["pp2"], 2)
    compare("dropout 0.1, dp2tp2 -> pp2", "dropout-cross", "dropout-full-1", exact=False)
    r = train(drop["1"], 1, "dropout-seed", STEPS,
              ["--resume", w("dropout-resumed-dp2tp2.ckpt"), "--seed", "7"])
    report("dropout, resumed with another --seed", "dropout's masks changed" in r.stdout,
           "warns" if "dropout's masks changed" in r.stdout else "no warning")

    # Muon (momentum buffers of the hidden matrices, AdamW state of the rest): bitwise in the
    # same layout (its stacks dealt over dp under ZeRO-3), and across layouts; a resume with
    # other Muon settings warns.
    muon = {tag: compile_(f"muon-{tag}", layout, extra="optimizer=muon")
            for tag, layout in (("1", ""), ("dp4z3", "mesh=dp:4 zero=3"),
                                ("pp2", "mesh=pp:2 microbatches=4"), ("tp2", "mesh=tp:2"))}
    train(muon["1"], 1, "muon-full-1", STEPS)
    train(muon["dp4z3"], 4, "muon-full-dp4z3", STEPS)
    interrupted("muon-resumed-dp4z3", muon["dp4z3"], 4, muon["dp4z3"], 4)
    compare("muon, same layout dp4z3", "muon-resumed-dp4z3", "muon-full-dp4z3", exact=True)
    for a, b_ in (("dp4z3", "pp2"), ("tp2", "1")):
        interrupted(f"muon-cross-{a}-{b_}", muon[a], ranks("mesh=dp:4" if a == "dp4z3" else "mesh=tp:2"),
                    muon[b_], 2 if b_ == "pp2" else 1)
        compare(f"muon, {a} -> {b_}", f"muon-cross-{a}-{b_}", "muon-full-1", exact=False)
    other_muon = compile_("muon-other", "", extra="optimizer=muon muon-momentum=0.9")
    r = train(other_muon, 1, "muon-other", STEPS, ["--resume", w("muon-resumed-dp4z3.ckpt")])
    report("muon, resumed with another momentum", "muon-momentum" not in r.stdout and
           "momentum=0.9 " in r.stdout and "written with optimizer" in r.stdout,
           "warns" if "written with optimizer" in r.stdout else "no warning")

    # Packed documents: the positions are recomputed from the resumed windows, so the run
    # continues with the same boundaries (bitwise in the same layout, and across layouts).
    run(b("ptc-model"), "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
        "--vocab", "256", "--batch", "8", "--document-end", "32", "-o", w("documents.mlir"))
    docs = {tag: compile_(f"documents-{tag}", layout, model="documents.mlir")
            for tag, layout in (("1", ""), ("cp2", "mesh=cp:2"), ("pp2", "mesh=pp:2 microbatches=4"))}
    train(docs["1"], 1, "documents-full-1", STEPS)
    train(docs["cp2"], 2, "documents-full-cp2", STEPS)
    interrupted("documents-resumed-cp2", docs["cp2"], 2, docs["cp2"], 2)
    compare("documents, same layout cp2", "documents-resumed-cp2", "documents-full-cp2", exact=True)
    interrupted("documents-cross", docs["cp2"], 2, docs["pp2"], 2)
    compare("documents, cp2 -> pp2", "documents-cross", "documents-full-1", exact=False)

    # Killed while writing the checkpoint of step 6: step 3's remains and resumes. The
    # --np launcher removes the half-written one once every rank is gone; one a job run
    # otherwise (srun) leaves behind is reported and ignored.
    ck = w("crash.ckpt")
    shutil.rmtree(ck, ignore_errors=True)
    r = train(plans["dp2tp2"], 4, "crash.first", CUT, ["--checkpoint-dir", ck, "--checkpoint-every", "3"],
              check=False, env={"PTC_FAULT_CHECKPOINT_KILL": "6"})
    latest = open(os.path.join(ck, "latest")).read().strip()
    temp = os.path.join(ck, ".step-00000006.tmp")
    left = os.path.isdir(temp)
    report("killed while writing a checkpoint", r.returncode != 0 and latest == "step-00000003" and
           not left, f"exit {r.returncode}, latest {latest}, temporary left {left}")
    os.makedirs(temp)
    r = train(plans["dp2tp2"], 4, "crash.second", STEPS, ["--resume", ck])
    resumed_at = "resumed from" in r.stdout and "at step 3" in r.stdout
    reported = "ignoring the incomplete checkpoint" in r.stdout
    full = losses("full-dp2tp2")
    report("  ... resumes from the previous one", resumed_at and reported and
           losses("crash.second") == full[3:], f"resumed at 3: {resumed_at}, reported: {reported}")

    # Corrupt shards and another model: one clear error each.
    good = os.path.join(w("resumed-dp2tp2.ckpt"), "step-00000006")
    for what in ("truncated", "corrupted"):
        bad = w(f"{what}.ckpt")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(good, bad)
        shard = os.path.join(bad, "rank-00001.safetensors")
        data = bytearray(open(shard, "rb").read())
        data = data[:len(data) // 2] if what == "truncated" else data[:-9] + bytes([data[-9] ^ 1]) + data[-8:]
        open(shard, "wb").write(data)
        r = train(plans["1"], 1, f"{what}.run", STEPS, ["--resume", bad], check=False)
        report(f"{what} shard", r.returncode == 1 and "rank-00001.safetensors" in r.stdout and
               "corrupt" in r.stdout, error_line(r))
    other = compile_("other", "", model="other.mlir")
    r = train(other, 1, "other.run", STEPS, ["--resume", good], check=False)
    report("another model", r.returncode == 1 and "is of another model" in r.stdout, error_line(r))

    # A rank killed at step 7 under --max-restarts 2: restarted from step 6, done.
    ck = w("restart.ckpt")
    shutil.rmtree(ck, ignore_errors=True)
    marker = w("restart.killed")
    if os.path.exists(marker):
        os.remove(marker)
    r = train(plans["dp2tp2"], 4, "restart", STEPS,
              ["--checkpoint-dir", ck, "--checkpoint-every", "3", "--max-restarts", "2"],
              check=False, env={"PTC_FAULT_KILL": f"2:7:{marker}"})
    restarted = "restart 1 of 2 from the checkpoint" in r.stdout
    report("rank killed, --max-restarts 2", r.returncode == 0 and restarted and
           losses("restart") == full, f"exit {r.returncode}, restarted: {restarted}")

    # A job that fails before its first step (here: weights of another shape) is not
    # restarted: a restart would fail the same way.
    r = train(plans["dp2tp2"], 4, "startfail", STEPS,
              ["--checkpoint-dir", w("startfail.ckpt"), "--max-restarts", "2",
               "--init", w("missing.safetensors")], check=False)
    report("a startup error under --max-restarts 2 is not restarted",
           r.returncode == 1 and "failed before its first step" in r.stdout and
           "restart 1 of 2" not in r.stdout, error_line(r))

    print("checkpoint resume:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
