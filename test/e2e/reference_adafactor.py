"""Adafactor (Shazeer & Stern 2018) as a torch optimizer: the reference ptc's
optimizer=adafactor is checked against. The semantics are Hugging Face's
Adafactor with relative_step=False, scale_parameter=False, warmup_init=False:
factored second moments (row and column means) for tensors of rank >= 2, a
decaying beta2 = 1 - t^-decay_rate, update clipping by RMS, an optional first
moment and decoupled weight decay scaled by the learning rate. Written here
from the paper and that description; fp32 throughout."""
import torch


class Adafactor(torch.optim.Optimizer):
    def __init__(self, params, lr, eps=1e-30, clip_threshold=1.0, decay_rate=0.8, beta1=0.0,
                 weight_decay=0.0):
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold,
                                      decay_rate=decay_rate, beta1=beta1,
                                      weight_decay=weight_decay))

    @staticmethod
    def _rms(t):
        return t.pow(2).mean().sqrt()

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                factored = g.dim() >= 2
                if not state:
                    state["step"] = 0
                    if group["beta1"] > 0:
                        state["exp_avg"] = torch.zeros_like(g)
                    if factored:
                        state["row"] = torch.zeros(g.shape[:-1])
                        state["col"] = torch.zeros(g.shape[:-2] + g.shape[-1:])
                    else:
                        state["v"] = torch.zeros_like(g)
                state["step"] += 1
                beta2 = 1.0 - state["step"] ** (-group["decay_rate"])
                square = g * g + group["eps"]
                if factored:
                    row, col = state["row"], state["col"]
                    row.mul_(beta2).add_(square.mean(dim=-1), alpha=1.0 - beta2)
                    col.mul_(beta2).add_(square.mean(dim=-2), alpha=1.0 - beta2)
                    r = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
                    c = col.unsqueeze(-2).rsqrt()
                    u = r * c * g
                else:
                    v = state["v"]
                    v.mul_(beta2).add_(square, alpha=1.0 - beta2)
                    u = v.rsqrt() * g
                u = u / (self._rms(u) / group["clip_threshold"]).clamp(min=1.0)
                u = u * group["lr"]
                if group["beta1"] > 0:
                    m = state["exp_avg"]
                    m.mul_(group["beta1"]).add_(u, alpha=1.0 - group["beta1"])
                    u = m
                if group["weight_decay"] != 0:
                    p.add_(p, alpha=-group["weight_decay"] * group["lr"])
                p.sub_(u)
