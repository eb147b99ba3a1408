//===- Presets.cpp - published shapes of real models ----------------------===//
//
// Each preset is the config.json of the model's Hugging Face repository
// (named in `source`): layers, hidden size, heads, key/value heads, MLP
// size, context length (the default --seq), vocabulary, rotary base, RMSNorm
// epsilon and whether the LM head is tied. Mistral's sliding-window attention
// is not modelled: its preset attends over the whole --seq.
//
//===----------------------------------------------------------------------===//

#include "models/Models.h"

using namespace mlir;
using namespace mlir::ptc;

const std::vector<ModelPreset> &mlir::ptc::modelPresets() {
  static const std::vector<ModelPreset> presets = {
      // name, model, source, layers, hidden, heads, kv heads, intermediate, seq, vocab,
      // rope theta, rms eps, tied
      {"gpt2", "gpt", "openai-community/gpt2", 12, 768, 12, 12, 3072, 1024, 50257, 0, 0, true},
      {"gpt2-medium", "gpt", "openai-community/gpt2-medium", 24, 1024, 16, 16, 4096, 1024, 50257,
       0, 0, true},
      {"gpt2-large", "gpt", "openai-community/gpt2-large", 36, 1280, 20, 20, 5120, 1024, 50257, 0,
       0, true},
      {"gpt2-xl", "gpt", "openai-community/gpt2-xl", 48, 1600, 25, 25, 6400, 1024, 50257, 0, 0,
       true},
      {"llama2-7b", "llama", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 4096, 32000,
       10000.0, 1e-5, false},
      {"llama2-13b", "llama", "meta-llama/Llama-2-13b-hf", 40, 5120, 40, 40, 13824, 4096, 32000,
       10000.0, 1e-5, false},
      {"llama2-70b", "llama", "meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 28672, 4096, 32000,
       10000.0, 1e-5, false},
      {"llama3-8b", "llama", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 14336, 8192, 128256,
       500000.0, 1e-5, false},
      {"llama3-70b", "llama", "meta-llama/Meta-Llama-3-70B", 80, 8192, 64, 8, 28672, 8192,
       128256, 500000.0, 1e-5, false},
      {"mistral-7b", "llama", "mistralai/Mistral-7B-v0.1", 32, 4096, 32, 8, 14336, 32768, 32000,
       10000.0, 1e-5, false},
      // rope theta, rms eps, tied, experts, top-k
      {"mixtral-8x7b", "llama", "mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 14336, 32768,
       32000, 1e6, 1e-5, false, 8, 2},
  };
  return presets;
}

const ModelPreset *mlir::ptc::findModelPreset(StringRef model, StringRef name) {
  for (const ModelPreset &p : modelPresets())
    if (model == p.model && name == p.name)
      return &p;
  return nullptr;
}

std::string mlir::ptc::describePresets() {
  std::string text;
  for (const char *model : {"gpt", "llama"}) {
    std::string names;
    for (const ModelPreset &p : modelPresets())
      if (StringRef(p.model) == model)
        names += (names.empty() ? "" : ", ") + std::string(p.name);
    text += (text.empty() ? "" : "; ") + std::string(model) + ": " + names;
  }
  return text;
}
