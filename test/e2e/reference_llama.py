"""PyTorch reference of ptc's Llama (Hugging Face's LlamaForCausalLM without dropout),
written here from its definition: RMSNorm with weight (f32), rotary embeddings on q and k
in the rotate_half convention, causal grouped-query attention (each kv head serves
heads/kv_heads consecutive query heads), SwiGLU MLP, no biases, final RMSNorm, untied LM
head unless tied. Parameter names are Hugging Face's. Needs Debian's python3-torch.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import reference_gpt


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x, theta, positions=None):
    """x: [B, heads, S, D]; position = index along S, or positions[b, s] ([B, S])."""
    S, D = x.shape[2], x.shape[3]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    if positions is None:
        freqs = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]
    else:  # [B, 1, S, D/2]: broadcast over the heads
        freqs = (positions.to(torch.float32)[:, :, None] * inv_freq[None, None, :])[:, None]
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, theta):
        super().__init__()
        d = hidden // heads
        self.q_proj = nn.Linear(hidden, heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, hidden, bias=False)
        self.heads, self.kv_heads, self.d, self.theta = heads, kv_heads, d, theta

    def forward(self, x, positions=None):
        B, S, H = x.shape
        q = self.q_proj(x).view(B, S, self.heads, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv_heads, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv_heads, self.d).transpose(1, 2)
        q, k = rotary(q, self.theta, positions), rotary(k, self.theta, positions)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        mask = torch.ones(S, S, dtype=torch.bool).tril() if positions is None \
            else reference_gpt.document_mask(positions)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, S, H)
        return self.o_proj(y)


class Mlp(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, intermediate, theta, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, theta)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = Mlp(hidden, intermediate)

    def forward(self, x, positions=None):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, layers, hidden, heads, kv_heads, intermediate, vocab, theta=10000.0,
                 eps=1e-5, tie=False):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, hidden)
        self.model.layers = nn.ModuleList(
            [Layer(hidden, heads, kv_heads, intermediate, theta, eps) for _ in range(layers)])
        self.model.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.tie = tie
        if tie:
            self.lm_head.weight = self.model.embed_tokens.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets, positions=None):
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, positions)
        logits = self.lm_head(self.model.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def state(model):
    """Parameters by Hugging Face name (a tied lm_head.weight is the embedding)."""
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if not (model.tie and n == "lm_head.weight")}
