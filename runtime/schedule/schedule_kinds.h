// Segments and schedule action kinds as C++ enums, from schedule_kinds.def
// (the plan schema's enums come from the same rows). A leaf: the dialect
// (ops' `ptc.segment`), the schedule and the plan loader share it.
#ifndef PTC_RUNTIME_SCHEDULE_SCHEDULE_KINDS_H
#define PTC_RUNTIME_SCHEDULE_SCHEDULE_KINDS_H

#include <cstdint>
#include <optional>
#include <string_view>

namespace ptc::schedule {

/// What a chunk computes for one micro-batch: its forward ops, its backward
/// ops (with a weight-gradient split: only those the input gradient needs),
/// the rest of its backward ops (weight gradients); or, once per step after
/// the micro-batches, Step (optimizer, gradient sums).
enum class Segment : int8_t {
#define PTC_SEGMENT(name, text) name,
#include "runtime/schedule/schedule_kinds.def"
};

enum class ActionKind : int8_t {
#define PTC_ACTION_KIND(name) name,
#include "runtime/schedule/schedule_kinds.def"
};

/// "forward", "backward", "weight", "step": the `ptc.segment` text.
inline const char *segmentText(Segment s) {
  switch (s) {
#define PTC_SEGMENT(name, text)                                                                    \
  case Segment::name:                                                                              \
    return text;
#include "runtime/schedule/schedule_kinds.def"
  }
  return "?";
}

/// The segment of a `ptc.segment` text.
inline std::optional<Segment> lookupSegment(std::string_view text) {
#define PTC_SEGMENT(name, spelling)                                                                \
  if (text == spelling)                                                                            \
    return Segment::name;
#include "runtime/schedule/schedule_kinds.def"
  return std::nullopt;
}

} // namespace ptc::schedule

#endif // PTC_RUNTIME_SCHEDULE_SCHEDULE_KINDS_H
