//===- ModelFlags.h - the model keys as command-line flags ------*- C++ -*-===//
//
// A tool's flags for the model keys (ModelKeys.h), made from the table:
// ptc-model registers every key on its builders' subcommands, ptc-plan the
// keys its builder path takes. The values given come back as ModelArgs,
// checked against their keys' bounds.
//
//===----------------------------------------------------------------------===//

#ifndef PTC_MODELS_MODELFLAGS_H
#define PTC_MODELS_MODELFLAGS_H

#include "models/ModelKeys.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace ptc::models {

class ModelFlags {
public:
  struct Config {
    /// The keys that become flags (default: all).
    std::function<bool(const ModelKey &)> select;
    /// Each builder's subcommand: a key's flag is on the subcommands of the
    /// builders that take it (empty: every flag on the top level).
    std::vector<std::pair<BuilderKind, llvm::cl::SubCommand *>> subcommands;
  };

  /// Registers the flags in `category`; they live as long as this object.
  ModelFlags(llvm::cl::OptionCategory &category, const Config &config);
  ~ModelFlags();
  ModelFlags(const ModelFlags &) = delete;
  ModelFlags &operator=(const ModelFlags &) = delete;

  /// The flags given on the command line, each checked against its key's
  /// bounds; the error names the flag ("--layers must be at least 1, got 0").
  llvm::Expected<ModelArgs> given() const;

private:
  struct Flag;
  std::vector<std::unique_ptr<Flag>> flags;
};

} // namespace ptc::models

#endif // PTC_MODELS_MODELFLAGS_H
