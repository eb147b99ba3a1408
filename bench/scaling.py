#!/usr/bin/env python3
"""Strong and weak scaling: measured here, and predicted by ptc-plan.

Here (the bench configuration, fp32 AdamW): dp, tp and pp on 1, 2 and 4 ranks
(each rank gets cores / ranks threads; more ranks than cores are oversubscribed
and labelled so). Strong scaling keeps the global batch (8 sequences); weak
scaling keeps the batch per rank (4 sequences per rank). Every measured point
is printed beside ptc-plan's prediction for it (calibrated on this machine).

On an H100 cluster description (h100-ib: 8 GPUs per node, NVLink, 400 Gb/s
InfiniBand per GPU): a GPT-3 175B class model (96 layers, hidden 12288, 96
heads, seq 2048) from 64 to 4096 GPUs, the planner's best layout at each size:
strong scaling with a global batch of 1536 sequences, weak scaling with 1.5
sequences per GPU.

Writes scaling.md (the tables) and scaling-here.png, scaling-175b.png to --out.

    /usr/bin/python3 bench/scaling.py [--out DIR] [--calibrated calib.json] [--skip-measure]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

GPT3 = ["--model", "gpt", "--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048",
        "--vocab", "51200"]
GPU_COUNTS = [64, 128, 256, 512, 1024, 2048, 4096]


def planner(a, args, out):
    subprocess.run([os.path.join(a.bin, "ptc-plan"), *args, "--json", out], check=True, stdout=subprocess.DEVNULL)
    return json.load(open(out))[0]


def layout_for(axis, ranks, batch):
    """ptc-plan --layout for `ranks` devices along `axis` (a micro-batch per replica)."""
    if axis == "dp":
        return f"dp={ranks},mbs={batch // ranks}"
    if axis == "tp":
        return f"tp={ranks},mbs={batch}"
    return f"pp={ranks},mbs={max(1, batch // (2 * ranks))}"  # 2 x pp micro-batches


def measure_here(a, wd, calib, lines):
    cores = os.cpu_count() or 1
    common.write_data(os.path.join(wd, "data.bin"))
    rows = []
    lines.append("## Measured here vs predicted (bench config, fp32 AdamW)\n")
    lines.append(f"{cores} cores; ranks beyond that are oversubscribed. Strong: global batch 8; weak: 4 per rank.\n")
    lines.append("| scaling | axis | ranks | threads each | batch | measured step | predicted step | error | "
                 "tokens/s measured | speed-up measured | speed-up predicted | note |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in ("strong", "weak"):
        for axis in ("dp", "tp", "pp"):
            base = None
            for ranks in (1, 2, 4):
                batch = 8 if kind == "strong" else 4 * ranks
                if axis == "pp" and ranks == 1:
                    layout = f"dp=1,mbs={batch}"
                else:
                    layout = layout_for(axis, ranks, batch)
                threads = max(1, cores // ranks)
                model = ["--model", "gpt", "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads",
                         str(a.heads), "--seq", str(a.seq), "--vocab", str(a.vocab), "--global-batch", str(batch)]
                pred = planner(a, model + ["--gpus", str(ranks), "--calibrated", calib, "--layout", layout],
                               os.path.join(wd, "p.json"))
                a.batch = batch
                t = common.ptc_step_seconds(a, wd, f"{kind}-{axis}-{ranks}", pred["options"], ranks, threads)
                tokens = batch * a.seq / t
                pred_tokens = batch * a.seq / pred["step_seconds"]
                if base is None:
                    base = (tokens, pred_tokens)
                note = "oversubscribed" if ranks > cores else ""
                rows.append(dict(kind=kind, axis=axis, ranks=ranks, measured=t, predicted=pred["step_seconds"],
                                 tokens=tokens, pred_tokens=pred_tokens, speedup=tokens / base[0],
                                 pred_speedup=pred_tokens / base[1], note=note))
                r = rows[-1]
                lines.append(f"| {kind} | {axis} | {ranks} | {threads} | {batch} | {t * 1e3:.1f} ms | "
                             f"{pred['step_seconds'] * 1e3:.1f} ms | {100 * (pred['step_seconds'] / t - 1):+.1f}% | "
                             f"{tokens:.0f} | {r['speedup']:.2f} | {r['pred_speedup']:.2f} | {note} |")
                print(lines[-1], flush=True)
    return rows


def predict_175b(a, wd, lines):
    lines.append("\n## Predicted: GPT-3 175B class on h100-ib (bf16, the planner's best layout at each size)\n")
    lines.append("| scaling | GPUs | global batch | best layout | step | tokens/s | TFLOP/s per GPU | MFU | "
                 "scaling efficiency |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for kind in ("strong", "weak"):
        base = None
        for gpus in GPU_COUNTS:
            batch = 1536 if kind == "strong" else gpus * 3 // 2
            e = planner(a, GPT3 + ["--global-batch", str(batch), "--gpus", str(gpus), "--cluster", "h100-ib",
                                   "--top", "1"], os.path.join(wd, "p.json"))
            if base is None:
                base = (gpus, e["tokens_per_second"])
            eff = (e["tokens_per_second"] / base[1]) / (gpus / base[0])
            rows.append(dict(kind=kind, gpus=gpus, tokens=e["tokens_per_second"], eff=eff, mfu=e["mfu"]))
            lines.append(f"| {kind} | {gpus} | {batch} | {e['layout']} | {e['step_seconds']:.2f} s | "
                         f"{e['tokens_per_second']:.0f} | {e['tflops_per_device']:.0f} | {100 * e['mfu']:.1f}% | "
                         f"{100 * eff:.0f}% |")
            print(lines[-1], flush=True)
    return rows


def plot(out, here, big):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if here:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, kind in zip(axes, ("strong", "weak")):
            for axis, color in (("dp", "C0"), ("tp", "C1"), ("pp", "C2")):
                pts = [r for r in here if r["kind"] == kind and r["axis"] == axis]
                x = [r["ranks"] for r in pts]
                ax.plot(x, [r["tokens"] for r in pts], "o-", color=color, label=f"{axis} measured")
                ax.plot(x, [r["pred_tokens"] for r in pts], "x--", color=color, label=f"{axis} predicted")
            ax.axvspan(2.5, 4.5, color="0.9", label="oversubscribed")
            ax.set_xticks([1, 2, 4])
            ax.set_xlabel("ranks")
            ax.set_ylabel("tokens/s")
            ax.set_title(f"{kind} scaling here (bench config)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "scaling-here.png"), dpi=110)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, marker in (("strong", "o-"), ("weak", "s-")):
        pts = [r for r in big if r["kind"] == kind]
        axes[0].loglog([r["gpus"] for r in pts], [r["tokens"] for r in pts], marker, base=2, label=kind)
        axes[1].semilogx([r["gpus"] for r in pts], [100 * r["eff"] for r in pts], marker, base=2, label=kind)
    axes[0].set_ylabel("tokens/s (predicted)")
    axes[1].set_ylabel("scaling efficiency % (predicted)")
    for ax in axes:
        ax.set_xlabel("H100 GPUs")
        ax.legend()
    axes[0].set_title("GPT-3 175B class on h100-ib")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling-175b.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_model_options(ap, steps=10)
    ap.add_argument("--out", default="scaling-results")
    ap.add_argument("--calibrated", help="a ptc-plan --calibrate file (default: calibrate now)")
    ap.add_argument("--skip-measure", action="store_true", help="only the predicted 175B curves")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines = ["# Scaling study (bench/scaling.py)\n"]
    with tempfile.TemporaryDirectory() as wd:
        here = []
        if not a.skip_measure:
            calib = a.calibrated or os.path.join(wd, "calib.json")
            if not a.calibrated:
                subprocess.run([os.path.join(a.bin, "ptc-plan"), "--calibrate", "-o", calib], check=True,
                               stdout=subprocess.DEVNULL)
            here = measure_here(a, wd, calib, lines)
        big = predict_175b(a, wd, lines)
    with open(os.path.join(a.out, "scaling.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(a.out, here, big)
    print(f"wrote {a.out}/scaling.md" + ("" if a.skip_measure else f", {a.out}/scaling-here.png") +
          f", {a.out}/scaling-175b.png")


if __name__ == "__main__":
    main()
