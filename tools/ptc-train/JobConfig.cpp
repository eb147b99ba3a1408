//===- JobConfig.cpp - a training job's TOML file, checked ----------------===//

#include "tools/ptc-train/JobConfig.h"

#include "kernels/common/lr_schedule.h"
#include "runtime/base/mesh_text.h"
#include "runtime/base/option_values.h"
#include "runtime/schedule/schedule.h"
#include "runtime/base/text.h"
#include "models/ModelKeys.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

namespace ptc::train {
namespace {
using Kind = Value::Kind;


/// The parts of a job's ptc-compile options: the training math (the
/// optimizer, its schedule, clipping: given to the planner's probes and kept
/// when the planner chooses a layout), the layout (the planner's to choose)
/// and the rest (precision, offload, reductions, the device's memory).
enum class CompileRole { None, Program, Layout, Other };

/// A key's option spelling: "max_grad_norm" -> "--max-grad-norm".
std::string flagOf(const std::string &key) {
  std::string f = "--" + key;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

struct KeyDef {
  const char *section, *key;
  Kind kind;
  const char *help;
  std::vector<std::string> choices = {};
  /// A model builder's key (models/ModelKeys.h): its builders, bounds and
  /// what ptc-plan does with it.
  const models::ModelKey *model = nullptr;
  /// A key that is a ptc-compile option (compiled()): which part of the
  /// program it is, and the option's name ("beta1,beta2" for a pair).
  CompileRole role = CompileRole::None;
  std::string compile = {};
};

/// `def` as the ptc-compile option `option` (default: its key with dashes).
KeyDef compiled(KeyDef def, CompileRole role, const char *option = nullptr) {
  def.role = role;
  def.compile = option ? std::string(option) : flagOf(def.key).substr(2);
  return def;
}

Kind kindOf(models::ModelKeyType type) {
  switch (type) {
  case models::ModelKeyType::Int: return Kind::Int;
  case models::ModelKeyType::Float: return Kind::Float;
  case models::ModelKeyType::Bool: return Kind::Bool;
  case models::ModelKeyType::String: return Kind::String;
  }
  return Kind::String;
}

/// The rows of the model table in `section`, in its order.
std::vector<KeyDef> modelRows(std::string_view section) {
  std::vector<KeyDef> rows;
  for (const models::ModelKey &k : models::modelKeys())
    if (section == k.section)
      rows.push_back({k.section, k.name, kindOf(k.type), k.help, k.choices, &k});
  return rows;
}

const std::vector<KeyDef> &schema() {
  constexpr CompileRole kProgram = CompileRole::Program, kLayout = CompileRole::Layout,
                        kOther = CompileRole::Other;
  static const std::vector<KeyDef> keys = [] {
  std::vector<KeyDef> keys = {
      {"job", "name", Kind::String, "the job's name (default: the file's name without .toml)"},
      {"job", "dir", Kind::String, "folder of the model, plans, metrics, checkpoints (default runs/<name>)"},

      {"model", "name", Kind::String, "the builder", optionSpellings<BuilderKind>()},
      {"model", "file", Kind::String, "a model in the ptc dialect instead of a builder (hand-written or imported)"},

      {"training", "steps", Kind::Int, "optimizer steps to run (required)"},
      {"training", "data", Kind::Strings, "token files (uint16/uint32 .bin), one stream; or a .safetensors of arrays"},
      {"training", "data_blend", Kind::Blend, "weighted datasets [[weight, path], ...] (Megatron's blend)"},
      {"training", "shuffle", Kind::SeedToggle, "the order of the token windows: shuffled by default "
                                                "(seed 0; each window once per epoch, resumable), a seed, "
                                                "or false for the files' order"},
      {"training", "seed", Kind::Int, "seed of the initial parameters"},
      compiled({"training", "max_grad_norm", Kind::Float, "global gradient-norm clipping (0: off)"}, kProgram),
      {"training", "on_nonfinite", Kind::String, "a step with non-finite loss or gradients: skip its update (and warn) or stop", {"skip", "stop"}},
      {"training", "max_skipped_steps", Kind::Int, "with skip: stop after this many such steps in a row (0: no limit)"},
      {"training", "init", Kind::String, "initial weights: safetensors or a Hugging Face folder"},
      {"training", "save", Kind::String, "final weights (safetensors; a path ending in / : HF shards)"},
      {"training", "device", Kind::String, "cpu, cuda or auto", {"cpu", "cuda", "auto", "cpu-discrete"}},
      {"training", "threads", Kind::Int, "kernel threads per rank (default: cores / ranks)"},

      compiled({"optimizer", "name", Kind::String, "optimizer", {"adamw", "sgd", "adafactor", "muon"}}, kProgram, "optimizer"),
      compiled({"optimizer", "lr", Kind::Float, "learning rate (the peak, with a schedule)"}, kProgram),
      compiled({"optimizer", "betas", Kind::FloatPair, "AdamW [beta1, beta2]"}, kProgram, "beta1,beta2"),
      compiled({"optimizer", "eps", Kind::Float, "AdamW epsilon"}, kProgram),
      compiled({"optimizer", "weight_decay", Kind::Float, "decoupled weight decay (matrices)"}, kProgram),
      compiled({"optimizer", "momentum", Kind::Float, "SGD momentum"}, kProgram),
      compiled({"optimizer", "muon_momentum", Kind::Float, "Muon momentum (default 0.95)"}, kProgram),
      compiled({"optimizer", "muon_nesterov", Kind::Bool, "Muon: Nesterov momentum (default true)"}, kProgram),
      compiled({"optimizer", "muon_ns_steps", Kind::Int, "Muon: Newton-Schulz iterations (default 5)"}, kProgram),
      compiled({"optimizer", "muon_ns_dtype", Kind::String, "Muon: Newton-Schulz element type", {"f32", "bf16"}}, kProgram),
      compiled({"optimizer", "muon_scale", Kind::Float, "Muon: update scale times sqrt(max(rows, cols)) (default 0.2)"}, kProgram),

      compiled({"lr_scheduler", "warmup_steps", Kind::Int, "linear warmup steps"}, kProgram),
      compiled({"lr_scheduler", "decay", Kind::String, "after warmup", {"constant", "cosine", "linear"}}, kProgram, "lr-schedule"),
      compiled({"lr_scheduler", "decay_steps", Kind::Int, "step at which the decay reaches min_lr (default: steps)"}, kProgram),
      compiled({"lr_scheduler", "min_lr", Kind::Float, "learning rate at the end of the decay"}, kProgram),

      compiled({"parallelism", "mesh", Kind::String, "device mesh, e.g. \"dp:2,tp:2\" (ranks = the product)"}, kLayout),
      compiled({"parallelism", "microbatches", Kind::Int, "micro-batches per step (accumulation, pipelines)"}, kLayout),
      compiled({"parallelism", "schedule", Kind::String, "pipeline schedule", optionSpellings<schedule::ScheduleKind>()}, kLayout),
      compiled({"parallelism", "virtual_stages", Kind::Int, "model chunks per pipeline rank"}, kLayout),
      compiled({"parallelism", "zero", Kind::Int, "ZeRO stage over dp (0-3)"}, kLayout),
      compiled({"parallelism", "reshard_after_forward", Kind::Bool, "ZeRO-3: gather again in the backward pass (default true; false: FSDP's SHARD_GRAD_OP)"}, kLayout),
      compiled({"parallelism", "sequence_parallel", Kind::Bool, "split the sequence over tp too (Megatron-SP)"}, kLayout),
      compiled({"parallelism", "cp_attention", Kind::String, "attention under a cp mesh axis (context parallelism)", optionSpellings<CpAttention>()}, kLayout),
      compiled({"parallelism", "recompute", Kind::String, "activation recomputation", optionSpellings<Recompute>()}, kLayout),
      compiled({"parallelism", "recompute_layers", Kind::Int, "recompute only the first N layers of a chunk"}, kLayout),
      compiled({"parallelism", "precision", Kind::String, "compute precision", optionSpellings<Precision>()}, kOther),
      compiled({"parallelism", "offload", Kind::String, "optimizer offload to host memory", optionSpellings<Offload>()}, kOther),
      compiled({"parallelism", "offload_target", Kind::String, "where offloaded state lives", optionSpellings<OffloadTarget>()}, kOther),
      compiled({"parallelism", "offload_path", Kind::String, "nvme: the directory of the offload file"}, kOther),
      compiled({"parallelism", "grad_reduce_dtype", Kind::String, "gradient reduction type", {"f32", "bf16"}}, kOther),
      compiled({"parallelism", "bucket_mb", Kind::Float, "gradient all-reduce bucket size in MiB"}, kOther),
      compiled({"parallelism", "dynamic_loss_scale", Kind::Bool, "dynamic loss scaling (f16)"}, kOther),

      {"checkpoint", "dir", Kind::String, "checkpoint folder (default <dir>/checkpoints)"},
      {"checkpoint", "every", Kind::Int, "a checkpoint every N steps (and at the end)"},
      {"checkpoint", "keep_last", Kind::Int, "keep the K newest checkpoints"},
      {"checkpoint", "resume", Kind::Bool, "continue from the newest checkpoint when there is one (default true)"},
      {"checkpoint", "async", Kind::Bool, "write checkpoints in a background thread"},
      {"checkpoint", "max_restarts", Kind::Int, "restart a failed job from its checkpoint, at most N times"},

      {"launch", "launcher", Kind::String, "how the ranks start: auto (srun inside a Slurm allocation, else mpirun)",
       optionSpellings<Launcher>()},
      {"launch", "hostfile", Kind::String, "mpirun's hosts (Open MPI syntax, HOST slots=N): the ranks available"},
      {"launch", "elastic", Kind::Bool, "on fewer ranks than the mesh: re-plan (ptc-plan), recompile, resume"},
      {"launch", "cluster", Kind::String, "the planner's machine for elastic re-plans: a ptc-plan preset or JSON "
                                          "(default: this machine, calibrated once into the job's folder)"},
      compiled({"launch", "device_memory", Kind::String, "memory per device, e.g. \"80GB\": the compile refuses a plan that needs "
                                                "more, elastic re-plans choose layouts within it (default: no check; "
                                                "the planner's cluster's)"}, kOther),

      {"eval", "data", Kind::String, "validation token file"},
      {"eval", "every", Kind::Int, "evaluate every N steps (and after the last)"},
      {"eval", "steps", Kind::Int, "batches per evaluation"},

      {"metrics", "log_every", Kind::Int, "progress line every N steps (0: none)"},
      {"metrics", "jsonl", Kind::Toggle, "JSON lines: true (<dir>/metrics.jsonl), false or a path"},
      {"metrics", "csv", Kind::Toggle, "CSV table: true (<dir>/metrics.csv), false or a path"},
      {"metrics", "tensorboard", Kind::Toggle, "TensorBoard events: true (<dir>/tensorboard), false or a folder"},
      {"metrics", "peak_tflops", Kind::Float, "the device's peak for MFU (default: measured)"},
  };
  // The builders' keys from their table: [model]'s after its file, the batch
  // and the sequence length after [training]'s steps.
  auto after = [&](const char *section, const char *key, std::vector<KeyDef> rows) {
    auto at = std::find_if(keys.begin(), keys.end(), [&](const KeyDef &d) {
      return std::string_view(d.section) == section && std::string_view(d.key) == key;
    });
    keys.insert(at + 1, rows.begin(), rows.end());
  };
  after("model", "file", modelRows("model"));
  after("training", "steps", modelRows("training"));
  return keys;
  }();
  return keys;
}

/// Model keys each builder takes (the rest of [model] is name, file, preset).
/// Each builder's [model] keys, from the schema's `builders`.
const std::map<std::string, std::set<std::string>> &builderKeys() {
  static const std::map<std::string, std::set<std::string>> keys = [] {
    std::map<std::string, std::set<std::string>> k;
    for (const KeyDef &d : schema())
      if (d.model && std::string_view(d.section) == "model")
        for (BuilderKind b : d.model->builders)
          k[std::string(optionName(b))].insert(d.key);
    return k;
  }();
  return keys;
}

const KeyDef *findKey(const std::string &section, const std::string &key) {
  for (const KeyDef &d : schema())
    if (section == d.section && key == d.key)
      return &d;
  return nullptr;
}

std::string where(const std::string &path, const toml::source_region &src) {
  if (src.begin.line == 0)
    return path + ": ";
  return path + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column) + ": ";
}

std::string keysOf(const std::string &section) {
  std::string out;
  for (const KeyDef &d : schema())
    if (section == d.section)
      out += (out.empty() ? "" : ", ") + std::string(d.key);
  return out;
}

const char *kindName(Kind k) {
  switch (k) {
  case Kind::Toggle: return "true, false or a path";
  case Kind::Int: return "an integer >= 0";
  case Kind::Float: return "a finite number";
  case Kind::Bool: return "true or false";
  case Kind::String: return "a string";
  case Kind::Strings: return "a string or an array of strings";
  case Kind::Blend: return "an array of [weight, path] pairs";
  case Kind::FloatPair: return "an array of two numbers";
  case Kind::SeedToggle: return "true, false or a seed (an integer >= 0)";
  }
  return "";
}

std::optional<double> number(const toml::node &n) {
  if (auto i = n.value_exact<int64_t>())
    return static_cast<double>(*i);
  if (auto f = n.value_exact<double>())
    return *f;
  return std::nullopt;
}

/// Converts `n` to the key's kind; nullopt when it is not one.
std::optional<Value> convert(const KeyDef &def, const toml::node &n) {
  Value v;
  v.kind = def.kind;
  switch (def.kind) {
  case Kind::Int:
    if (auto i = n.value_exact<int64_t>(); i && *i >= 0) {
      v.i = *i;
      return v;
    }
    return std::nullopt;
  case Kind::Float:
    if (auto f = number(n); f && std::isfinite(*f)) {
      v.f = *f;
      return v;
    }
    return std::nullopt;
  case Kind::Bool:
    if (auto b = n.value_exact<bool>()) {
      v.b = *b;
      return v;
    }
    return std::nullopt;
  case Kind::String:
    if (auto s = n.value_exact<std::string>()) {
      v.s = *s;
      return v;
    }
    return std::nullopt;
  case Kind::SeedToggle:
    if (auto b = n.value_exact<bool>()) {
      v.b = *b;
      return v;
    }
    if (auto i = n.value_exact<int64_t>(); i && *i >= 0) {
      v.b = true;
      v.i = *i;
      return v;
    }
    return std::nullopt;
  case Kind::Toggle:
    if (auto b = n.value_exact<bool>()) {
      v.s = *b ? "true" : "false";
      return v;
    }
    if (auto s = n.value_exact<std::string>(); s && !s->empty()) {
      v.s = *s;
      return v;
    }
    return std::nullopt;
  case Kind::Strings:
    if (auto s = n.value_exact<std::string>()) {
      v.strings = {*s};
      v.s = *s;
      return v;
    }
    if (const toml::array *a = n.as_array(); a && !a->empty()) {
      for (const toml::node &e : *a) {
        auto s = e.value_exact<std::string>();
        if (!s)
          return std::nullopt;
        v.strings.push_back(*s);
      }
      return v;
    }
    return std::nullopt;
  case Kind::Blend:
    if (const toml::array *a = n.as_array(); a && !a->empty()) {
      for (const toml::node &e : *a) {
        const toml::array *pair = e.as_array();
        if (!pair || pair->size() != 2)
          return std::nullopt;
        auto w = number(*pair->get(0));
        auto p = pair->get(1)->value_exact<std::string>();
        if (!w || !p || !(*w > 0) || !std::isfinite(*w))
          return std::nullopt;
        v.blend.push_back({*w, *p});
      }
      return v;
    }
    return std::nullopt;
  case Kind::FloatPair:
    if (const toml::array *a = n.as_array(); a && a->size() == 2) {
      auto x = number(*a->get(0)), y = number(*a->get(1));
      if (!x || !y)
        return std::nullopt;
      v.pair[0] = *x;
      v.pair[1] = *y;
      return v;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

/// "section.key=value": the value parsed as TOML, or taken as a bare string.
bool applyOverride(toml::table &root, const std::string &text, std::string &error) {
  size_t eq = text.find('='), dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq) {
    error = "--set '" + text + "': expected SECTION.KEY=VALUE (e.g. training.steps=100)";
    return false;
  }
  std::string section = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1),
              value = text.substr(eq + 1);
  if (!findKey(section, key)) {
    error = "--set " + section + "." + key + ": unknown key" +
            (keysOf(section).empty() ? " (no section [" + section + "])"
                                     : " (the keys of [" + section + "]: " + keysOf(section) + ")");
    return false;
  }
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error &) {
    parsed = toml::table{{"v", value}}; // a bare word: a string
  }
  toml::node *node = parsed.get("v");
  toml::table *sec = root[section].as_table();
  if (!sec) {
    root.insert_or_assign(section, toml::table{});
    sec = root[section].as_table();
  }
  sec->insert_or_assign(key, *node);
  return true;
}

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

} // namespace

std::optional<Job> loadJob(const std::string &path, const std::vector<std::string> &overrides,
                           std::string &error) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error &e) {
    error = where(path, e.source()) + std::string(e.description());
    return std::nullopt;
  }
  for (const std::string &o : overrides)
    if (!applyOverride(root, o, error))
      return std::nullopt;

  Job job;
  job.path = path;
  for (auto &&[sectionKey, sectionNode] : root) {
    std::string section(sectionKey.str());
    const toml::table *table = sectionNode.as_table();
    if (keysOf(section).empty()) {
      error = where(path, sectionNode.source()) + "unknown section [" + section +
              "] (sections: job, model, training, optimizer, lr_scheduler, parallelism, "
              "checkpoint, launch, eval, metrics)";
      return std::nullopt;
    }
    if (!table) {
      error = where(path, sectionNode.source()) + "'" + section + "' must be a section ([" +
              section + "]), not a value";
      return std::nullopt;
    }
    for (auto &&[k, node] : *table) {
      std::string key(k.str());
      const KeyDef *def = findKey(section, key);
      if (!def) {
        error = where(path, node.source()) + "unknown key '" + section + "." + key +
                "' (the keys of [" + section + "]: " + keysOf(section) + ")";
        return std::nullopt;
      }
      std::optional<Value> v = convert(*def, node);
      if (!v) {
        std::ostringstream shown;
        node.visit([&](auto &&n) { shown << n; });
        error = where(path, node.source()) + section + "." + key + " = " + shown.str() +
                ": expected " + kindName(def->kind);
        return std::nullopt;
      }
      if (def->model) {
        const models::ModelValue value =
            v->kind == Kind::Int     ? models::ModelValue(v->i)
            : v->kind == Kind::Float ? models::ModelValue(v->f)
            : v->kind == Kind::Bool  ? models::ModelValue(v->b)
                                     : models::ModelValue(v->s);
        if (std::optional<std::string> problem = models::checkModelValue(*def->model, value);
            problem && def->choices.empty()) {
          std::ostringstream shown;
          node.visit([&](auto &&n) { shown << n; });
          error = where(path, node.source()) + section + "." + key + " = " + shown.str() + ": " +
                  *problem;
          return std::nullopt;
        }
      }
      if (!def->choices.empty() &&
          std::find(def->choices.begin(), def->choices.end(), v->s) == def->choices.end()) {
        std::string list;
        for (const std::string &c : def->choices)
          list += (list.empty() ? "" : ", ") + c;
        error = where(path, node.source()) + section + "." + key + " = \"" + v->s +
                "\": expected one of " + list;
        return std::nullopt;
      }
      job.values[section + "." + key] = *v;
    }
  }

  // What the keys need of each other.
  auto fail = [&](const std::string &message) {
    error = path + ": " + message;
    return std::nullopt;
  };
  const Value *model = job.get("model.name"), *file = job.get("model.file");
  if (!model && !file)
    return fail("[model] needs name (" + optionChoices<BuilderKind>() +
                ") or file (a model in the ptc dialect)");
  if (model && file)
    return fail("[model] has both name and file: a job trains one model");
  for (const auto &[key, value] : job.values) {
    if (key.rfind("model.", 0) != 0 || key == "model.name" || key == "model.file")
      continue;
    std::string field = key.substr(6);
    if (file)
      return fail("model." + field + " configures a builder, but [model] file names a written model");
    if (!builderKeys().at(model->s).count(field))
      return fail("model." + field + " is not a field of the " + model->s + " builder (its fields: " +
                  [&] {
                    std::string l;
                    for (const std::string &f : builderKeys().at(model->s))
                      l += (l.empty() ? "" : ", ") + f;
                    return l;
                  }() +
                  ")");
  }
  // A written model's batch and sequence are its inputs' shapes: keys that
  // would size it cannot take effect.
  for (const char *k : {"training.batch", "training.seq"})
    if (file && job.has(k))
      return fail(std::string(k) + " sizes a builder's model, but [model] file names a written one, "
                  "whose inputs fix it: remove " + k + " (or rebuild the file at that size)");
  if (!job.has("training.steps") || job.get("training.steps")->i == 0)
    return fail("[training] needs steps (a number of optimizer steps > 0)");
  if (job.has("training.data") && job.has("training.data_blend"))
    return fail("[training] has both data and data_blend: name the datasets once");
  const bool languageModel = file || isLanguageModel(*parseOption<BuilderKind>(model->s));
  if (!job.has("training.data") && !job.has("training.data_blend") && languageModel)
    return fail("[training] needs data (token files) or data_blend");
  if (job.has("training.seq") && !languageModel)
    return fail("training.seq is the sequence length of gpt and llama models; " + model->s +
                " takes rows (training.batch)");
  for (const char *k : {"eval.every", "eval.steps"})
    if (job.has(k) && !job.has("eval.data"))
      return fail(std::string(k) + " needs eval.data (a validation token file)");
  for (const char *k : {"lr_scheduler.warmup_steps", "lr_scheduler.decay_steps", "lr_scheduler.min_lr"})
    if (job.has(k) && !job.has("lr_scheduler.decay"))
      return fail(std::string(k) + " needs lr_scheduler.decay (constant, cosine or linear)");
  // Where a decay ends means nothing without one.
  if (const Value *decay = job.get("lr_scheduler.decay");
      decay && kernels::lookupLrScheduleKind(decay->s) == kernels::LrScheduleKind::Constant)
    for (const char *k : {"lr_scheduler.decay_steps", "lr_scheduler.min_lr"})
      if (job.has(k))
        return fail(std::string(k) + " has no effect with decay = \"constant\" (it says where "
                    "a cosine or linear decay ends)");
  // A decaying schedule warms up, then decays until decay_steps (by default
  // the job's steps): said in the job's keys here, not as the compiler's
  // option names after the model is built.
  if (const Value *decay = job.get("lr_scheduler.decay"); decay && kernels::lookupLrScheduleKind(decay->s) != kernels::LrScheduleKind::Constant) {
    const Value *warmup = job.get("lr_scheduler.warmup_steps"), *until = job.get("lr_scheduler.decay_steps");
    const int64_t w = warmup ? warmup->i : 0, d = until ? until->i : job.get("training.steps")->i;
    if (w < 0 || w >= d)
      return fail("lr_scheduler.warmup_steps = " + std::to_string(w) + " must be below " +
                  (until ? "lr_scheduler.decay_steps = " + std::to_string(d)
                         : "the steps the schedule decays over (lr_scheduler.decay_steps, by default "
                           "training.steps = " + std::to_string(d) + ")") +
                  " for decay = \"" + decay->s + "\"");
  }

  if (const Value *e = job.get("launch.elastic"); e && e->b) {
    bool checkpoints = false;
    for (const auto &[key, value] : job.values)
      checkpoints |= key.rfind("checkpoint.", 0) == 0;
    if (!checkpoints || (job.has("checkpoint.resume") && !job.get("checkpoint.resume")->b))
      return fail("launch.elastic continues from checkpoints: it needs [checkpoint] (every = N) with resume");
  }
  if (job.has("launch.hostfile") && job.has("launch.launcher") &&
      parseOption<Launcher>(job.get("launch.launcher")->s) == Launcher::Srun)
    return fail("launch.hostfile is mpirun's; under srun, Slurm's allocation says where the ranks run");

  job.name = job.has("job.name") ? job.get("job.name")->s
                                  : std::filesystem::path(path).stem().string();
  // The name is a folder and appears in logs: printable, no '/', not . or ..
  // (a NUL would cut the path the tools are given short).
  if (job.name.empty() || job.name.find('/') != std::string::npos || job.name == "." ||
      job.name == ".." || !ptc::isPrintableUtf8(job.name))
    return fail("job.name '" + ptc::escapedForMessage(job.name) + "' is not a folder name");
  job.dir = job.has("job.dir") ? job.get("job.dir")->s : "runs/" + job.name;
  if (job.dir.empty() || job.dir.find('\0') != std::string::npos)
    return fail("job.dir '" + ptc::escapedForMessage(job.dir) + "' is not a path");
  return job;
}

std::optional<JobCommands> jobCommands(const Job &job, std::string &error) {
  JobCommands c;
  auto get = [&](const std::string &k) { return job.get(k); };
  // The model.
  if (const Value *file = get("model.file")) {
    c.modelFile = file->s;
  } else {
    const std::string &name = get("model.name")->s;
    c.model = {"ptc-model", name};
    for (const auto &[key, value] : job.values) {
      if (key.rfind("model.", 0) != 0 || key == "model.name")
        continue;
      const std::string flag = models::findModelKey("model", key.substr(6))->flag();
      switch (value.kind) {
      case Kind::Bool:
        if (value.b)
          c.model.push_back(flag);
        break;
      case Kind::Int:
        c.model.push_back(flag + "=" + std::to_string(value.i));
        break;
      case Kind::Float:
        c.model.push_back(flag + "=" + fmt(value.f));
        break;
      default:
        c.model.push_back(flag + "=" + value.s);
      }
    }
    for (const char *key : {"batch", "seq"})
      if (const Value *v = get(std::string("training.") + key))
        c.model.push_back(models::findModelKey("training", key)->flag() + "=" + std::to_string(v->i));
    // Weights saved in Hugging Face's form (a folder) get its config.json.
    if (const Value *save = get("training.save");
        save && parseOption<BuilderKind>(name) == BuilderKind::Llama && !save->s.empty() && save->s.back() == '/' &&
        !job.has("model.moe_experts")) {
      c.hfConfig = save->s + "config.json";
      c.model.push_back("--hf-config=" + c.hfConfig);
    }
    c.modelFile = job.dir + "/model.mlir";
    c.model.push_back("-o");
    c.model.push_back(c.modelFile);
  }

  // The compile options: every key that is one (compiled() in the schema),
  // the training math first (the planner's probes compile with it alone).
  std::vector<std::string> opts;
  auto opt = [&](const std::string &name, const std::string &value) { opts.push_back(name + "=" + value); };
  auto emit = [&](const KeyDef &d, const Value &v) {
    switch (v.kind) {
    case Kind::Int:
      return opt(d.compile, std::to_string(v.i));
    case Kind::Float:
      return opt(d.compile, fmt(v.f));
    case Kind::Bool:
      return opt(d.compile, v.b ? "true" : "false");
    case Kind::FloatPair: { // "beta1,beta2"
      const size_t comma = d.compile.find(',');
      opt(d.compile.substr(0, comma), fmt(v.pair[0]));
      return opt(d.compile.substr(comma + 1), fmt(v.pair[1]));
    }
    default:
      return opt(d.compile, v.s);
    }
  };
  for (CompileRole part : {CompileRole::Program, CompileRole::Layout, CompileRole::Other}) {
    for (const KeyDef &d : schema())
      if (d.role == part)
        if (const Value *v = get(std::string(d.section) + "." + d.key))
          emit(d, *v);
    if (part != CompileRole::Program)
      continue;
    // A decaying schedule ends at the last step unless told otherwise.
    if (const Value *v = get("lr_scheduler.decay");
        v && kernels::lookupLrScheduleKind(v->s) != kernels::LrScheduleKind::Constant &&
        !get("lr_scheduler.decay_steps"))
      opt("decay-steps", std::to_string(get("training.steps")->i));
    for (const std::string &o : opts)
      c.programOptions += (c.programOptions.empty() ? "" : " ") + o;
  }
  // The rank count: the product of the mesh (ptc-opt checks the names).
  if (const Value *v = get("parallelism.mesh")) {
    StatusOr<MeshText> mesh = parseMeshText(v->s);
    if (!mesh.isOk()) {
      error = job.path + ": parallelism.mesh = \"" + v->s + "\": " + mesh.status().message();
      return std::nullopt;
    }
    c.ranks = static_cast<int>(mesh->devices());
  }
  for (const std::string &o : opts)
    c.compileOptions += (c.compileOptions.empty() ? "" : " ") + o;

  // The run.
  auto &r = c.run;
  r = {"ptc-run", "", "--steps", std::to_string(get("training.steps")->i)};
  if (c.ranks > 1) {
    r.push_back("--np");
    r.push_back(std::to_string(c.ranks));
    if (const Value *v = get("launch.hostfile"))
      r.insert(r.end(), {"--hostfile", v->s});
  }
  if (const Value *v = get("training.data")) {
    std::string joined;
    for (const std::string &p : v->strings)
      joined += (joined.empty() ? "" : ",") + p;
    r.insert(r.end(), {"--data", joined});
  }
  if (const Value *v = get("training.data_blend")) {
    std::string spec;
    for (const auto &[w, p] : v->blend)
      spec += (spec.empty() ? "" : " ") + fmt(w) + " " + p;
    r.insert(r.end(), {"--data-blend", spec});
  }
  // The windows in a seeded order unless the job says false: a corpus of
  // files one after another would otherwise change under the model as it
  // trains (a loss that jumps where the next file starts).
  const Value *model = get("model.name");
  const bool tokenWindows =
      !model || isLanguageModel(*parseOption<BuilderKind>(model->s)); // (or a file's)
  if (const Value *v = get("training.shuffle"); v ? v->b : tokenWindows)
    r.insert(r.end(), {"--shuffle", std::to_string(v ? v->i : 0)});
  for (auto [key, flag] : {std::pair{"training.seed", "--seed"},
                           {"training.threads", "--threads"}, {"eval.every", "--eval-every"},
                           {"eval.steps", "--eval-steps"}, {"metrics.log_every", "--log-every"},
                           {"checkpoint.every", "--checkpoint-every"},
                           {"checkpoint.keep_last", "--keep-last"},
                           {"checkpoint.max_restarts", "--max-restarts"},
                           {"training.max_skipped_steps", "--max-skipped-steps"}})
    if (const Value *v = get(key))
      r.insert(r.end(), {flag, std::to_string(v->i)});
  for (auto [key, flag] : {std::pair{"training.init", "--init"}, {"training.save", "--save"},
                           {"training.device", "--device"}, {"eval.data", "--eval-data"},
                           {"training.on_nonfinite", "--on-nonfinite"}})
    if (const Value *v = get(key))
      r.insert(r.end(), {flag, v->s});
  if (const Value *v = get("metrics.peak_tflops"))
    r.insert(r.end(), {"--peak-tflops", fmt(v->f)});
  // Metrics files: on by default, in the job's folder.
  for (auto [key, flag, file] : {std::tuple{"metrics.jsonl", "--metrics", "metrics.jsonl"},
                                 {"metrics.csv", "--metrics-csv", "metrics.csv"},
                                 {"metrics.tensorboard", "--tensorboard", "tensorboard"}}) {
    const Value *v = get(key);
    if (v && v->s == "false")
      continue;
    r.insert(r.end(), {flag, !v || v->s == "true" ? job.dir + "/" + file : v->s});
  }
  // Checkpoints: a folder when any checkpoint key is set; resume by default.
  bool checkpoints = false;
  for (const auto &[key, value] : job.values)
    checkpoints |= key.rfind("checkpoint.", 0) == 0;
  if (checkpoints) {
    const Value *dir = get("checkpoint.dir");
    r.insert(r.end(), {"--checkpoint-dir", dir ? dir->s : job.dir + "/checkpoints"});
    if (const Value *a = get("checkpoint.async"); a && a->b)
      r.push_back("--async-checkpoint");
  }
  return c;
}

std::optional<std::string> applyLayout(Job &job, const std::string &options, std::string &error) {
  // The layout keys the planner decides (CompileRole::Layout); the rest of
  // the job (the optimizer, the precision, the data, the global batch) is
  // the training math and stays.
  auto layoutKey = [](const std::string &option) -> const KeyDef * {
    for (const KeyDef &d : schema())
      if (d.role == CompileRole::Layout && d.compile == option)
        return &d;
    return nullptr;
  };
  auto describe = [&] {
    std::string d;
    for (const KeyDef &def : schema())
      if (def.role == CompileRole::Layout)
        if (const Value *v = job.get(std::string(def.section) + "." + def.key)) {
          std::string text = v->kind == Kind::Int    ? std::to_string(v->i)
                             : v->kind == Kind::Bool ? (v->b ? "true" : "false")
                                                     : v->s;
          d += (d.empty() ? "" : " ") + def.compile + "=" + text;
        }
    return d.empty() ? std::string("one rank") : d;
  };
  const std::string before = describe();
  for (const KeyDef &def : schema())
    if (def.role == CompileRole::Layout)
      job.values.erase(std::string(def.section) + "." + def.key);
  std::istringstream words(options);
  for (std::string word; words >> word;) {
    size_t eq = word.find('=');
    std::string name = word.substr(0, eq), text = eq == std::string::npos ? "" : word.substr(eq + 1);
    if (name == "precision")
      continue; // the job's own, given to the planner
    const KeyDef *def = layoutKey(name);
    if (!def || text.empty()) {
      error = "the planner's layout '" + options + "' has '" + word + "', which ptc-train cannot set";
      return std::nullopt;
    }
    Value v;
    v.kind = def->kind;
    if (def->kind == Kind::Int) {
      v.i = std::strtoll(text.c_str(), nullptr, 10);
    } else if (def->kind == Kind::Bool) {
      v.b = text == "true";
    } else {
      v.s = text;
    }
    job.values[std::string(def->section) + "." + def->key] = v;
  }
  return before + " -> " + describe();
}

std::string describeSchema() {
  std::ostringstream os;
  std::string section;
  for (const KeyDef &d : schema()) {
    if (section != d.section) {
      section = d.section;
      os << "[" << section << "]\n";
    }
    std::string line = "  " + std::string(d.key) + " (" + kindName(d.kind) + ")";
    if (line.size() < 40)
      line.resize(40, ' ');
    os << line << " " << d.help;
    if (!d.choices.empty()) {
      os << ":";
      for (const std::string &c : d.choices)
        os << " " << c;
    }
    os << "\n";
  }
  return os.str();
}

} // namespace ptc::train
