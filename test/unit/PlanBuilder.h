// Builds small plans in memory for runtime unit tests.
#ifndef PTC_TEST_UNIT_PLANBUILDER_H
#define PTC_TEST_UNIT_PLANBUILDER_H

#include "runtime/plan/plan_format.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptc::test {
namespace fb = flatbuffers;

struct TensorDesc {
  std::string name;
  plan::TensorKind kind;
  std::vector<int64_t> shape;
  int64_t offset = -1;
  plan::DType dtype = plan::DType::F32;
};
struct InstDesc {
  plan::OpCode op;
  std::vector<int32_t> in, out;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::string function; // Unary, UnaryGrad
};

/// A plan of tensors (f32 unless they say) and instructions; output "loss" is tensor 2. `mesh`:
/// (axis name, size) pairs.
inline std::vector<uint8_t>
buildPlan(const std::vector<TensorDesc> &tensors, const std::vector<InstDesc> &insts,
          int64_t arena, uint32_t version = plan::kFormatVersion,
          const std::vector<std::pair<std::string, int>> &mesh = {}) {
  fb::FlatBufferBuilder b;
  std::vector<fb::Offset<plan::MeshAxis>> axes;
  int ranks = 1;
  for (const auto &[name, size] : mesh) {
    axes.push_back(plan::CreateMeshAxis(b, b.CreateString(name), size));
    ranks *= size;
  }
  std::vector<fb::Offset<plan::Tensor>> ts;
  for (const TensorDesc &t : tensors)
    ts.push_back(plan::CreateTensor(b, b.CreateString(t.name), 0, 0, t.kind, t.dtype,
                                    b.CreateVector(t.shape), t.offset, plan::InitKind::Zeros));
  std::vector<fb::Offset<plan::Instruction>> is;
  for (const InstDesc &i : insts)
    is.push_back(plan::CreateInstruction(b, i.op, b.CreateVector(i.in), b.CreateVector(i.out),
                                         b.CreateVector(i.ints), b.CreateVector(i.floats),
                                         i.function.empty() ? 0 : b.CreateString(i.function)));
  std::vector<fb::Offset<plan::Output>> outs{plan::CreateOutput(b, b.CreateString("loss"), 2)};
  auto p = plan::CreatePlan(b, version, b.CreateString("test"), ranks,
                            mesh.empty() ? 0 : b.CreateVector(axes), b.CreateVector(ts),
                            b.CreateVector(is), b.CreateVector(outs), arena, arena);
  plan::FinishPlanBuffer(b, p);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

} // namespace ptc::test

#endif // PTC_TEST_UNIT_PLANBUILDER_H
