"""nanoGPT-style GPT (nanogpt_style.GPT) whose MLPs use GPT-2's own GELU, the tanh form, for
ptc-import-torch's tests: the first block's written as minGPT's NewGELU (tanh, pow(x, 3.0)),
the others as nn.GELU(approximate='tanh'); `dropout` > 0 adds nn.Dropout after each MLP
(GPT-2's resid_pdrop). Written for ptc."""
import math

import torch
import torch.nn as nn

import nanogpt_style


class NewGELU(nn.Module):
    """minGPT's GELU (Hendrycks & Gimpel's tanh approximation, as in Google BERT / OpenAI GPT)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT(nanogpt_style.GPT):
    def __init__(self, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        for i, block in enumerate(self.transformer.h):
            block.mlp.gelu = NewGELU() if i == 0 else nn.GELU(approximate='tanh')
            if dropout > 0:
                block.mlp.c_proj = nn.Sequential(block.mlp.c_proj, nn.Dropout(dropout))
