// The elementwise functions (activations) both kernel libraries implement,
// forward and gradient. The plan names them (`Unary` / `UnaryGrad`
// instructions), the loader checks the name against this list, and each
// kernel library has one case per entry. Adding an activation: one line here,
// its forward and gradient math in kernels/cpu/elementwise.cc and
// kernels/cuda/elementwise.cu, and its ops in the dialect (docs/adding-an-op.md).
#ifndef PTC_KERNELS_COMMON_ELEMENTWISE_H
#define PTC_KERNELS_COMMON_ELEMENTWISE_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// X(enumerator, name in plans and in the dialect's op mnemonic)
#define PTC_UNARY_FUNCTIONS(X)                                                                     \
  X(Gelu, "gelu")                                                                                  \
  X(GeluTanh, "gelu_tanh")                                                                         \
  X(Tanh, "tanh")                                                                                  \
  X(Relu, "relu")                                                                                  \
  X(Silu, "silu")                                                                                  \
  X(Rsqrt, "rsqrt")                                                                                \
  X(Exp, "exp")                                                                                    \
  X(Log, "log")                                                                                    \
  X(Sign, "sign")

namespace ptc::kernels {

enum class UnaryFunction : uint8_t {
#define PTC_UNARY_ENUMERATOR(e, name) e,
  PTC_UNARY_FUNCTIONS(PTC_UNARY_ENUMERATOR)
#undef PTC_UNARY_ENUMERATOR
};

inline const char *unaryFunctionName(UnaryFunction f) {
  switch (f) {
#define PTC_UNARY_NAME(e, name)                                                                    \
  case UnaryFunction::e:                                                                           \
    return name;
    PTC_UNARY_FUNCTIONS(PTC_UNARY_NAME)
#undef PTC_UNARY_NAME
  }
  return "?";
}

/// The function called `name` in plans, if the kernels implement it.
inline std::optional<UnaryFunction> lookupUnaryFunction(std::string_view name) {
#define PTC_UNARY_LOOKUP(e, n)                                                                     \
  if (name == n)                                                                                   \
    return UnaryFunction::e;
  PTC_UNARY_FUNCTIONS(PTC_UNARY_LOOKUP)
#undef PTC_UNARY_LOOKUP
  return std::nullopt;
}

/// "gelu, relu, silu", for messages.
inline std::string_view unaryFunctionList() {
  static const std::string list = [] {
    std::string s;
#define PTC_UNARY_JOIN(e, name) s += std::string(s.empty() ? "" : ", ") + name;
    PTC_UNARY_FUNCTIONS(PTC_UNARY_JOIN)
#undef PTC_UNARY_JOIN
    return s;
  }();
  return list;
}

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_ELEMENTWISE_H
