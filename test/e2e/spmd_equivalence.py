#!/usr/bin/python3
"""Oracle 3: every parallel layout reproduces the single-rank run. Trains the same GPT
from the same initialization on the same batches with a single-rank plan and with
SPMD plans (mpirun), and compares per-step losses (1e-5 relative) and final weights
(1e-4 absolute; weights are O(0.02-1)). An absolute bound, because AdamW normalizes
each gradient element: where the exact gradient is zero (a key bias: softmax ignores
it) or cancels to almost nothing, rounding differences between layouts still move
the weight by a fraction of lr.

usage: spmd_equivalence.py --bin BUILD/bin --workdir DIR [--layouts dp:2 tp:2 tp:2+sp ...]
                           [--device cpu-discrete] [--model gpt|llama|gpt-moe|llama-moe]
                           [--precision bf16]
                           [--optimizer adamw|adafactor|muon] [--dropout P] [--document-end ID]
(--model llama: 4 heads over 2 kv heads, untied head; -moe: 4 experts, top-2, capacity
factor 1.0 (tokens are dropped), aux and z-losses, gpt-moe with a shared expert and
auxiliary-loss-free bias balancing; --precision bf16: every run, the
baseline too, computes in bf16; each rank rounds its partial sums to bf16 where one rank
rounds the whole sum once, so the bounds are 2e-4 (losses) and 2e-2 (weights) there;
--dropout P: the GPT drops with probability P after its embeddings, attentions and MLPs, every
layout must draw the single rank's masks, the single rank's losses must differ from the same
run's without dropout, and evaluation must run without it; --document-end ID: packed documents,
token ID ends one (attention stops and positions restart there), and the single rank's losses
must differ from the same run's as one stream, while a model whose end token never occurs
gives the stream's first loss bitwise)
(layout "1": one process; +sb small gradient buckets (bucket-mb=0.02: many, interleaved with
the backward pass); +sp adds sequence parallelism, +zeroN a ZeRO stage, +mbN N micro-batches, +gpipe / +1f1b /
+zb-h1 / +ilV a pipeline schedule, ilV: interleaved 1F1B with V virtual stages, +rfull /
+rselective activation recomputation, +keep ZeRO-3 without resharding after forward, +ring /
+ulysses: context parallelism's attention)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import reference_gpt as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--layouts", nargs="+",
                    default=["dp:2", "tp:2", "tp:2+sp", "dp:2,tp:2", "dp:2,tp:2+sp", "dp:2+zero1",
                             "dp:2+zero2", "dp:2+zero3", "dp:4", "dp:4+zero1", "dp:4+zero2",
                             "dp:4+zero3", "dp:2,tp:2+zero3", "pp:2,dp:2+mb4+zero3", "dp:2,tp:2+sb",
                             "dp:2+zero3+keep"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama", "gpt-moe", "llama-moe"])
    ap.add_argument("--seq", type=int, default=32, help="sequence length of the model")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "adafactor", "muon"])
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--document-end", type=int, default=None)
    ap.add_argument("--device", default="cpu",
                    help="ptc-run --device of the layouts (the single-rank baseline runs on the cpu)")
    args = ap.parse_args()
    w, b, run = harness.tools(args.bin, args.workdir)

    text = open("/usr/share/common-licenses/GPL-3", "rb").read()[:30000]
    open(w("text.txt"), "wb").write(text)
    run(b("ptc-tokenize"), "-o", w("data.bin"), w("text.txt"))
    model = args.model.split("-")[0]
    extra = ["--kv-heads", "2", "--intermediate", "176"] if model == "llama" else []
    if args.model.endswith("-moe"):
        extra += ["--moe-experts", "4", "--moe-top-k", "2", "--moe-capacity-factor", "1.0",
                  "--moe-ffn", "96", "--moe-aux-loss", "0.01", "--moe-z-loss", "0.001"]
        if model == "gpt":
            extra += ["--moe-shared-experts", "1", "--moe-bias-balancing", "0.002"]
    shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", str(args.seq), "--vocab",
             "256", "--batch", str(args.batch), *extra]
    dropout = ["--dropout", str(args.dropout)] if args.dropout > 0 else []
    documents = ["--document-end", str(args.document_end)] if args.document_end is not None else []
    run(b("ptc-model"), model, *shape, *dropout, *documents, "-o", w("gpt.mlir"))
    opts = "optimizer=adamw lr=1e-3 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0"
    if args.optimizer == "adafactor":
        opts = "optimizer=adafactor lr=1e-3 adafactor-beta1=0.9 weight-decay=0.1"
    elif args.optimizer == "muon":
        opts = "optimizer=muon lr=1e-3 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0"
    if args.precision != "fp32":
        opts += f" precision={args.precision}"

    def train(layout, tag, device="cpu", model_file="gpt.mlir"):
        plan = w(f"{tag}.plan")
        if layout == "1":
            layout = None
        mods = layout.split("+")[1:] if layout else []
        layout = layout.split("+")[0] if layout else layout
        mesh = (f" mesh={layout}" if layout else "") + \
            (" sequence-parallel=true" if "sp" in mods else "") + \
            (" bucket-mb=0.02" if "sb" in mods else "") + \
            "".join(f" zero={m[4:]}" for m in mods if m.startswith("zero")) + \
            "".join(f" microbatches={m[2:]}" for m in mods if m.startswith("mb")) + \
            "".join(f" schedule={m}" for m in mods if m in ("gpipe", "1f1b", "zb-h1")) + \
            "".join(f" recompute={m[1:]}" for m in mods if m in ("rfull", "rselective")) + \
            (" reshard-after-forward=false" if "keep" in mods else "") + \
            (" cp-attention=ring" if "ring" in mods else "") + \
            (" cp-attention=ulysses" if "ulysses" in mods else "") + \
            "".join(f" schedule=interleaved-1f1b virtual-stages={m[2:]}"
                    for m in mods if m.startswith("il"))
        run(b("ptc-opt"), w(model_file), f"--ptc-compile=plan={plan} {opts}{mesh}", "-o", os.devnull)
        ranks = 1
        for part in (layout or "").split(","):
            if part:
                ranks *= int(part.split(":")[1])
        cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(args.steps),
               "--metrics", w(f"{tag}.jsonl"), "--save", w(f"{tag}.safetensors"),
               "--log-every", "0", "--threads", "1", "--device", device]
        if ranks > 1:
            cmd += ["--np", str(ranks)]
        run(*cmd)
        losses = [json.loads(line)["loss"] for line in open(w(f"{tag}.jsonl"))]
        return losses, ref.load_safetensors(w(f"{tag}.safetensors"))

    base_losses, base_weights = train(None, "single")
    loss_bound, weight_bound = (1e-5, 1e-4) if args.precision == "fp32" else (2e-4, 2e-2)
    ok = True
    if dropout:
        # The masks must do something: the same run without dropout differs.
        run(b("ptc-model"), model, *shape, "-o", w("plain.mlir"))
        plain, _ = train(None, "plain", model_file="plain.mlir")
        diff = max(abs(a - b) / abs(b) for a, b in zip(base_losses, plain))
        ok &= diff > 1e-3
        print(f"dropout {args.dropout}: single-rank losses differ from no dropout's by up to "
              f"{diff:.2e} rel: {'ok' if diff > 1e-3 else 'NO EFFECT'}")
        # Evaluation runs without dropout: at lr 0 (the weights stay the initial ones) both
        # models' eval losses are the same bits.
        evals = []
        for tag, source in (("eval-dropout", "gpt.mlir"), ("eval-plain", "plain.mlir")):
            run(b("ptc-opt"), w(source), f"--ptc-compile=plan={w(tag + '.plan')} optimizer=adamw lr=0",
                "-o", os.devnull)
            run(b("ptc-run"), w(tag + ".plan"), "--data", w("data.bin"), "--steps", "1",
                "--eval-data", w("data.bin"), "--eval-steps", "2", "--eval-every", "1", "--metrics", w(tag + ".jsonl"),
                "--log-every", "0", "--threads", "1")
            rows = [json.loads(line) for line in open(w(tag + ".jsonl"))]
            evals.append(next(r["eval_loss"] for r in rows if "eval_loss" in r))
        same = evals[0] == evals[1]
        ok &= same
        print(f"evaluation without dropout: eval loss {evals[0]!r} vs {evals[1]!r} without dropout: "
              f"{'ok' if same else 'MISMATCH'}")
    if documents:
        # The boundaries must do something: the same run as one stream differs; a model
        # whose end token (byte 255) never occurs in the text computes the stream's
        # first loss bitwise (its positions count 0, 1, ...).
        assert 255 not in text
        run(b("ptc-model"), model, *shape, "-o", w("stream.mlir"))
        run(b("ptc-model"), model, *shape, "--document-end", "255", "-o", w("none.mlir"))
        stream, _ = train(None, "stream", model_file="stream.mlir")
        unbroken, _ = train(None, "unbroken", model_file="none.mlir")
        diff = max(abs(a - b) / abs(b) for a, b in zip(base_losses, stream))
        same = unbroken[0] == stream[0]
        ok &= diff > 1e-3 and same
        print(f"packed documents (end token {args.document_end}): losses differ from one "
              f"stream's by up to {diff:.2e} rel: {'ok' if diff > 1e-3 else 'NO EFFECT'}; "
              f"no boundary: first loss {unbroken[0]!r} vs {stream[0]!r}: "
              f"{'bitwise equal' if same else 'MISMATCH'} (max rel over {args.steps} steps "
              f"{max(abs(a - b) / abs(b) for a, b in zip(unbroken, stream)):.1e})")
    for layout in args.layouts:
        tag = layout.replace(":", "").replace(",", "x").replace("+", "-")
        losses, weights = train(layout, tag, args.device)
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, base_losses))
        weight_err, worst = 0.0, ""
        for name, t in base_weights.items():
            err = (weights[name] - t).abs().max().item()
            if err > weight_err:
                weight_err, worst = err, name
        good = len(losses) == args.steps and loss_err <= loss_bound and weight_err <= weight_bound
        ok &= good
        print(f"{layout:22s} loss rel err {loss_err:.2e} (bound {loss_bound:g}), weight abs err "
              f"{weight_err:.2e} (bound {weight_bound:g}, {worst}): {'ok' if good else 'MISMATCH'}")
    print("spmd equivalence:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
