"""train.test: a Hugging Face folder (config.json + safetensors shards + index) written by
ptc-train / ptc-run. Builds test/e2e's independent PyTorch Llama from config.json, loads
the weights strictly, and compares its mean loss over the evaluation's batches (the
standard order's first eval.steps batches) with the run's last eval_loss.

  check_hf_folder.py FOLDER DATA.bin METRICS.csv E2E_DIR"""
import csv
import glob
import json
import sys

import numpy as np
import torch

folder, data, metrics, e2e = sys.argv[1:5]
sys.path.insert(0, e2e)
import reference_gpt  # noqa: E402
import reference_llama  # noqa: E402

cfg = json.load(open(folder + "/config.json"))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
index = json.load(open(folder + "/model.safetensors.index.json"))
weights = {}
for f in sorted(glob.glob(folder + "/*.safetensors")):
    weights.update(reference_gpt.load_safetensors(f))
assert set(weights) == set(index["weight_map"]), "the index lists the shards' tensors"
model = reference_llama.Llama(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
                              cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"],
                              cfg["rope_theta"], cfg["rms_norm_eps"], cfg["tie_word_embeddings"])
model.load_state_dict(weights, strict=True)
tokens = np.fromfile(data, dtype="<u2").astype(np.int64)
seq, batch, steps = cfg["max_position_embeddings"], 4, 2
span = len(tokens) - seq - 1
losses = []
with torch.no_grad():
    for e in range(steps):
        starts = [((e * batch + j) * seq) % span for j in range(batch)]
        x = torch.tensor(np.stack([tokens[s:s + seq] for s in starts]))
        y = torch.tensor(np.stack([tokens[s + 1:s + seq + 1] for s in starts]))
        losses.append(model(x, y).item())
mine = sum(losses) / len(losses)
rows = [r for r in csv.DictReader(open(metrics)) if r["eval_loss"]]
theirs = float(rows[-1]["eval_loss"])
print(f"reference loss {mine:.6f}, ptc eval_loss {theirs:.6f}")
assert abs(mine - theirs) <= 1e-4 * abs(theirs), (mine, theirs)
