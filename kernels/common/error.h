// What a kernel reports when its input is wrong (ids out of range), without
// the runtime's Status: kernels depend on nothing above them. The device layer
// turns a failed KernelResult into a Status.
#ifndef PTC_KERNELS_COMMON_ERROR_H
#define PTC_KERNELS_COMMON_ERROR_H

#include <sstream>
#include <string>
#include <utility>

namespace ptc::kernels {

class [[nodiscard]] KernelResult {
public:
  static KernelResult ok() { return KernelResult(); }
  template <typename... Parts> static KernelResult error(const Parts &...parts) {
    std::ostringstream os;
    (os << ... << parts);
    KernelResult r;
    r.message_ = os.str();
    r.failed_ = true;
    return r;
  }
  bool isOk() const { return !failed_; }
  const std::string &message() const { return message_; }

private:
  bool failed_ = false;
  std::string message_;
};

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_ERROR_H
