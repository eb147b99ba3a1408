"""PyTorch on the GPU, the reference of bench/gpu_check.sh, at its best: bf16 autocast over
fp32 master weights, fused AdamW, cuDNN / flash scaled_dot_product_attention, and with
--compile the model under torch.compile. Two architectures, as ptc-model builds them:
  gpt    ptc's standard GPT (pre-LayerNorm blocks, exact GELU, tied embeddings, biases)
  llama  Llama (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no biases,
         untied head), rotary tables precomputed as Hugging Face does
Prints one JSON line: step seconds (median), tokens/s, MFU, peak GPU memory allocated.

  python3 bench/gpu_torch_gpt.py --layers 24 --hidden 1024 --heads 16 --seq 1024 \
      --vocab 50257 --batch 8 --steps 10 --peak-tflops 989 [--compile]
  python3 bench/gpu_torch_gpt.py --arch llama --layers 16 --hidden 2048 --heads 32 \
      --kv-heads 8 --intermediate 5632 --seq 2048 --vocab 32000 --batch 4 [--compile]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.attn_proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)
        self.heads = heads

    def forward(self, x):
        B, S, H = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(H, dim=2)
        q, k, v = (t.view(B, S, self.heads, H // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, S, H))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        S = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(S, device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class LlamaLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, intermediate, eps):
        super().__init__()
        d = hidden // heads
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.q_proj = nn.Linear(hidden, heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, hidden, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.heads, self.kv_heads, self.d = heads, kv_heads, d

    def forward(self, x, cos, sin):
        B, S, H = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, S, self.heads, self.d).transpose(1, 2)
        k = self.k_proj(h).view(B, S, self.kv_heads, self.d).transpose(1, 2)
        v = self.v_proj(h).view(B, S, self.kv_heads, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, S, H))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Llama(nn.Module):
    def __init__(self, layers, hidden, heads, kv_heads, intermediate, seq, vocab, theta=10000.0,
                 eps=1e-5):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            [LlamaLayer(hidden, heads, kv_heads, intermediate, eps) for _ in range(layers)])
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        d = hidden // heads
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        S = tokens.shape[1]
        cos, sin = self.cos[:S].to(torch.bfloat16), self.sin[:S].to(torch.bfloat16)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["gpt", "llama"], default="gpt")
    for name, default in (("layers", 24), ("hidden", 1024), ("heads", 16), ("kv-heads", 0),
                          ("intermediate", 0), ("seq", 1024), ("vocab", 50257), ("batch", 8),
                          ("steps", 10), ("warmup", 3)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--compile", action="store_true", help="the model under torch.compile")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if a.arch == "llama":
        kv = a.kv_heads or a.heads
        model = Llama(a.layers, a.hidden, a.heads, kv, a.intermediate, a.seq, a.vocab).to(dev)
        flops = common.model_flops(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab, kv,
                                   a.intermediate)
    else:
        model = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab).to(dev)
        flops = common.model_flops(a.layers, a.hidden, a.heads, a.seq, a.batch, a.vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    run = torch.compile(model) if a.compile else model
    g = torch.Generator(device=dev).manual_seed(0)
    tokens = torch.randint(0, 256, (a.batch, a.seq), device=dev, generator=g)
    targets = torch.randint(0, 256, (a.batch, a.seq), device=dev, generator=g)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    print(json.dumps({"impl": "pytorch-compile" if a.compile else "pytorch-eager",
                      "arch": a.arch, "torch": torch.__version__, "step_s": t,
                      "tokens_per_s": a.batch * a.seq / t,
                      "mfu": flops / t / (a.peak_tflops * 1e12), "loss": loss.item(),
                      "peak_bytes": torch.cuda.max_memory_allocated()}))


if __name__ == "__main__":
    main()
