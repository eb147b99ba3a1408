// KernelLaunch: one kernel-table call built from device pointers and shapes,
// for the code that composes an instruction from kernel pieces (the
// vocabulary-parallel loss, ring attention, the gradient norm; see
// kernels/common/kernel_call.h) and for tests that call one kernel. It keeps
// the views' shapes and attributes alive for the launch.
//
//   KernelLaunch(OpKind::RowMax).in(logits, {rows, classes}).out(max, {rows}).launch(device)
#ifndef PTC_RUNTIME_DEVICE_KERNEL_LAUNCH_H
#define PTC_RUNTIME_DEVICE_KERNEL_LAUNCH_H

#include "runtime/device/device.h"

#include <initializer_list>
#include <string>
#include <vector>

namespace ptc {

class KernelLaunch {
public:
  explicit KernelLaunch(kernels::OpKind op) : op_(op), attrs_(kernels::attrSetOf(op)) {}

  KernelLaunch &in(const void *data, Shape shape, kernels::DType dtype = kernels::DType::F32) {
    inputs_.push_back({const_cast<void *>(data), dtype, std::move(shape)});
    return *this;
  }
  KernelLaunch &out(void *data, Shape shape, kernels::DType dtype = kernels::DType::F32) {
    outputs_.push_back({data, dtype, std::move(shape)});
    return *this;
  }
  /// A named attribute of the op (kernels/common/op_attrs.def).
  template <typename Attr, typename Value> KernelLaunch &set(const Attr &attr, const Value &v) {
    attrs_.set(attr, v);
    return *this;
  }

  /// Whether `device` has an entry for the op that accepts the views' element
  /// types.
  bool acceptedBy(Device &device) const {
    std::vector<kernels::TensorView> in = views(inputs_), out = views(outputs_);
    const kernels::KernelEntry &entry = device.kernelTable()[op_];
    return entry.run &&
           entry.accepts(kernels::makeKernelCall(op_, in, out, attrs_.ints(), attrs_.floats()));
  }

  /// Runs the call with `device`'s entry for the op, which must have one and
  /// accept the views' element types.
  Status launch(Device &device) {
    std::vector<kernels::TensorView> in = views(inputs_), out = views(outputs_);
    kernels::KernelCall call = kernels::makeKernelCall(op_, in, out, attrs_.ints(), attrs_.floats());
    const kernels::KernelEntry &entry = device.kernelTable()[op_];
    if (!entry.run)
      return error(StatusCode::kUnimplemented, kernels::opKindName(op_), " has no kernel on ",
                   device.describe());
    if (!entry.accepts(call))
      return error(StatusCode::kUnimplemented, kernels::opKindName(op_), " on ",
                   device.describe(), " does not take element types ", typesText(in), " -> ",
                   typesText(out));
    return device.launch(call);
  }

private:
  struct Operand {
    void *data;
    kernels::DType dtype;
    Shape shape;
  };
  static std::string typesText(const std::vector<kernels::TensorView> &views) {
    std::string text;
    for (const kernels::TensorView &v : views)
      text += (text.empty() ? "" : ", ") + std::string(kernels::dtypeText(v.dtype));
    return text;
  }
  static std::vector<kernels::TensorView> views(const std::vector<Operand> &operands) {
    std::vector<kernels::TensorView> out;
    for (const Operand &o : operands) {
      int64_t n = 1;
      for (int64_t d : o.shape)
        n *= d;
      out.push_back({o.data, o.dtype, &o.shape, n});
    }
    return out;
  }

  kernels::OpKind op_;
  std::vector<Operand> inputs_, outputs_;
  kernels::AttrValues attrs_;
};

} // namespace ptc

#endif // PTC_RUNTIME_DEVICE_KERNEL_LAUNCH_H
