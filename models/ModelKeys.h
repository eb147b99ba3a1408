//===- ModelKeys.h - the model builders' keys, listed once ------*- C++ -*-===//
//
// Every setting of a model builder (gpt, llama, mlp, moe) as one table: its
// name, type, bounds, help, the builders that take it and what the layout
// planner does with it. The table is the one list of them: ptc-model's flags,
// ptc-plan's model flags and ptc-train's [model] schema are made from it, and
// the builders' configurations are read from the values given (ModelArgs,
// models/ModelArgs.cpp). A key is named as the job file spells it
// (`kv_heads`); its flag is the same with dashes (`--kv-heads`).
//
// Header-only and free of MLIR and LLVM: ptc-train, which links no library of
// ours, reads it.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_MODELS_MODELKEYS_H
#define PTC_MODELS_MODELKEYS_H

#include "runtime/base/option_values.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ptc::models {

enum class ModelKeyType { Int, Float, Bool, String };

/// What ptc-plan does with a key of a builder model: a flag of its builder
/// path (shapes it probes at one and two layers), nothing it prices (neutral),
/// or not known to it (a job that sets it is planned from its model file,
/// every layout compiled whole).
enum class PlannerUse { Flag, Neutral, NeedsFile };

struct ModelKey {
  /// The job file's section: "model", or "training" for the batch and the
  /// sequence length (they are the data's shape as well as the model's).
  const char *section;
  const char *name;
  ModelKeyType type;
  const char *help;
  std::vector<BuilderKind> builders;
  PlannerUse planner = PlannerUse::NeedsFile;
  /// Int: the range of a given value.
  int64_t min = 0, max = 0;
  /// String: the values it takes (empty: any, checked by the builder).
  std::vector<std::string> choices = {};

  /// `--kv-heads` for `kv_heads`.
  std::string flag() const {
    std::string f = std::string("--") + name;
    std::replace(f.begin(), f.end(), '_', '-');
    return f;
  }
  bool takenBy(BuilderKind b) const {
    return std::find(builders.begin(), builders.end(), b) != builders.end();
  }
};

/// The keys, each once.
inline const std::vector<ModelKey> &modelKeys() {
  using B = BuilderKind;
  using T = ModelKeyType;
  constexpr PlannerUse kFlag = PlannerUse::Flag, kNeutral = PlannerUse::Neutral,
                       kFile = PlannerUse::NeedsFile;
  constexpr int64_t kSize = int64_t{1} << 31, kCount = 65536, kLayers = 4096;
  const std::vector<B> lm = {B::Gpt, B::Llama}, all = {B::Gpt, B::Llama, B::Mlp, B::Moe};
  static const std::vector<ModelKey> keys = {
      {"model", "preset", T::String, "published shapes of a real model; the other keys override them",
       lm, kFlag},
      {"model", "layers", T::Int, "transformer blocks (gpt, llama) or linear layers (mlp)",
       {B::Gpt, B::Llama, B::Mlp}, kFlag, 1, kLayers},
      {"model", "hidden", T::Int, "hidden size", all, kFlag, 1, kSize},
      {"model", "heads", T::Int, "attention heads (default: gpt 4, llama 8)", lm, kFlag, 1, kCount},
      {"model", "kv_heads", T::Int, "key/value heads, dividing the heads (llama; default: the heads)",
       {B::Llama}, kFlag, 1, kCount},
      {"model", "intermediate", T::Int, "SwiGLU MLP hidden size (llama; default 352)", {B::Llama},
       kFlag, 1, kSize},
      {"model", "vocab", T::Int, "vocabulary size (default 256)", lm, kFlag, 1, kSize},
      {"model", "rope_theta", T::Float, "rotary embedding base (llama)", {B::Llama}, kNeutral},
      {"model", "rms_norm_eps", T::Float, "RMSNorm epsilon (llama)", {B::Llama}, kNeutral},
      {"model", "tie_embeddings", T::Bool,
       "tie the LM head to the token embedding (llama; default: untied)", {B::Llama}, kFile},
      {"model", "dtype", T::String, "parameter and activation type", all, kFile, 0, 0,
       optionSpellings<FloatDtype>()},
      {"model", "dropout", T::Float,
       "dropout probability after the embeddings and each block's attention and MLP (gpt; "
       "default 0)",
       {B::Gpt}, kNeutral},
      {"model", "document_end", T::Int,
       "packed documents: the token id that ends a document; the model takes a 'positions' "
       "input ptc-run fills from the tokens, attention stops at document boundaries and "
       "positions restart (gpt, llama; default -1: one stream)",
       lm, kFile, -1, kSize - 1},
      {"model", "input", T::Int, "input (model) dimension (mlp, moe; default 64)",
       {B::Mlp, B::Moe}, kFile, 1, kSize},
      {"model", "classes", T::Int, "output classes (mlp, moe; default 10)", {B::Mlp, B::Moe}, kFile,
       1, kSize},
      {"model", "experts", T::Int, "experts (moe classifier; default 4)", {B::Moe}, kFile, 1,
       kCount},
      {"model", "top_k", T::Int, "experts per token (moe classifier; default 2)", {B::Moe}, kFile,
       1, kCount},
      {"model", "groups", T::Int,
       "routing groups, each batch / groups consecutive tokens (moe classifier; default 1; a "
       "mesh splits the batch only in whole groups)",
       {B::Moe}, kFile, 1, kCount},
      {"model", "capacity_factor", T::Float,
       "expert capacity = ceil(factor * tokens * k / experts) (moe classifier; default 1.25)",
       {B::Moe}, kFile},
      {"model", "moe_experts", T::Int, "experts per MoE layer (0: dense MLPs; default 0, or the "
       "preset's)", lm, kFlag, 0, kCount},
      {"model", "moe_top_k", T::Int, "experts per token (default 2, or the preset's)", lm, kFlag,
       1, kCount},
      {"model", "moe_every", T::Int, "layers i with i % N == 0 get an MoE MLP (default 1: all)", lm,
       kFlag, 1, kLayers},
      {"model", "moe_ffn", T::Int, "expert hidden size (default: the dense MLP's, or the preset's)",
       lm, kFlag, 1, kSize},
      {"model", "moe_capacity_factor", T::Float,
       "slots per expert per sequence = ceil(factor * seq * k / experts), at most seq (0: "
       "dropless; default 1.25)",
       lm, kFlag},
      {"model", "moe_aux_loss", T::Float, "Switch load-balancing loss coefficient (default 0.01)",
       lm, kNeutral},
      {"model", "moe_z_loss", T::Float, "router z-loss coefficient (default 0)", lm, kNeutral},
      {"model", "moe_shared_experts", T::Int,
       "shared experts every token passes through, added to the routed ones (DeepSeek, "
       "Qwen-MoE; one dense MLP of N x the expert size; default 0)",
       lm, kFile, 0, kCount},
      {"model", "moe_bias_balancing", T::Float,
       "auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on the routing scores, "
       "moved by RATE * sign(mean load - load) after each step (default 0: off)",
       lm, kNeutral},
      // ptc-plan takes the batch as --global-batch, the sequences per step it
      // divides into micro-batches.
      {"training", "batch", T::Int, "global batch (sequences for gpt and llama, rows otherwise)",
       all, kNeutral, 1, kSize},
      {"training", "seq", T::Int, "sequence length, also the block size (gpt, llama; default 64)",
       lm, kFlag, 1, kSize},
  };
  return keys;
}

inline const ModelKey *findModelKey(std::string_view section, std::string_view name) {
  for (const ModelKey &k : modelKeys())
    if (section == k.section && name == k.name)
      return &k;
  return nullptr;
}
/// The key named `name` in either section (names are unique across them).
inline const ModelKey *findModelKey(std::string_view name) {
  for (const ModelKey &k : modelKeys())
    if (name == k.name)
      return &k;
  return nullptr;
}

/// A given value of a key, of its type.
using ModelValue = std::variant<int64_t, double, bool, std::string>;

/// What is wrong with `value` for `key` ("must be at least 1, got 0"), or
/// nothing. The caller names the key as its user spells it.
inline std::optional<std::string> checkModelValue(const ModelKey &key, const ModelValue &value) {
  if (const int64_t *i = std::get_if<int64_t>(&value)) {
    if (*i < key.min)
      return "must be at least " + std::to_string(key.min) + ", got " + std::to_string(*i);
    if (*i > key.max)
      return "must be at most " + std::to_string(key.max) + ", got " + std::to_string(*i);
  } else if (const double *f = std::get_if<double>(&value)) {
    // NaN passes every comparison, and infinity is no setting either.
    if (!std::isfinite(*f))
      return std::string("must be a finite number, got ") + (std::isnan(*f) ? "nan" : "inf");
  } else if (const std::string *s = std::get_if<std::string>(&value)) {
    if (!key.choices.empty() &&
        std::find(key.choices.begin(), key.choices.end(), *s) == key.choices.end()) {
      std::string choices;
      for (size_t n = key.choices.size(), i = 0; i < n; ++i)
        choices += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + key.choices[i];
      return "must be " + choices + ", got '" + *s + "'";
    }
  }
  return std::nullopt;
}

/// The values given for a model's keys (command-line flags, a job's [model]
/// and [training] keys); a key not given takes its builder's default.
class ModelArgs {
public:
  /// Sets `name`, a key of the table, to a value of its type.
  void set(std::string_view name, ModelValue value) {
    assert(findModelKey(name) && "not a key of the model table");
    values[std::string(name)] = std::move(value);
  }
  bool has(std::string_view name) const { return values.find(name) != values.end(); }
  int64_t intOr(std::string_view name, int64_t fallback) const { return get(name, fallback); }
  double floatOr(std::string_view name, double fallback) const { return get(name, fallback); }
  bool boolOr(std::string_view name, bool fallback) const { return get(name, fallback); }
  std::string stringOr(std::string_view name, std::string fallback) const {
    return get(name, std::move(fallback));
  }
  const std::map<std::string, ModelValue, std::less<>> &all() const { return values; }

private:
  template <typename V> V get(std::string_view name, V fallback) const {
    assert(findModelKey(name) && "not a key of the model table");
    auto it = values.find(name);
    if (it == values.end())
      return fallback;
    const V *v = std::get_if<V>(&it->second);
    return v ? *v : fallback;
  }
  std::map<std::string, ModelValue, std::less<>> values;
};

} // namespace ptc::models

#endif // PTC_MODELS_MODELKEYS_H
