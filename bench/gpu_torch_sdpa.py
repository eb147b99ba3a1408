#!/usr/bin/env python3
"""PyTorch's causal scaled_dot_product_attention at its best on the shapes
ptc-bench-cuda-attention times, for bench/gpu_check.sh: q, k, v as views of a
fused projection [batch, seq, (heads + 2 kv_heads) * dim] in bf16, transposed
to [batch, heads, seq, dim] (no copies), is_causal=True, grouped-query heads
through enable_gqa. Each backend PyTorch has for the shape is tried (cuDNN,
flash, memory-efficient) and the fastest forward + backward kept. Times are
medians of CUDA-event timed rounds after warm-up; the backward is (forward +
backward) - forward. Prints one JSON object per shape.

usage: gpu_torch_sdpa.py [NAME:BATCH:HEADS:KVHEADS:SEQ:DIM ...]
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEFAULT = ["gpt2-medium:8:16:16:1024:64", "llama-gqa:4:32:8:2048:128"]


def median_ms(fn, rounds=5, repeats=10):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / repeats)
    times.sort()
    return times[len(times) // 2]


def bench(name, b, h, kv, s, d):
    gen = torch.Generator(device="cuda").manual_seed(7)
    qkv = torch.randn(b, s, (h + 2 * kv) * d, device="cuda", dtype=torch.bfloat16, generator=gen)
    qkv.requires_grad_(True)
    grad = torch.randn(b, s, h * d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def views():
        q, k, v = qkv.split([h * d, kv * d, kv * d], dim=-1)
        return (q.view(b, s, h, d).transpose(1, 2), k.view(b, s, kv, d).transpose(1, 2),
                v.view(b, s, kv, d).transpose(1, 2))

    def forward():
        q, k, v = views()
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != h)

    def forward_backward():
        out = forward()
        out.transpose(1, 2).reshape(b, s, h * d).backward(grad)
        qkv.grad = None

    best = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                with torch.no_grad():
                    fwd = median_ms(forward)
                both = median_ms(forward_backward)
        except RuntimeError as e:  # the backend does not take this shape
            print(f"{name}: {backend.name} refused: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        if best is None or both < best["fwd_bwd_ms"]:
            best = {"fwd_ms": fwd, "bwd_ms": both - fwd, "fwd_bwd_ms": both,
                    "backend": backend.name}
    return {"name": name, "batch": b, "heads": h, "kv_heads": kv, "seq": s, "dim": d,
            "torch": torch.__version__, **(best or {"error": "no backend took the shape"})}


def main():
    for spec in sys.argv[1:] or DEFAULT:
        name, *sizes = spec.split(":")
        print(json.dumps(bench(name, *map(int, sizes))), flush=True)


if __name__ == "__main__":
    main()
