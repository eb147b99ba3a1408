// Named arrays from a safetensors file as training data.

#include "runtime/io/array_data.h"

#include "runtime/io/safetensors.h"

#include "kernels/common/types.h"
#include "kernels/cpu/kernels.h"

#include <cstring>
#include <set>

namespace ptc {


StatusOr<ArrayData> ArrayData::load(const std::string &path, const std::vector<Input> &inputs,
                                    int64_t batch) {
  auto file = SafetensorsFile::read(path);
  if (!file.isOk())
    return file.status();
  ArrayData data;
  std::set<std::string> wanted;
  for (const Input &in : inputs)
    wanted.insert(in.name);
  for (const auto &[name, entry] : file->entries())
    if (!wanted.count(name))
      return invalidArgument("data file '", path, "': tensor '", name,
                             "' is not an input of the plan");
  data.examples_ = -1;
  std::string firstName;
  for (const Input &in : inputs) {
    auto it = file->entries().find(in.name);
    if (it == file->entries().end())
      return invalidArgument("data file '", path, "' has no tensor '", in.name,
                             "' for the plan input of that name (examples of shape ",
                             shapeString(in.exampleShape), ")");
    const SafetensorsFile::Entry &e = it->second;
    std::vector<int64_t> expected{e.shape.empty() ? -1 : e.shape[0]};
    expected.insert(expected.end(), in.exampleShape.begin(), in.exampleShape.end());
    if (e.shape.empty() || e.shape != expected)
      return invalidArgument("data file '", path, "': tensor '", in.name, "' has shape ",
                             shapeString(e.shape), "; the plan input needs [examples, ",
                             shapeString(in.exampleShape).substr(1));
    int64_t n = e.shape[0];
    if (data.examples_ >= 0 && n != data.examples_)
      return invalidArgument("data file '", path, "': tensor '", in.name, "' has ", n,
                             " examples, '", firstName, "' has ", data.examples_);
    if (data.examples_ < 0)
      firstName = in.name;
    data.examples_ = n;
    if (n < batch)
      return invalidArgument("data file '", path, "': tensor '", in.name, "' has ", n,
                             " examples, fewer than one global batch of ", batch);
    const int64_t count = elementCount(e.shape);
    const uint8_t *src = file->bytes(in.name);
    std::vector<uint8_t> rows;
    if (in.ids) {
      int width = e.dtype == "I32" ? 4 : e.dtype == "I64" ? 8 : e.dtype == "U16" ? 2
                  : e.dtype == "U8"  ? 1 : 0;
      if (width == 0)
        return invalidArgument("data file '", path, "': tensor '", in.name, "' is ", e.dtype,
                               "; the plan input holds ids (I32, I64, U16 or U8)");
      if (e.end - e.begin != width * count)
        return invalidArgument("data file '", path, "': tensor '", in.name, "' holds ",
                               e.end - e.begin, " bytes, needs ", width * count);
      rows.resize(static_cast<size_t>(4 * count));
      auto *dst = reinterpret_cast<int32_t *>(rows.data());
      for (int64_t k = 0; k < count; ++k) {
        int64_t v = 0;
        const uint8_t *p = src + k * width;
        if (width == 8) {
          std::memcpy(&v, p, 8);
        } else if (width == 4) {
          int32_t x;
          std::memcpy(&x, p, 4);
          v = x;
        } else if (width == 2) {
          uint16_t x;
          std::memcpy(&x, p, 2);
          v = x;
        } else {
          v = *p;
        }
        if (v < 0 || (in.idBound >= 0 && v >= in.idBound))
          return invalidArgument("data file '", path, "': tensor '", in.name, "' holds id ", v,
                                 " at element ", k, ", outside [0, ", in.idBound, ")");
        dst[k] = static_cast<int32_t>(v);
      }
      data.rowBytes_.push_back(4 * elementCount(in.exampleShape));
    } else {
      kernels::FloatType from;
      int64_t width;
      if (!floatDtype(e.dtype, from, width))
        return invalidArgument("data file '", path, "': tensor '", in.name, "' is ", e.dtype,
                               "; the plan input holds floats (F32, BF16 or F16)");
      if (e.end - e.begin != width * count)
        return invalidArgument("data file '", path, "': tensor '", in.name, "' holds ",
                               e.end - e.begin, " bytes, needs ", width * count);
      kernels::FloatType to = in.floatBytes == 4 ? kernels::FloatType::F32
                              : in.bf16          ? kernels::FloatType::BF16
                                                 : kernels::FloatType::F16;
      rows.resize(static_cast<size_t>(in.floatBytes * count));
      kernels::cpu::convertFloat(src, from, rows.data(), to, count);
      data.rowBytes_.push_back(in.floatBytes * elementCount(in.exampleShape));
    }
    data.rows_.push_back(std::move(rows));
  }
  return data;
}

void ArrayData::fillBatch(size_t i, int64_t step, int64_t batch, void *out) const {
  const int64_t bytes = rowBytes_[i];
  auto *dst = static_cast<uint8_t *>(out);
  for (int64_t j = 0; j < batch; ++j) {
    int64_t row = (step * batch + j) % examples_;
    std::memcpy(dst + j * bytes, rows_[i].data() + row * bytes, static_cast<size_t>(bytes));
  }
}

} // namespace ptc
