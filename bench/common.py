"""Helpers shared by the benchmarks: the bench configuration's options, the data file,
and building a GPT (or Llama) plan with ptc-model + ptc-opt."""
import os
import statistics
import subprocess
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = "/usr/share/common-licenses/GPL-3"


def add_model_options(ap, steps):
    """The bench configuration of the issue tracker: 4 layers, hidden 256, 8 heads,
    seq 128, batch 8, vocab 256."""
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama"],
                    help="llama: the Llama bench config (4 kv heads, intermediate 688)")
    ap.add_argument("--kv-heads", type=int, default=4, help="llama only")
    ap.add_argument("--intermediate", type=int, default=688, help="llama only")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: ptc compiles precision=bf16, PyTorch runs under "
                         "torch.autocast('cpu', dtype=torch.bfloat16)")


def model_flops(L, H, A, S, B, V, kv_heads=None, intermediate=None):
    """Training FLOPs of one step: 3x the forward matmuls (incl. the LM head) and
    dense attention (4*B*S*S*H per layer), the convention MFU figures use. With
    kv_heads and intermediate: the Llama (q, k, v, o and the three SwiGLU matmuls)."""
    tokens = B * S
    if kv_heads is None:
        per_layer = 3 * H * H + H * H + 8 * H * H
    else:
        per_layer = 2 * H * H + 2 * H * kv_heads * (H // A) + 3 * H * intermediate
    matmul = 2 * tokens * (L * per_layer + H * V)
    attention = L * 4 * B * S * S * H
    return 3 * (matmul + attention)


def flops_of(a):
    """model_flops of the configuration in `a` (gpt or llama)."""
    if getattr(a, "model", "gpt") == "llama":
        return model_flops(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab, a.kv_heads,
                           a.intermediate)
    return model_flops(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab)


def torch_model(a):
    """The PyTorch reference of the configuration in `a` (test/e2e)."""
    if getattr(a, "model", "gpt") == "llama":
        import reference_llama
        return reference_llama.Llama(a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate,
                                     a.vocab)
    import reference_gpt as ref
    return ref.GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab)


def corpus_tokens():
    return np.frombuffer(open(CORPUS, "rb").read(), dtype=np.uint8).astype(np.uint16)


def write_data(path):
    corpus_tokens().astype("<u2").tofile(path)


def compile_gpt(a, workdir, plan, options):
    """ptc-model gpt (or llama, `a.model`) with the configuration in `a`, then
    ptc-compile with `options`."""
    b = lambda t: os.path.join(a.bin, t)
    mlir = os.path.join(workdir, "gpt.mlir")
    model = getattr(a, "model", "gpt")
    extra = ["--kv-heads", str(a.kv_heads), "--intermediate", str(a.intermediate)] \
        if model == "llama" else []
    subprocess.run([b("ptc-model"), model, "--layers", str(a.layers), "--hidden", str(a.hidden),
                    "--heads", str(a.heads), "--seq", str(a.seq), "--vocab", str(a.vocab),
                    "--batch", str(a.batch), *extra, *getattr(a, "model_args", []), "-o", mlir],
                   check=True)
    subprocess.run([b("ptc-opt"), mlir, f"--ptc-compile=plan={plan} {options}", "-o",
                    os.devnull], check=True)


def ptc_step_seconds(a, workdir, tag, options, ranks, threads):
    """Compiles the bench GPT with `options`, trains it with ptc-run on `ranks`
    processes x `threads` threads, and returns the median step time after warm-up."""
    return ptc_run(a, workdir, tag, options, ranks, threads)[0]


def ptc_run(a, workdir, tag, options, ranks, threads, extra_args=(), extra_env=None):
    """ptc_step_seconds with more ptc-run arguments and environment variables;
    returns the median step time and ptc-run's output."""
    import json
    b = lambda t: os.path.join(a.bin, t)
    w = lambda n: os.path.join(workdir, n)
    plan = w(f"{tag}.plan")
    compile_gpt(a, workdir, plan, "optimizer=adamw lr=1e-3 " + options +
                (" precision=bf16" if getattr(a, "precision", "fp32") == "bf16" else ""))
    cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(a.steps + a.warmup),
           "--log-every", "0", "--threads", str(threads), "--metrics", w(f"{tag}.jsonl"),
           *extra_args]
    if ranks > 1:
        cmd += ["--np", str(ranks)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", **(extra_env or {}))
    out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in open(w(f"{tag}.jsonl"))][a.warmup:]
    return statistics.median(a.batch * a.seq / r["tokens_per_s"] for r in rows), out


def model_args(a):
    """The command-line options that rebuild the configuration in `a`."""
    out = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--layers", str(a.layers),
           "--hidden", str(a.hidden), "--heads", str(a.heads), "--seq", str(a.seq),
           "--batch", str(a.batch), "--vocab", str(a.vocab), "--model", getattr(a, "model", "gpt"),
           "--precision", getattr(a, "precision", "fp32")]
    if getattr(a, "model", "gpt") == "llama":
        out += ["--kv-heads", str(a.kv_heads), "--intermediate", str(a.intermediate)]
    return out


def torch_thread_sweep(a, cores):
    """PyTorch eager's step at every (intra-op threads, BLAS threads) pair from 1 to
    `cores`, with OpenBLAS as this machine's environment configures it ("pinned": it
    sets OPENBLAS_CORETYPE=Haswell) and with those settings unset for that one command
    ("unpinned": OpenBLAS picks its kernels for this CPU, as a user benchmarking here
    would): {(intra, blas, "pinned"|"unpinned"): seconds} (torch_step_seconds). Where the
    environment sets neither variable the two are the same command, run once ("as set")."""
    return {(intra, blas, openblas): torch_step_seconds(a, (intra, blas, openblas))
            for openblas in openblas_variants()
            for intra in range(1, cores + 1)
            for blas in range(1, cores + 1)}


def openblas_variants():
    """("pinned", "unpinned") where this environment configures OpenBLAS's kernels
    (OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE), else ("as set",): the one command there is."""
    pinned = any(v in os.environ for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"))
    return ("pinned", "unpinned") if pinned else ("as set",)


def torch_step_seconds(a, key):
    """PyTorch eager's median step at one sweep point (intra, blas, openblas), in its own
    process with the thread counts in the environment before PyTorch and its BLAS start."""
    import sys
    intra, blas, openblas = key
    env = dict(os.environ, OMP_NUM_THREADS=str(intra), OPENBLAS_NUM_THREADS=str(blas),
               MKL_NUM_THREADS=str(blas))
    if openblas == "unpinned":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    out = subprocess.run([sys.executable, os.path.join(HERE, "torch_step.py"),
                          "--intra", str(intra), *model_args(a)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def paired_rounds(rounds, runs):
    """Runs every (name, function) of `runs` in turn, `rounds` times, so that each
    round measures every side in the same few seconds of the machine (its speed
    drifts over minutes): {name: [seconds per round]}."""
    out = {name: [] for name, _ in runs}
    for _ in range(rounds):
        for name, run in runs:
            out[name].append(run())
    return out


def median_ratio(num, den):
    """The median over rounds of num[i] / den[i], and the ratios."""
    ratios = [n / d for n, d in zip(num, den)]
    return statistics.median(ratios), ratios


def sweep_name(key):
    intra, blas, openblas = key
    return f"pytorch  {intra} intra-op x {blas} BLAS threads, OpenBLAS {openblas}"


def print_torch_sweep(runs, extra=()):
    """Prints every PyTorch figure (the sweep, then `extra` (name, seconds) pairs) and
    returns (name, seconds) of the best."""
    named = [(sweep_name(k), t) for k, t in sorted(runs.items())]
    named += list(extra)
    best = min(named, key=lambda nt: nt[1])
    for name, t in named:
        print(f"{name:55s}: {t * 1e3:8.1f} ms{'  <- best' if (name, t) == best else ''}")
    return best


def time_torch_steps(model, opt, data, steps, warmup, batch, seq, rows=None, autocast=False):
    """Median seconds of a PyTorch training step on the standard batches; `rows`
    (begin, end) keeps only those rows of each global batch (a DDP rank's part);
    `autocast`: the forward pass under torch.autocast("cpu", dtype=torch.bfloat16)."""
    import contextlib
    import torch
    import reference_gpt as ref
    times = []
    for step in range(steps + warmup):
        x, y = ref.batch(data, step, batch, seq)
        if rows:
            x, y = x[rows[0]:rows[1]], y[rows[0]:rows[1]]
        t0 = time.perf_counter()
        with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])
