"""Muon as a torch optimizer: the reference ptc's optimizer=muon is checked against.
Written here from the published algorithm (Keller Jordan's Muon: momentum, then the
quintic Newton-Schulz orthogonalization with coefficients (3.4445, -4.7750, 2.0315)
on the normalized update, iterating on the wide orientation of the matrix) with
Moonlight's choices (arXiv 2502.16982): momentum without dampening, Nesterov,
decoupled weight decay, and the update scaled by 0.2 * sqrt(max(rows, cols)) so that
its RMS matches AdamW's; AdamW for every parameter that is not a hidden matrix
(embeddings, the output head, norms, biases), at the same learning rate. Float32
throughout.

Which parameters are hidden matrices is the caller's choice, by module (the Linear
layers inside the transformer blocks), independently of how ptc decides it."""
import torch


def newton_schulz(g, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum=0.95, nesterov=True, ns_steps=5,
                 weight_decay=0.0, scale=0.2):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, weight_decay=weight_decay,
                                      scale=scale))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            mu = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.mul_(mu).add_(g)
                u = g + mu * buf if group["nesterov"] else buf
                o = newton_schulz(u, group["ns_steps"])
                rows, cols = p.shape[-2], p.shape[-1]
                factor = group["scale"] * max(rows, cols) ** 0.5
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
                p.add_(o, alpha=-group["lr"] * factor)


class MuonWithAdamW:
    """Muon for `hidden` (a list of matrices), AdamW for the rest of `model`; weight
    decay on rank >= 2 parameters only, as ptc-optimizer applies it."""

    def __init__(self, model, hidden, lr, betas, eps, weight_decay, momentum=0.95):
        ids = {id(p) for p in hidden}
        rest = [p for p in model.parameters() if id(p) not in ids]
        self.muon = Muon(hidden, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.adamw = torch.optim.AdamW(
            [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
             {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
            lr=lr, betas=betas, eps=eps)

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.muon.step()
        self.adamw.step()


def hidden_matrices(model):
    """The weights of the Linear layers inside the transformer's blocks (not the head)."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            out.append(module.weight)
    return out
