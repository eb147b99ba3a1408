#!/usr/bin/env python3
"""ptc-import-torch end to end: a nanoGPT-style and a Hugging Face Llama-style module
(test/e2e/torch_models, written the way their authors write them) imported unchanged train in
ptc like PyTorch trains them from the same state_dict (losses within 1e-4 for 12 steps; with
dropout, whose masks ptc draws itself, within 5e-3); dp:2,
tp:2 and pp:2 reproduce one rank (1e-5); tp:2 holds at most 0.65x of one rank's parameters; the
imported model's ops are the builder model's (the patterns were recognised); the default import
(fake tensors) equals one traced on real tensors; an aten op ptc does
not have is an error naming it and the source line.

usage: import_torch.py --bin BUILD/bin --workdir DIR [--model gpt|gpt-tanh-gelu|gpt-dropout|gpt-sdpa|llama]
Needs Debian's python3-torch (CPU) and numpy; run with /usr/bin/python3.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "torch_models"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import harness  # noqa: E402
import ptc_torch.importer  # noqa: E402
import ptc_torch.weights  # noqa: E402
import reference_gpt  # noqa: E402

import torch  # noqa: E402

STEPS, BATCH, SEQ, VOCAB = 12, 8, 64, 256

MODELS = {
    "gpt": dict(file="nanogpt_style.py", cls="GPT",
                kwargs=dict(n_layer=2, n_head=4, n_embd=64, block_size=SEQ, vocab_size=VOCAB),
                builder=["gpt", "--layers", "2", "--hidden", "64", "--heads", "4"]),
    # GPT-2's tanh GELU: minGPT's NewGELU (tanh, pow) in block 0, nn.GELU(approximate='tanh')
    # in block 1 (no builder of that form: its ops are not compared).
    "gpt-tanh-gelu": dict(file="gpt2_gelu.py", cls="GPT",
                          kwargs=dict(n_layer=2, n_head=4, n_embd=64, block_size=SEQ,
                                      vocab_size=VOCAB),
                          builder=None),
    # ... and with nn.Dropout(0.1) after each MLP (trained in train mode: ptc.dropout; its masks
    # are ptc's own, so PyTorch's losses are matched within what other masks change).
    "gpt-dropout": dict(file="gpt2_gelu.py", cls="GPT",
                        kwargs=dict(n_layer=2, n_head=4, n_embd=64, block_size=SEQ,
                                    vocab_size=VOCAB, dropout=0.1),
                        builder=None),
    # nanoGPT's flash path, written for torch >= 2: F.scaled_dot_product_attention(is_causal=True)
    # -> the builder's ops, as the masked-softmax form.
    "gpt-sdpa": dict(file="nanogpt_style.py", cls="GPT",
                     kwargs=dict(n_layer=2, n_head=4, n_embd=64, block_size=SEQ, vocab_size=VOCAB,
                                 flash=True),
                     builder=["gpt", "--layers", "2", "--hidden", "64", "--heads", "4"]),
    "llama": dict(file="llama_style.py", cls="LlamaForCausalLM",
                  kwargs=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=SEQ),
                  builder=["llama", "--layers", "2", "--hidden", "64", "--heads", "4",
                           "--kv-heads", "2", "--intermediate", "128"]),
}


def param_elements(plan_json):
    plan = json.loads(plan_json)
    n = 0
    for t in plan["tensors"]:
        if t.get("kind") in ("Parameter", 0):
            size = 1
            for d in t["shape"]:
                size *= d
            n += size
    return n


def op_names(mlir_text):
    return re.findall(r"= (?:\"?)(ptc\.[a-z_]+)", mlir_text)


def expect_refused(b, w, model, name, source, input_spec, want, one_line=False):
    """Imports module M of `source` (written to NAME.py): it must fail with `want` in one error
    (`one_line`: the whole of stderr is one line) and write nothing."""
    with open(w(f"{name}.py"), "w") as f:
        f.write(source)
    p = subprocess.run([b("ptc-import-torch"), w(f"{name}.py"), "--class", "M", "--input",
                        input_spec, "-o", w(f"{name}.mlir")], capture_output=True, text=True)
    want = f"{w(name + '.py')}:{want}"
    if p.returncode == 0 or want not in p.stderr or os.path.exists(w(f"{name}.mlir")) or \
            (one_line and len(p.stderr.strip().splitlines()) != 1):
        sys.exit(f"FAIL: expected the import refused with '{want}', got {p.returncode}:\n{p.stderr}")
    print(f"{model}: refused: {p.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--model", default="gpt", choices=list(MODELS))
    args = ap.parse_args()
    harness.fresh_workdir(args.workdir)
    w, b, run = harness.tools(args.bin, args.workdir)
    env = harness.mpi_env(OMPI_MCA_rmaps_base_oversubscribe="1")
    spec = MODELS[args.model]
    module_file = os.path.join(HERE, "torch_models", spec["file"])

    run(b("ptc-tokenize"), "-o", w("data.bin"), "/usr/share/common-licenses/GPL-3")
    run(b("ptc-import-torch"), module_file, "--class", spec["cls"], "--kwargs",
        json.dumps(spec["kwargs"]), "--input", f"tokens={BATCH}x{SEQ}:int64", "--input",
        f"targets={BATCH}x{SEQ}:int64", "-o", w("model.mlir"))

    canon = lambda f: subprocess.run([b("ptc-opt"), w(f)], check=True, capture_output=True,
                                     text=True).stdout
    # The default trace (fake tensors: the module built without its parameters' memory) and
    # one on real tensors give the same model; only the initializers' stds may differ (the
    # init's nominal std against the drawn values' std).
    run(b("ptc-import-torch"), module_file, "--class", spec["cls"], "--kwargs",
        json.dumps(spec["kwargs"]), "--input", f"tokens={BATCH}x{SEQ}:int64", "--input",
        f"targets={BATCH}x{SEQ}:int64", "--trace", "real", "-o", w("real.mlir"))
    strip_init = lambda text: re.sub(r'ptc\.init = "[^"]*"', "", text)
    if strip_init(canon("model.mlir")) != strip_init(canon("real.mlir")):
        sys.exit("FAIL: the fake-tensor import differs from the real-tensor one")
    print(f"{args.model}: the fake-tensor import equals the real-tensor one")
    if spec["builder"]:
        # The patterns were recognised: the same ops as the builder's model of that shape.
        run(b("ptc-model"), *spec["builder"], "--seq", str(SEQ), "--vocab", str(VOCAB), "--batch",
            str(BATCH), "-o", w("builder.mlir"))
        imported_ops, builder_ops = op_names(canon("model.mlir")), op_names(canon("builder.mlir"))
        if imported_ops != builder_ops:
            sys.exit(f"FAIL: the imported model's ops differ from the builder's:\n{imported_ops}\n"
                     f"{builder_ops}")
        print(f"{args.model}: imported ops = the builder's ({len(imported_ops)} ops)")
    else:
        # Both blocks' GELUs become ptc.gelu_tanh: nn.GELU(approximate='tanh') directly, NewGELU's
        # tanh, pow and products by the importer's pattern (nothing of it left over).
        ops = op_names(canon("model.mlir"))
        print(f"{args.model}: imported {len(ops)} ops, of which ptc.gelu_tanh "
              f"{ops.count('ptc.gelu_tanh')}, ptc.tanh {ops.count('ptc.tanh')}")
        if ops.count("ptc.gelu_tanh") != 2 or "ptc.tanh" in ops:
            sys.exit("FAIL: expected both blocks' tanh GELUs as ptc.gelu_tanh and no ptc.tanh")
        dropouts = ops.count("ptc.dropout")
        want = 2 if spec["kwargs"].get("dropout", 0) > 0 else 0
        print(f"{args.model}: ptc.dropout {dropouts}")
        if dropouts != want:
            sys.exit(f"FAIL: expected {want} ptc.dropout (one per block's MLP), got {dropouts}")
        # Dropout of attention probabilities (nanoGPT's attn_dropout) cannot be fused: an error
        # naming the line of the module.
        expect_refused(
            b, w, args.model, "attn_dropout",
            "import torch\n"
            "import torch.nn.functional as F\n"
            "class M(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.w = torch.nn.Parameter(torch.ones(8))\n"
            "        self.register_buffer('bias', torch.tril(torch.ones(4, 4)).view(1, 1, 4, 4))\n"
            "    def forward(self, x):\n"
            "        q = x * self.w\n"
            "        att = (q @ x.transpose(-2, -1)) * 0.5\n"
            "        att = att.masked_fill(self.bias == 0, float('-inf'))\n"
            "        att = F.dropout(F.softmax(att, dim=-1), 0.1, training=self.training)\n"
            "        return (att @ x).mean(dim=[0, 1, 2, 3])\n",
            "x=2x2x4x8:float32", "12: dropout of attention probabilities (p=0.1) is not supported")

    # The module's own initial weights, as its state_dict (tied names both present).
    sys.path.insert(0, os.path.dirname(module_file))
    module = __import__(spec["file"][:-3])
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        # torch 1.13: the function as its documentation defines it (what the importer uses).
        torch.nn.functional.scaled_dot_product_attention = \
            ptc_torch.importer.scaled_dot_product_attention
    torch.manual_seed(0)
    model = getattr(module, spec["cls"])(**spec["kwargs"])
    model.train()
    reference_gpt.save_safetensors(w("init.safetensors"), model.state_dict())

    # PyTorch trains it: nanoGPT's batches, AdamW with decay on matrices (as ptc-optimizer).
    data = reference_gpt.np.fromfile(w("data.bin"), dtype=reference_gpt.np.uint16)
    opt = reference_gpt.make_optimizer(model, lr=1e-3, weight_decay=0.1)
    torch_losses = []
    for step in range(STEPS):
        x, y = reference_gpt.batch(data, step, BATCH, SEQ)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch_losses.append(loss.item())

    def ptc_losses(tag, options, ranks):
        plan = w(f"{tag}.plan")
        run(b("ptc-opt"), w("model.mlir"),
            f"--ptc-compile=optimizer=adamw lr=1e-3 weight-decay=0.1 {options}", "-o", plan)
        cmd = [b("ptc-run"), plan, "--data", w("data.bin"), "--steps", str(STEPS), "--init",
               w("init.safetensors"), "--metrics", w(f"{tag}.jsonl"), "--log-every", "0",
               "--save", w(f"{tag}.safetensors")]
        if ranks > 1:
            cmd[2:2] = ["--np", str(ranks)]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        dump = subprocess.run([b("ptc-run"), plan, "--dump-plan"], check=True,
                              capture_output=True, text=True).stdout
        got = harness.losses(w(f"{tag}.jsonl"))
        return [got[s] for s in sorted(got)], param_elements(dump)

    one, one_params = ptc_losses("one", "", 1)
    worst = max(abs(a - t) / abs(t) for a, t in zip(one, torch_losses))
    print(f"{args.model}: PyTorch {['%.5f' % x for x in torch_losses]}")
    print(f"{args.model}: ptc     {['%.5f' % x for x in one]}  (worst relative {worst:.2e})")
    # With dropout PyTorch draws other masks than ptc: the same model, trained alike, not the
    # same numbers.
    bound = 5e-3 if spec["kwargs"].get("dropout", 0) > 0 else 1e-4
    if worst > bound:
        sys.exit(f"FAIL: the imported model's losses differ from PyTorch's by more than {bound:g}")
    if not torch_losses[-1] < torch_losses[0] - 0.3:
        sys.exit("FAIL: the loss did not fall")

    # The trained weights load back into the module with a strict load_state_dict: ptc wrote
    # the tied names too and listed the buffers, which ptc_torch.weights fills in from the module.
    fresh = getattr(module, spec["cls"])(**spec["kwargs"])
    saved, listed = ptc_torch.weights.read_weights(w("one.safetensors"))
    own_buffers = [n for n in fresh.state_dict() if n in dict(fresh.named_buffers())]
    if sorted(listed) != sorted(own_buffers):
        sys.exit(f"FAIL: the saved file lists buffers {listed}, the module has {own_buffers}")
    try:
        fresh.load_state_dict(saved, strict=True)
        missing = []
    except RuntimeError as e:
        missing = sorted(set(re.findall(r'"([^"]+)"', str(e).split("Unexpected")[0])))
    if missing != sorted(own_buffers):
        sys.exit(f"FAIL: a plain strict load misses {missing}, expected only the buffers")
    ptc_torch.weights.load_state_dict(fresh, w("one.safetensors"))
    worst = max((fresh.state_dict()[n] - t).abs().max().item() for n, t in saved.items())
    if worst != 0.0:
        sys.exit(f"FAIL: the loaded weights differ from the saved ones by {worst}")
    print(f"{args.model}: strict load_state_dict of ptc's weights: {len(saved)} tensors "
          f"(tied names included), buffers listed and taken from the module: {len(listed)}")

    for tag, options, ranks in (("dp2", "mesh=dp:2", 2), ("tp2", "mesh=tp:2", 2),
                                ("pp2", "mesh=pp:2 microbatches=2", 2)):
        losses, params = ptc_losses(tag, options, ranks)
        worst = max(abs(a - t) / abs(t) for a, t in zip(losses, one))
        print(f"{args.model}: {tag}: worst relative difference to one rank {worst:.2e}, "
              f"parameters per rank {params} of {one_params}")
        if worst > 1e-5:
            sys.exit(f"FAIL: {tag} differs from one rank by more than 1e-5")
        if tag == "tp2" and params > 0.65 * one_params:
            sys.exit(f"FAIL: tp:2 holds {params / one_params:.2f}x of one rank's parameters")

    # The planner takes the imported file (its blocks found and cut for the probes).
    p = subprocess.run([b("ptc-plan"), w("model.mlir"), "--gpus", "4", "--cluster", "h100-ib",
                        "--top", "3"], capture_output=True, text=True)
    if p.returncode != 0 or "best: --ptc-compile=" not in p.stdout:
        sys.exit(f"FAIL: ptc-plan on the imported model: {p.returncode}\n{p.stdout}{p.stderr}")
    print(f"{args.model}: ptc-plan: {p.stdout.strip().splitlines()[1]}")

    # An op ptc does not have: one error naming the aten op and the line of the source.
    expect_refused(
        b, w, args.model, "unsupported",
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.ones(4))\n"
        "    def forward(self, x):\n"
        "        y = torch.cumsum(x * self.w, dim=1)\n"
        "        return y.mean()\n",
        "x=2x4:float32", "7: aten op 'aten::cumsum' is not supported", one_line=True)
    print(f"PASS: the imported {args.model} matches PyTorch and every layout matches one rank")


if __name__ == "__main__":
    main()
