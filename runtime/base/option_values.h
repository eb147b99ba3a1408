// The closed sets of values a job's options take (precision, recomputation,
// context-parallel attention, offload, the optimizer, element types), as
// enums with one table of spellings each. The compiler's options, ptc-plan's
// flags, the planner's layouts and ptc-train's job file spell them the same
// way; text is turned into an enum once, where it is read (parseOption), and
// compared as an enum everywhere after.
#ifndef PTC_RUNTIME_BASE_OPTION_VALUES_H
#define PTC_RUNTIME_BASE_OPTION_VALUES_H

#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ptc {

template <typename E> struct OptionSpelling {
  E value;
  std::string_view name;
};

/// Specialized for each enum: `spellings` (every value once, the documented
/// order) and `what` (the option's name in messages).
template <typename E> struct OptionValues;

/// The value `text` spells, or nothing.
template <typename E> std::optional<E> parseOption(std::string_view text) {
  for (const OptionSpelling<E> &s : OptionValues<E>::spellings)
    if (s.name == text)
      return s.value;
  return std::nullopt;
}

/// How `value` is spelled.
template <typename E> std::string_view optionName(E value) {
  for (const OptionSpelling<E> &s : OptionValues<E>::spellings)
    if (s.value == value)
      return s.name;
  return "?";
}

/// Every spelling, in the table's order (lists of choices: help texts, schemas).
template <typename E> std::vector<std::string> optionSpellings() {
  std::vector<std::string> out;
  for (const OptionSpelling<E> &s : OptionValues<E>::spellings)
    out.emplace_back(s.name);
  return out;
}

/// "none, selective or full": the spellings, for messages and help texts.
template <typename E> std::string optionChoices() {
  std::string out;
  const auto &all = OptionValues<E>::spellings;
  const size_t n = std::size(all);
  for (size_t i = 0; i < n; ++i)
    out += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(all[i].name);
  return out;
}

/// "recompute='x': expected none, selective or full": what a tool says of a
/// value no spelling matches.
template <typename E> std::string badOptionMessage(std::string_view text) {
  return std::string(OptionValues<E>::what) + "='" + std::string(text) + "': expected " +
         optionChoices<E>();
}

#define PTC_OPTION_VALUES(Enum, What, ...)                                                         \
  template <> struct OptionValues<Enum> {                                                          \
    static constexpr std::string_view what = What;                                                 \
    static constexpr OptionSpelling<Enum> spellings[] = {__VA_ARGS__};                             \
  };

/// The compute precision of a compiled step (`precision=`): fp32, or bf16 / f16
/// activations and weights with fp32 master weights and optimizer state.
enum class Precision { Fp32, Bf16, F16 };
PTC_OPTION_VALUES(Precision, "precision",
                  {Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}, {Precision::F16, "f16"})

/// Activation recomputation (`recompute=`).
enum class Recompute { None, Selective, Full };
PTC_OPTION_VALUES(Recompute, "recompute",
                  {Recompute::None, "none"}, {Recompute::Selective, "selective"},
                  {Recompute::Full, "full"})

/// Context parallelism's attention (`cp-attention=`): ring passes key/value
/// blocks around the cp ranks, Ulysses moves heads with all-to-alls.
enum class CpAttention { Ring, Ulysses };
PTC_OPTION_VALUES(CpAttention, "cp-attention",
                  {CpAttention::Ring, "ring"}, {CpAttention::Ulysses, "ulysses"})

/// What is offloaded from the device (`offload=`).
enum class Offload { None, Optimizer };
PTC_OPTION_VALUES(Offload, "offload", {Offload::None, "none"}, {Offload::Optimizer, "optimizer"})

/// Where offloaded state lives (`offload-target=`).
enum class OffloadTarget { Host, Nvme };
PTC_OPTION_VALUES(OffloadTarget, "offload-target",
                  {OffloadTarget::Host, "host"}, {OffloadTarget::Nvme, "nvme"})

/// The optimizer ptc-optimizer adds (`optimizer=`; none: gradients only).
enum class OptimizerKind { None, AdamW, Sgd, Adafactor, Muon };
PTC_OPTION_VALUES(OptimizerKind, "optimizer",
                  {OptimizerKind::None, "none"}, {OptimizerKind::AdamW, "adamw"},
                  {OptimizerKind::Sgd, "sgd"}, {OptimizerKind::Adafactor, "adafactor"},
                  {OptimizerKind::Muon, "muon"})

/// A floating-point element type as options name it (a model's `dtype`,
/// mixed precision's `dtype`, `grad-reduce-dtype`, `muon-ns-dtype`).
enum class FloatDtype { F32, Bf16, F16 };
PTC_OPTION_VALUES(FloatDtype, "dtype",
                  {FloatDtype::F32, "f32"}, {FloatDtype::Bf16, "bf16"}, {FloatDtype::F16, "f16"})

/// The model builders (`ptc-model gpt|llama|mlp|moe`, a job's `model.name`).
enum class BuilderKind { Gpt, Llama, Mlp, Moe };
PTC_OPTION_VALUES(BuilderKind, "model",
                  {BuilderKind::Gpt, "gpt"}, {BuilderKind::Llama, "llama"},
                  {BuilderKind::Mlp, "mlp"}, {BuilderKind::Moe, "moe"})

/// ptc-run's communicator (`--comm`): MPI, NCCL (GPU ranks), or auto (NCCL
/// where the ranks are GPUs and it is built in, else MPI).
enum class CommBackend { Auto, Mpi, Nccl };
PTC_OPTION_VALUES(CommBackend, "--comm",
                  {CommBackend::Mpi, "mpi"}, {CommBackend::Nccl, "nccl"},
                  {CommBackend::Auto, "auto"})

/// What ptc-run does at a step whose loss or gradients are not finite
/// (`--on-nonfinite`): warn and go on (the plan skips the update), or stop.
enum class NonfiniteAction { Skip, Stop };
PTC_OPTION_VALUES(NonfiniteAction, "--on-nonfinite",
                  {NonfiniteAction::Skip, "skip"}, {NonfiniteAction::Stop, "stop"})

/// How ptc-train starts the ranks (`launch.launcher`): srun inside a Slurm
/// allocation and mpirun elsewhere (auto), or the one named.
enum class Launcher { Auto, Mpirun, Srun };
PTC_OPTION_VALUES(Launcher, "launch.launcher",
                  {Launcher::Auto, "auto"}, {Launcher::Mpirun, "mpirun"}, {Launcher::Srun, "srun"})

/// A builder of token sequences (trained on token windows; the others take rows).
inline bool isLanguageModel(BuilderKind b) {
  return b == BuilderKind::Gpt || b == BuilderKind::Llama;
}

/// The element type of a precision's activations.
inline FloatDtype computeDtype(Precision p) {
  return p == Precision::Bf16  ? FloatDtype::Bf16
         : p == Precision::F16 ? FloatDtype::F16
                               : FloatDtype::F32;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_OPTION_VALUES_H
