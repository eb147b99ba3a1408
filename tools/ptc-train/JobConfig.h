// A training job as one TOML file: the schema of its sections and keys, the
// checks (an unknown key or a bad value is one error naming it and its line),
// --set overrides, and the ptc-model / ptc-opt / ptc-run command lines the job
// stands for.
#ifndef PTC_TOOLS_PTC_TRAIN_JOBCONFIG_H
#define PTC_TOOLS_PTC_TRAIN_JOBCONFIG_H

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ptc::train {

/// A checked value of the job: what the schema says the key holds.
struct Value {
  enum class Kind { Int, Float, Bool, String, Strings, Toggle, Blend, FloatPair, SeedToggle } kind = Kind::String;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::vector<std::string> strings;                    // Strings (a string is one)
                                                       // Toggle: s is "true", "false" or a path
  std::vector<std::pair<double, std::string>> blend;   // Blend: [[weight, path], ...]
  double pair[2] = {0.0, 0.0};                         // FloatPair: [a, b]
                                                       // SeedToggle: b (on), i (its seed)
};

/// The job: "section.key" -> value, after --set overrides and checks.
struct Job {
  std::string path;     ///< the TOML file
  std::string name;     ///< [job] name (default: the file's stem)
  std::string dir;      ///< [job] dir (default: runs/<name>)
  std::map<std::string, Value> values;

  bool has(const std::string &key) const { return values.count(key) != 0; }
  const Value *get(const std::string &key) const {
    auto it = values.find(key);
    return it == values.end() ? nullptr : &it->second;
  }
};

/// Reads and checks `path` with `overrides` ("section.key=value", the value
/// in TOML syntax, or a bare string). On failure returns nullopt with the
/// message in `error` ("FILE:LINE:COL: ..." where the file has a line).
std::optional<Job> loadJob(const std::string &path, const std::vector<std::string> &overrides,
                           std::string &error);

/// The commands a job runs, as argument vectors (tool names without a path).
struct JobCommands {
  std::vector<std::string> model;   ///< ptc-model ... -o DIR/model.mlir (empty: [model] file)
  std::string modelFile;            ///< the model the plan is compiled from
  std::string hfConfig;             ///< config.json beside weights saved as a folder (llama)
  std::string compileOptions;       ///< the --ptc-compile option string, without plan=
  /// Of which the program's options that are not the layout (optimizer,
  /// clipping, learning-rate schedule): what ptc-plan's probes compile with.
  std::string programOptions;
  std::vector<std::string> run;     ///< ptc-run PLAN ... (PLAN filled in by the caller)
  int ranks = 1;                    ///< the mesh's product
};
std::optional<JobCommands> jobCommands(const Job &job, std::string &error);

/// Replaces the job's layout (parallelism.mesh, microbatches, schedule,
/// virtual_stages, zero, recompute, sequence_parallel, ...) with the
/// ptc-compile options `options` of a layout ptc-plan chose ("mesh=dp:2
/// zero=1"); the rest of the job is unchanged. Returns "OLD -> NEW", or
/// nullopt with `error` for an option that is not a layout key.
std::optional<std::string> applyLayout(Job &job, const std::string &options, std::string &error);

/// The schema as text (ptc-train --help-keys).
std::string describeSchema();

} // namespace ptc::train

#endif // PTC_TOOLS_PTC_TRAIN_JOBCONFIG_H
