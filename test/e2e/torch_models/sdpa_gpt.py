"""nanoGPT-style GPT (nanogpt_style.GPT) whose attention is written for torch >= 2, as nanoGPT's
flash path writes it: F.scaled_dot_product_attention(q, k, v, is_causal=True), no mask buffer.
Debian's torch 1.13 has no such function: ptc-import-torch (and the test's PyTorch reference)
define it while they run (ptc_torch.importer.scaled_dot_product_attention). Written for ptc."""
import torch.nn as nn
from torch.nn import functional as F

import nanogpt_style


class FlashSelfAttention(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.c_attn, self.c_proj = attention.c_attn, attention.c_proj
        self.n_head, self.n_embd = attention.n_head, attention.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT(nanogpt_style.GPT):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for block in self.transformer.h:
            block.attn = FlashSelfAttention(block.attn)
