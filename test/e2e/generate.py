#!/usr/bin/env python3
"""ptc-generate against PyTorch: greedy decoding with the key/value cache equals a PyTorch greedy
decode of the same trained weights token for token, on one rank and on tp:2, and equals
ptc-generate --no-cache (the whole prefix recomputed each token); sampling is reproducible by
seed; a prompt longer than the context, token ids outside the vocabulary and weights of another
model are errors.

usage: generate.py --bin BUILD/bin --workdir DIR [--model gpt|llama|moe] [--document-end ID]

--document-end ID: the model is trained on packed documents (ID ends one); a prompt is one
document, so the reference decodes with plain causal attention and positions 0, 1, ...

The MoE GPT routes every token as training does (router, top-k) but drops nothing at decode
(a call's tokens fit the experts' buffers): its reference is the dropless PyTorch MoE.
Needs Debian's python3-torch (CPU) and numpy; run with /usr/bin/python3.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import reference_gpt  # noqa: E402
import reference_llama  # noqa: E402
import reference_moe  # noqa: E402

import torch  # noqa: E402

NEW_TOKENS = 24
SEQ = 64


def gpt_logits(model, tokens):
    t = model.transformer
    x = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[1]))
    for block in t.h:
        x = block(x)
    return model.lm_head(t.ln_f(x))


def moe_logits(model, tokens):
    """reference_moe's forward up to the logits (dropless: capacity_factor 0)."""
    t = model.transformer
    x = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[1]))
    for block in t.h:
        x = x + block.attn(block.ln_1(x))
        if isinstance(block.mlp, reference_moe.MoeMlp):
            x = x + block.mlp(block.ln_2(x), 0.0, 0.0)
        else:
            x = x + block.mlp(block.ln_2(x))
    return model.lm_head(t.ln_f(x))


def llama_logits(model, tokens):
    x = model.model.embed_tokens(tokens)
    for layer in model.model.layers:
        x = layer(x)
    return model.lm_head(model.model.norm(x))


def torch_greedy(model, logits_fn, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = logits_fn(model, torch.tensor([ids]))
            ids.append(int(torch.argmax(logits[0, -1]).item()))
    return ids[len(prompt):]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama", "moe"])
    ap.add_argument("--document-end", type=int, default=None)
    args = ap.parse_args()
    harness.fresh_workdir(args.workdir)
    w, b, run = harness.tools(args.bin, args.workdir)
    env = harness.mpi_env(OMPI_MCA_rmaps_base_oversubscribe="1")

    # A corpus whose continuation a small model learns in a few hundred steps.
    import random
    rng = random.Random(0)
    words = ("the quick brown fox jumps over the lazy dog while a small cat sleeps on the warm "
             "mat").split()
    with open(w("corpus.txt"), "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(20000)))
    run(b("ptc-tokenize"), "-o", w("data.bin"), w("corpus.txt"))

    if args.model == "gpt":
        shape = ["--layers", "2", "--hidden", "64", "--heads", "4"]
        other = ["llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2"]
        torch_model = reference_gpt.GPT(2, 64, 4, SEQ, 256)
        logits_fn = gpt_logits
    elif args.model == "moe":
        shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--moe-experts", "4",
                 "--moe-top-k", "2"]
        other = ["gpt", "--layers", "2", "--hidden", "64", "--heads", "4"]
        torch_model = reference_moe.MoeGPT(2, 64, 4, SEQ, 256, 4, 2, 0.0)
        logits_fn = moe_logits
    else:
        shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                 "--intermediate", "128"]
        other = ["gpt", "--layers", "2", "--hidden", "64", "--heads", "4"]
        torch_model = reference_llama.Llama(2, 64, 4, 2, 128, 256)
        logits_fn = llama_logits
    if args.document_end is not None:
        shape += ["--document-end", str(args.document_end)]
    run(b("ptc-model"), "gpt" if args.model == "moe" else args.model, *shape, "--seq", str(SEQ), "--vocab", "256", "--batch", "8",
        "-o", w("model.mlir"))
    run(b("ptc-opt"), w("model.mlir"), "--ptc-compile=lr=3e-3", "-o", w("train.plan"))
    run(b("ptc-run"), w("train.plan"), "--data", w("data.bin"), "--steps", "300", "--save",
        w("weights.safetensors"), "--checkpoint-dir", w("ckpt"), "--checkpoint-every", "300")

    def generate(*extra, check=True):
        cmd = [b("ptc-generate"), w("model.mlir"), "--init", w("weights.safetensors"),
               "--print-tokens", *extra]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if check and p.returncode != 0:
            sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
        return p

    def new_tokens(p):
        return [int(t) for t in p.stdout.strip().splitlines()[-1].split()]

    prompt_text = "the lazy "
    prompt = list(prompt_text.encode())
    greedy = ["--prompt", prompt_text, "--max-new-tokens", str(NEW_TOKENS), "--temperature", "0"]

    state = reference_gpt.load_safetensors(w("weights.safetensors"))
    missing, unexpected = torch_model.load_state_dict(state, strict=False)
    assert not unexpected and all(m == "lm_head.weight" or m.endswith(".expert_bias")
                                  for m in missing), (missing, unexpected)
    torch_model.eval()
    expected = torch_greedy(torch_model, logits_fn, prompt, NEW_TOKENS)

    one = new_tokens(generate(*greedy))
    print(f"{args.model}: PyTorch greedy: {expected}")
    print(f"{args.model}: ptc one rank:   {one}")
    if one != expected:
        sys.exit(f"FAIL: one rank's greedy tokens differ from PyTorch's")
    if len(set(expected)) < 3:
        sys.exit(f"FAIL: the trained model's continuation is degenerate: {expected}")
    tp = new_tokens(generate(*greedy, "--np", "2", "--mesh", "tp:2"))
    print(f"{args.model}: ptc tp:2:       {tp}")
    if tp != expected:
        sys.exit("FAIL: tp:2 greedy tokens differ from PyTorch's")
    # The same weights from the run's checkpoint directory.
    p = subprocess.run([b("ptc-generate"), w("model.mlir"), "--init", w("ckpt"), "--print-tokens",
                        *greedy], env=env, capture_output=True, text=True)
    if p.returncode != 0 or new_tokens(p) != expected:
        sys.exit(f"FAIL: --init CHECKPOINT_DIR: {p.returncode}\n{p.stdout}{p.stderr}")
    no_cache = new_tokens(generate(*greedy, "--no-cache"))
    if no_cache != expected:
        sys.exit(f"FAIL: --no-cache gives {no_cache}, the cache {expected}")
    # The prompt's text and the new tokens' bytes are printed before the ids.
    text = generate(*greedy).stdout.splitlines()[0]
    if not text.startswith(prompt_text) or len(text.encode()) < len(prompt_text) + 8:
        sys.exit(f"FAIL: the printed text '{text}' does not continue the prompt")

    # Sampling: the same seed gives the same tokens (also across tp:2), another seed others.
    sampled = ["--prompt", prompt_text, "--max-new-tokens", "16", "--temperature", "1.5",
               "--top-k", "50", "--top-p", "0.95"]
    a = new_tokens(generate(*sampled, "--seed", "7"))
    if a != new_tokens(generate(*sampled, "--seed", "7", "--np", "2", "--mesh", "tp:2")):
        sys.exit("FAIL: the same seed sampled different tokens on tp:2")
    if a == new_tokens(generate(*sampled, "--seed", "8")) == \
            new_tokens(generate(*sampled, "--seed", "9")):
        sys.exit("FAIL: three seeds sampled the same 16 tokens")

    # Errors name what is wrong and exit non-zero.
    def refused(expect, *extra, init=None):
        cmd_init = ["--init", init] if init else []
        p = subprocess.run([b("ptc-generate"), w("model.mlir"),
                            *(cmd_init or ["--init", w("weights.safetensors")]), *extra],
                           env=env, capture_output=True, text=True)
        if p.returncode == 0 or expect not in p.stderr:
            sys.exit(f"FAIL: expected an error with '{expect}', got {p.returncode}:\n{p.stderr}")
        print(f"{args.model}: refused: {p.stderr.strip().splitlines()[-1]}")

    refused("exceed the model's context of 64", "--prompt", "x" * 60, "--max-new-tokens", "8")
    # The largest count: the context check must not overflow (it wrapped and passed).
    refused("exceed the model's context of 64", "--prompt", "x", "--max-new-tokens",
            "9223372036854775807")
    refused("outside the model's vocabulary of 256", "--prompt-tokens", "1 2 300")
    run(b("ptc-model"), *other, "--seq", str(SEQ), "--vocab", "256", "--batch", "8", "-o",
        w("other.mlir"))
    run(b("ptc-opt"), w("other.mlir"), "--ptc-compile", "-o", w("other.plan"))
    run(b("ptc-run"), w("other.plan"), "--data", w("data.bin"), "--steps", "1", "--save",
        w("other.safetensors"))
    refused("other.safetensors", "--prompt", "the", init=w("other.safetensors"))
    print(f"PASS: {args.model} greedy decoding with the cache matches PyTorch ({NEW_TOKENS} "
          "tokens), on one rank and tp:2, and without the cache")


if __name__ == "__main__":
    main()
