// Shapes, float storage types and bf16 conversion: the vocabulary the kernel
// libraries (kernels/cpu, kernels/cuda) and the runtime share. A leaf: it
// depends on nothing in the project.
#ifndef PTC_KERNELS_COMMON_TYPES_H
#define PTC_KERNELS_COMMON_TYPES_H

#include <cstdint>
#include <cstring>
#include <vector>

namespace ptc::kernels {

using Shape = std::vector<int64_t>;

/// Float storage types (mixed precision: bf16 / f16 storage, f32 math).
enum class FloatType { F32, BF16, F16 };

/// A tensor's element type (the plan's DType: same values).
enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2, I32 = 3 };
inline int64_t dtypeBytes(DType t) { return t == DType::BF16 || t == DType::F16 ? 2 : 4; }
inline bool isLowPrecision(DType t) { return t == DType::BF16 || t == DType::F16; }
/// "f32", "bf16", "f16", "i32" (messages).
inline const char *dtypeText(DType t) {
  return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : t == DType::I32 ? "i32" : "f32";
}
/// The float storage type of a float element type.
inline FloatType floatTypeOf(DType t) {
  return t == DType::BF16 ? FloatType::BF16 : t == DType::F16 ? FloatType::F16 : FloatType::F32;
}

/// The arithmetic of the Add/Sub/Mul/Div and ReduceSum/Mean/Max kernels.
enum class BinaryOp { Add, Sub, Mul, Div };
enum class ReduceOp { Sum, Mean, Max };

/// bf16 <-> f32 (round to nearest even; NaN stays NaN).
inline float bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
/// Without a branch (a select), so that loops over it vectorize.
inline uint16_t f32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_TYPES_H
