// The device mesh as users write it: "dp:2,tp:4", axis names and sizes,
// comma-separated, major axis first. Parsed here, once for every tool:
// ptc-opt's `mesh=` option (the dialect then checks the names against its
// axis roles, PtcMesh.h), the compile pipeline's own reading of it, and
// ptc-train's `parallelism.mesh` (the job's rank count).
#ifndef PTC_RUNTIME_BASE_MESH_TEXT_H
#define PTC_RUNTIME_BASE_MESH_TEXT_H

#include "runtime/base/parse_number.h"
#include "runtime/base/status.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ptc {

/// At most this many devices along one axis, and in a mesh (the plan
/// loader's bounds too).
inline constexpr int64_t kMaxMeshAxisSize = 65536;
inline constexpr int64_t kMaxMeshDevices = int64_t{1} << 20;

struct MeshAxisText {
  std::string name;
  int64_t size = 1;
};

struct MeshText {
  std::vector<MeshAxisText> axes;

  /// The size of axis `name` (1 when the mesh has no such axis).
  int64_t size(std::string_view name) const {
    for (const MeshAxisText &a : axes)
      if (a.name == name)
        return a.size;
    return 1;
  }
  /// The product of the sizes.
  int64_t devices() const {
    int64_t n = 1;
    for (const MeshAxisText &a : axes)
      n *= a.size;
    return n;
  }
};

namespace mesh_text_detail {
inline std::string_view trim(std::string_view s) {
  const char *space = " \t\r\n";
  size_t b = s.find_first_not_of(space);
  if (b == std::string_view::npos)
    return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}
} // namespace mesh_text_detail

/// Parses `text` ("dp:2,tp:4"; spaces around names and sizes and empty parts
/// are allowed). An error names the part at fault: one not written
/// name:size, a size below 1 or above kMaxMeshAxisSize, or a product beyond
/// kMaxMeshDevices. Which
/// names a mesh may use is not decided here (the dialect's role table).
inline StatusOr<MeshText> parseMeshText(std::string_view text) {
  using mesh_text_detail::trim;
  MeshText mesh;
  int64_t devices = 1;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view part = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (part.empty())
      continue;
    size_t colon = part.find(':');
    std::string_view name = trim(part.substr(0, colon));
    std::optional<int64_t> size;
    if (colon != std::string_view::npos)
      size = parseInteger(std::string(trim(part.substr(colon + 1))));
    if (name.empty() || !size)
      return invalidArgument("mesh axis '", part, "' must be written name:size (e.g. dp:2)");
    if (*size < 1)
      return invalidArgument("mesh axis '", name, "' has size ", *size,
                             "; sizes must be at least 1");
    if (*size > kMaxMeshAxisSize)
      return invalidArgument("mesh axis '", name, "' has size ", *size, "; sizes must be at most ",
                             kMaxMeshAxisSize);
    if ((devices *= *size) > kMaxMeshDevices)
      return invalidArgument("the mesh has more than ", kMaxMeshDevices, " devices (at axis '",
                             name, "')");
    mesh.axes.push_back({std::string(name), *size});
  }
  return mesh;
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_MESH_TEXT_H
