"""PyTorch reference of ptc's mixture-of-experts GPT (ptc-model gpt --moe-experts E ...),
written from the routing rules, not from ptc's kernels:

- router logits in f32, softmax over all experts, top-k, weights renormalized over the k;
- one routing group per sequence; capacity per expert per group
  ceil(capacity_factor * seq * k / E), at most seq (capacity_factor 0: seq, dropless);
- slots filled choice-major: all first choices in token order, then all second choices;
  an assignment over capacity is dropped (the residual carries the token);
- the Switch load-balancing loss aux * E * mean over groups of sum_e f_e P_e (f_e: the
  fraction of the group's seq * k assignments routed to e, P_e: its mean router
  probability) and the router z-loss z * mean(logsumexp(logits)^2), added to the loss.

Every layer i with i % every == 0 has an MoE MLP with GELU experts (c_fc, c_proj with
biases, stacked along dimension 0), plus, with shared > 0, DeepSeek's shared experts (a dense
MLP of shared x ffn added for every token); the others are reference_gpt's dense blocks.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import reference_gpt as ref


def capacity(seq, experts, top_k, capacity_factor):
    if capacity_factor == 0:
        return seq
    return max(1, min(seq, math.ceil(capacity_factor * seq * top_k / experts)))


class SharedExperts(nn.Module):
    """DeepSeek's shared experts: one dense GELU MLP of shared x ffn on every token."""

    def __init__(self, hidden, hidden_ffn):
        super().__init__()
        self.c_fc = nn.Linear(hidden, hidden_ffn)
        self.c_proj = nn.Linear(hidden_ffn, hidden)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class MoeMlp(nn.Module):
    def __init__(self, hidden, experts, ffn, top_k, capacity_factor, layers, shared=0,
                 bias_rate=0.0):
        super().__init__()
        # DeepSeek-V3's auxiliary-loss-free balancing: a bias on the selection scores only,
        # moved after each step by rate * sign(mean load - load); not a parameter.
        self.register_buffer("expert_bias", torch.zeros(experts))
        self.bias_rate = bias_rate
        self.shared_experts = SharedExperts(hidden, shared * ffn) if shared else None
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.Module()
        E, H, Fh = experts, hidden, ffn
        self.experts.c_fc = nn.Module()
        self.experts.c_proj = nn.Module()
        self.experts.c_fc.weight = nn.Parameter(torch.randn(E, Fh, H) * 0.02)
        self.experts.c_fc.bias = nn.Parameter(torch.zeros(E, Fh))
        self.experts.c_proj.weight = nn.Parameter(
            torch.randn(E, H, Fh) * (0.02 / math.sqrt(2 * layers)))
        self.experts.c_proj.bias = nn.Parameter(torch.zeros(E, H))
        self.E, self.K, self.cf = experts, top_k, capacity_factor
        self.aux = torch.zeros(())
        self.dropped = 0
        self.assignments = 0

    def forward(self, x, aux_coef, z_coef):
        B, S, H = x.shape
        E, K = self.E, self.K
        C = capacity(S, E, K, self.cf)
        dropped_before = self.dropped
        logits = self.router(x).float()
        probs = logits.softmax(-1)
        _, topi = (probs + self.expert_bias).topk(K, dim=-1)
        topw = probs.gather(-1, topi)
        topw = topw / topw.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for g in range(B):
            used = [0] * E
            rows = [[] for _ in range(E)]  # per expert: (token, choice) in slot order
            for j in range(K):
                for t in range(S):
                    e = int(topi[g, t, j])
                    if used[e] < C:
                        used[e] += 1
                        rows[e].append((t, j))
                    else:
                        self.dropped += 1
                    self.assignments += 1
            for e in range(E):
                if not rows[e]:
                    continue
                ts = torch.tensor([t for t, _ in rows[e]])
                js = torch.tensor([j for _, j in rows[e]])
                h = x[g, ts] @ self.experts.c_fc.weight[e].t() + self.experts.c_fc.bias[e]
                y = F.gelu(h) @ self.experts.c_proj.weight[e].t() + self.experts.c_proj.bias[e]
                out[g] = out[g].index_add(0, ts, topw[g, ts, js].unsqueeze(-1).to(y.dtype) * y)
        self.last_dropped = (self.dropped - dropped_before) / (B * S * K)
        if self.bias_rate > 0:
            with torch.no_grad():
                load = F.one_hot(topi, E).float().sum(dim=(1, 2)).mean(dim=0)  # per expert per group
                self.expert_bias += self.bias_rate * torch.sign(load.mean() - load)
        aux = torch.zeros(())
        if aux_coef > 0:
            f = F.one_hot(topi, E).float().sum(dim=2).mean(dim=1) / K  # [B, E]
            P = probs.mean(dim=1)  # [B, E]
            aux = aux + aux_coef * E * (f * P).sum(-1).mean()
        if z_coef > 0:
            aux = aux + z_coef * (torch.logsumexp(logits, dim=-1) ** 2).mean()
        self.aux = aux
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class MoeBlock(nn.Module):
    def __init__(self, hidden, heads, mlp):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = ref.SelfAttention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = mlp


class MoeGPT(ref.GPT):
    def __init__(self, layers, hidden, heads, seq, vocab, experts, top_k, capacity_factor,
                 every=1, ffn=None, aux_loss=0.01, z_loss=0.0, shared=0, bias_rate=0.0):
        super().__init__(layers, hidden, heads, seq, vocab)
        ffn = ffn or 4 * hidden
        for i in range(layers):
            if i % every == 0:
                dense = self.transformer.h[i]
                block = MoeBlock(hidden, heads,
                                 MoeMlp(hidden, experts, ffn, top_k, capacity_factor, layers,
                                        shared, bias_rate))
                block.ln_1, block.attn, block.ln_2 = dense.ln_1, dense.attn, dense.ln_2
                nn.init.normal_(block.mlp.router.weight, 0.0, 0.02)
                self.transformer.h[i] = block
        self.aux_loss, self.z_loss = aux_loss, z_loss
        self.dropped_history = []  # per forward: {layer prefix: fraction of assignments dropped}

    def forward(self, tokens, targets):
        S = tokens.shape[1]
        x = self.transformer.wte(tokens) + self.transformer.wpe(torch.arange(S))
        aux = torch.zeros(())
        for block in self.transformer.h:
            x = x + block.attn(block.ln_1(x))
            if isinstance(block.mlp, MoeMlp):
                x = x + block.mlp(block.ln_2(x), self.aux_loss, self.z_loss)
                aux = aux + block.mlp.aux
            else:
                x = x + block.mlp(block.ln_2(x))
        logits = self.lm_head(self.transformer.ln_f(x))
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        self.dropped_history.append({f"transformer.h.{i}.mlp": b.mlp.last_dropped
                                     for i, b in enumerate(self.transformer.h)
                                     if isinstance(b.mlp, MoeMlp)})
        return ce + aux

    def dropped_fraction(self):
        moe = [b.mlp for b in self.transformer.h if isinstance(b.mlp, MoeMlp)]
        total = sum(m.assignments for m in moe)
        return sum(m.dropped for m in moe) / max(total, 1)
