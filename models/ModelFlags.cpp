//===- ModelFlags.cpp - the model keys as command-line flags --------------===//

#include "models/ModelFlags.h"

#include "models/Models.h"

#include <cctype>
#include <variant>

using namespace ptc::models;
namespace cl = llvm::cl;

struct ModelFlags::Flag {
  const ModelKey *key;
  std::string name; ///< the flag without dashes, which cl::opt keeps a reference to
  std::string help;
  std::variant<std::unique_ptr<cl::opt<int64_t>>, std::unique_ptr<cl::opt<double>>,
               std::unique_ptr<cl::opt<bool>>, std::unique_ptr<cl::opt<std::string>>>
      option;

  cl::Option &base() {
    return std::visit([](auto &o) -> cl::Option & { return *o; }, option);
  }
};

namespace {
template <typename T>
std::unique_ptr<cl::opt<T>> makeOption(const std::string &name, const std::string &help,
                                       cl::OptionCategory &category) {
  return std::make_unique<cl::opt<T>>(llvm::StringRef(name), cl::desc(help), cl::cat(category));
}
} // namespace

ModelFlags::ModelFlags(cl::OptionCategory &category, const Config &config) {
  for (const ModelKey &key : modelKeys()) {
    if (config.select && !config.select(key))
      continue;
    auto flag = std::make_unique<Flag>();
    flag->key = &key;
    flag->name = key.flag().substr(2);
    flag->help = key.help;
    flag->help[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(flag->help[0])));
    if (!key.choices.empty()) {
      flag->help += " (";
      for (size_t i = 0; i < key.choices.size(); ++i)
        flag->help += (i ? ", " : "") + key.choices[i];
      flag->help += ")";
    }
    if (std::string_view(key.name) == "preset")
      flag->help += " (" + mlir::ptc::describePresets() + ")";
    switch (key.type) {
    case ModelKeyType::Int:
      flag->option = makeOption<int64_t>(flag->name, flag->help, category);
      break;
    case ModelKeyType::Float:
      flag->option = makeOption<double>(flag->name, flag->help, category);
      break;
    case ModelKeyType::Bool:
      flag->option = makeOption<bool>(flag->name, flag->help, category);
      break;
    case ModelKeyType::String:
      flag->option = makeOption<std::string>(flag->name, flag->help, category);
      break;
    }
    // A cl::opt registers itself on the top level when it is made: move the
    // flag to the subcommands of the builders that take its key.
    if (!config.subcommands.empty()) {
      cl::Option &option = flag->base();
      option.removeArgument();
      for (const auto &[builder, sub] : config.subcommands)
        if (key.takenBy(builder))
          option.addSubCommand(*sub);
      option.addArgument();
    }
    flags.push_back(std::move(flag));
  }
}

ModelFlags::~ModelFlags() {
  for (const std::unique_ptr<Flag> &flag : flags)
    flag->base().removeArgument();
}

llvm::Expected<ModelArgs> ModelFlags::given() const {
  ModelArgs args;
  for (const std::unique_ptr<Flag> &flag : flags) {
    if (!flag->base().getNumOccurrences())
      continue;
    ModelValue value = std::visit([](auto &o) -> ModelValue { return o->getValue(); }, flag->option);
    if (std::optional<std::string> problem = checkModelValue(*flag->key, value))
      return llvm::createStringError("--" + flag->name + " " + *problem);
    args.set(flag->key->name, std::move(value));
  }
  return args;
}
