#!/usr/bin/python3
"""Benchmark: data parallelism on this machine, in one invocation.
  ptc-run 1 process (2 threads)  vs  ptc-run dp=2 (2 processes x 1 thread), same global batch,
  against PyTorch at its best on the same 2 cores: DDP (gloo, one process per core, 1 intra-op
  and 1 BLAS thread each) and one process at every intra-op x BLAS thread combination.
Prints every figure and the ratios against DDP and against PyTorch's best. The ratio
against DDP is the median over --rounds paired rounds: ptc-run dp=2 and DDP (with OpenBLAS
as it ran best) one after the other, round after round, so that a drift of this machine's
speed (it changes over minutes) moves both sides of each ratio.

usage: bench/dp_scaling.py [--bin build/bin] [--steps 20] [--rounds 3]
       [--layers 4 --hidden 256 --heads 8 --seq 128 --batch 8]
"""
import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "test", "e2e"))
import common  # noqa: E402


def ddp_worker(rank, world, cfg, port, steps, warmup, out, autocast=False):
    import torch
    import torch.distributed as dist
    import reference_gpt as ref
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    L, H, A, S, B, V = cfg
    model = torch.nn.parallel.DistributedDataParallel(ref.GPT(L, H, A, S, V))
    opt = ref.make_optimizer(model.module, "adamw", lr=1e-3)
    local = B // world
    step = common.time_torch_steps(model, opt, common.corpus_tokens(), steps, warmup, B, S,
                                   rows=(rank * local, (rank + 1) * local), autocast=autocast)
    if rank == 0:
        out.put(step)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=20)
    ap.add_argument("--rounds", type=int, default=3,
                    help="paired rounds of ptc-run dp=2 and DDP (the ratio's median)")
    a = ap.parse_args()
    cfg = (a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab)
    workdir = tempfile.TemporaryDirectory()
    d = workdir.name
    common.write_data(os.path.join(d, "data.bin"))
    ptc = lambda mesh, ranks, threads: common.ptc_step_seconds(
        a, d, f"gpt-{ranks}", f"mesh={mesh}" if mesh else "", ranks, threads)
    one = ptc(None, 1, 2)

    sweep = common.torch_thread_sweep(a, 2)
    # One process per core: one intra-op and one BLAS thread each (set before the
    # spawned workers start PyTorch).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")

    def ddp(openblas):
        """DDP's step with OpenBLAS as the environment pins it, or unpinned."""
        saved = {v: os.environ.get(v) for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        if openblas == "unpinned":
            for v in saved:
                os.environ.pop(v, None)
        q = ctx.SimpleQueue()
        port = 29500 + os.getpid() % 1000 + (7 if openblas == "unpinned" else 0)
        procs = [ctx.Process(target=ddp_worker, args=(r, 2, cfg, port, a.steps, a.warmup, q,
                                                      a.precision == "bf16"))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        for v, val in saved.items():
            if val is not None:
                os.environ[v] = val
        return q.get()

    ddps = {o: ddp(o) for o in common.openblas_variants()}
    ddp_mode = min(ddps, key=ddps.get)
    rounds = common.paired_rounds(a.rounds, [("ptc", lambda: ptc("dp:2", 2, 1)),
                                             ("ddp", lambda: ddp(ddp_mode))])
    workdir.cleanup()
    two, ddp_best = statistics.median(rounds["ptc"]), statistics.median(rounds["ddp"])

    print(f"config: layers {a.layers}, hidden {a.hidden}, heads {a.heads}, seq {a.seq}, "
          f"global batch {a.batch}, AdamW; median of {a.steps} steps; 2 cores")
    best_name, best = common.print_torch_sweep(
        sweep, [(f"pytorch  DDP gloo 2 processes x 1 thread, OpenBLAS {o}", t) for o, t in ddps.items()])
    for i in range(a.rounds):
        print(f"round {i + 1}: ptc-run dp=2 {rounds['ptc'][i] * 1e3:.1f} ms, "
              f"DDP (OpenBLAS {ddp_mode}) {rounds['ddp'][i] * 1e3:.1f} ms")
    print(f"ptc-run 1 process x 2 threads : {one * 1e3:8.1f} ms/step")
    print(f"ptc-run dp=2 x 1 thread       : {two * 1e3:8.1f} ms/step  ({two / one:.2f}x the 1-process time; "
          f"median of {a.rounds} rounds)")
    ratio, ratios = common.median_ratio(rounds["ptc"], rounds["ddp"])
    print(f"ptc-run dp=2 / PyTorch DDP at its best (2 x 1 thread): {ratio:.2f}x "
          f"(median of the rounds' ratios {', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"ptc-run best / PyTorch at its best ({best_name.split('  ', 1)[1]}): "
          f"{min(one, two) / best:.2f}x")


if __name__ == "__main__":
    main()
