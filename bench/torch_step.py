#!/usr/bin/python3
"""Internal to the benchmarks: the median PyTorch eager training step of the bench model
in this process, with OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS set by the
caller before PyTorch and its BLAS start (bench/common.py, torch_thread_sweep). Prints
seconds.

usage: bench/torch_step.py --intra N [model options of bench/common.py]
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "test", "e2e"))
import common  # noqa: E402
import reference_gpt as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    common.add_model_options(ap, steps=30)
    ap.add_argument("--intra", type=int, required=True)
    a, _ = ap.parse_known_args()
    torch.set_num_threads(a.intra)
    torch.manual_seed(0)
    model = common.torch_model(a)
    opt = ref.make_optimizer(model, "adamw", lr=1e-3)
    print(common.time_torch_steps(model, opt, common.corpus_tokens(), a.steps, a.warmup,
                                  a.batch, a.seq, autocast=a.precision == "bf16"))


if __name__ == "__main__":
    main()
