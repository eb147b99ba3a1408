// The named attributes of instructions (op_attrs.def): each op kind's set
// (its op_table.def row), typed constants naming a slot of the integers or
// floats (`attr::Rotary::seq_major`), how many of each an instruction of a
// set may carry, reading a slot (an absent optional one reads as its
// fallback) and writing them by name (the dialect's lowering). A leaf: no
// runtime types, no MLIR.
#ifndef PTC_KERNELS_COMMON_OP_ATTRS_H
#define PTC_KERNELS_COMMON_OP_ATTRS_H

#include "kernels/common/op_kind.h"

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <vector>

namespace ptc::kernels {

/// op_attrs.def's sets.
enum class AttrSet : uint8_t {
#define PTC_ATTR_SET(set) set,
#define PTC_ATTR(...)
#include "kernels/common/op_attrs.def"
#undef PTC_ATTR
#undef PTC_ATTR_SET
};

/// Int / Float: one value at the slot; Ints / Floats: the values from the
/// slot on (a list).
enum class AttrKind : uint8_t { Int, Float, Ints, Floats };
enum class AttrPresence : uint8_t { Required, Optional };

/// One row of op_attrs.def.
struct AttrInfo {
  AttrSet set;
  AttrKind kind;
  size_t index;
  AttrPresence presence;
  double fallback;
  const char *name;
};

inline constexpr AttrInfo kAttrTable[] = {
#define PTC_ATTR_SET(set)
#define PTC_ATTR(set, kind, name, index, presence, fallback)                                       \
  {AttrSet::set, AttrKind::kind, index, AttrPresence::presence, fallback, #name},
#include "kernels/common/op_attrs.def"
#undef PTC_ATTR
#undef PTC_ATTR_SET
};

/// A named slot, typed by its kind (what reading it returns): a row of
/// op_attrs.def whose kind the type carries.
template <AttrKind K> struct Attr {
  AttrSet set;
  size_t index;
  AttrPresence presence;
  double fallback; // an absent optional scalar's value (an absent list is empty)
  const char *name;
};
using IntAttr = Attr<AttrKind::Int>;
using FloatAttr = Attr<AttrKind::Float>;
using IntsAttr = Attr<AttrKind::Ints>;
using FloatsAttr = Attr<AttrKind::Floats>;
/// The typed slot of a table row of kind K.
template <AttrKind K> constexpr Attr<K> slotOf(const AttrInfo &a) {
  return {a.set, a.index, a.presence, a.fallback, a.name};
}

/// The constants: `attr::<Set>::<name>`.
namespace attr {
#define PTC_ATTR_SET(set)
#define PTC_ATTR(set, kind, name, index, presence, fallback)                                       \
  namespace set {                                                                                  \
  inline constexpr kind##Attr name{AttrSet::set, index, AttrPresence::presence, fallback, #name};  \
  }
#include "kernels/common/op_attrs.def"
#undef PTC_ATTR
#undef PTC_ATTR_SET
} // namespace attr

/// The attribute set of each op kind: op_table.def's rows, then the pieces.
inline constexpr AttrSet kOpAttrSets[] = {
#define PTC_PLAN_OP(op, inputs, outputs, set, rule) AttrSet::set,
#include "kernels/common/op_table.def"
#undef PTC_PLAN_OP
#define PTC_KERNEL_PIECE(piece, set) AttrSet::set,
    PTC_KERNEL_PIECES(PTC_KERNEL_PIECE)
#undef PTC_KERNEL_PIECE
};
static_assert(sizeof(kOpAttrSets) / sizeof(kOpAttrSets[0]) == kNumOpKinds,
              "one attribute set per op kind");
constexpr AttrSet attrSetOf(OpKind op) {
  return static_cast<size_t>(op) < kNumOpKinds ? kOpAttrSets[static_cast<size_t>(op)]
                                               : AttrSet::None;
}

/// How many integers and floats an instruction of a set carries: at least
/// the required slots, at most every slot (unbounded after a list).
inline constexpr size_t kUnboundedAttrs = std::numeric_limits<size_t>::max();
struct AttrCounts {
  size_t minInts = 0, maxInts = 0, minFloats = 0, maxFloats = 0;
};
constexpr AttrCounts attrCounts(AttrSet set) {
  AttrCounts c;
  for (const AttrInfo &a : kAttrTable) {
    if (a.set != set)
      continue;
    const bool isInt = a.kind == AttrKind::Int || a.kind == AttrKind::Ints;
    size_t &lo = isInt ? c.minInts : c.minFloats;
    size_t &hi = isInt ? c.maxInts : c.maxFloats;
    if (a.kind == AttrKind::Ints || a.kind == AttrKind::Floats) {
      lo = lo > a.index ? lo : a.index;
      hi = kUnboundedAttrs;
      continue;
    }
    if (a.presence == AttrPresence::Required)
      lo = lo > a.index + 1 ? lo : a.index + 1;
    if (hi != kUnboundedAttrs)
      hi = hi > a.index + 1 ? hi : a.index + 1;
  }
  return c;
}

/// The row of `set` at slot `index` of the integers (`ints`) or floats, or
/// null.
constexpr const AttrInfo *attrAt(AttrSet set, bool ints, size_t index) {
  for (const AttrInfo &a : kAttrTable) {
    const bool isInt = a.kind == AttrKind::Int || a.kind == AttrKind::Ints;
    const bool isList = a.kind == AttrKind::Ints || a.kind == AttrKind::Floats;
    if (a.set == set && isInt == ints && (a.index == index || (isList && a.index <= index)))
      return &a;
  }
  return nullptr;
}

/// A slot's value in an instruction's integers or floats.
inline int64_t attrValue(const IntAttr &a, const int64_t *ints, size_t count) {
  return a.index < count ? ints[a.index] : static_cast<int64_t>(a.fallback);
}
inline double attrValue(const FloatAttr &a, const double *floats, size_t count) {
  return a.index < count ? floats[a.index] : a.fallback;
}
inline std::vector<int64_t> attrValue(const IntsAttr &a, const int64_t *ints, size_t count) {
  return a.index < count ? std::vector<int64_t>(ints + a.index, ints + count)
                         : std::vector<int64_t>{};
}
inline std::vector<double> attrValue(const FloatsAttr &a, const double *floats, size_t count) {
  return a.index < count ? std::vector<double>(floats + a.index, floats + count)
                         : std::vector<double>{};
}

/// An instruction's integers and floats, read by name (any slot kind).
struct AttrReader {
  const int64_t *ints = nullptr;
  size_t numInts = 0;
  const double *floats = nullptr;
  size_t numFloats = 0;
  int64_t operator()(const IntAttr &a) const { return attrValue(a, ints, numInts); }
  double operator()(const FloatAttr &a) const { return attrValue(a, floats, numFloats); }
  std::vector<int64_t> operator()(const IntsAttr &a) const { return attrValue(a, ints, numInts); }
  std::vector<double> operator()(const FloatsAttr &a) const {
    return attrValue(a, floats, numFloats);
  }
};

/// An instruction's attributes written by name: each value lands at its
/// slot, slots passed over read their fallbacks, and `compact` leaves out
/// trailing optional values equal to their fallbacks (what a plan written
/// before they existed holds).
class AttrValues {
public:
  explicit AttrValues(AttrSet set = AttrSet::None) : set_(set) {}

  AttrValues &set(const IntAttr &a, int64_t value) {
    at(ints_, a.set, a.index, true) = value;
    return *this;
  }
  AttrValues &set(const FloatAttr &a, double value) {
    at(floats_, a.set, a.index, false) = value;
    return *this;
  }
  template <typename Range> AttrValues &set(const IntsAttr &a, const Range &values) {
    pad(ints_, a.set, a.index, true);
    ints_.insert(ints_.end(), std::begin(values), std::end(values));
    return *this;
  }
  template <typename Range> AttrValues &set(const FloatsAttr &a, const Range &values) {
    pad(floats_, a.set, a.index, false);
    floats_.insert(floats_.end(), std::begin(values), std::end(values));
    return *this;
  }
  /// Leaves out trailing optional values at their fallbacks.
  AttrValues &compact() {
    trim(ints_, true);
    trim(floats_, false);
    return *this;
  }

  AttrSet attrSet() const { return set_; }
  const std::vector<int64_t> &ints() const { return ints_; }
  const std::vector<double> &floats() const { return floats_; }

private:
  template <typename T> void pad(std::vector<T> &v, AttrSet owner, size_t index, bool ints) {
    assert(owner == set_ && "an attribute of another op's set");
    (void)owner;
    while (v.size() < index) {
      const AttrInfo *info = attrAt(set_, ints, v.size());
      v.push_back(static_cast<T>(info ? info->fallback : 0));
    }
  }
  template <typename T> T &at(std::vector<T> &v, AttrSet owner, size_t index, bool ints) {
    pad(v, owner, index, ints);
    if (v.size() == index)
      v.push_back(T{});
    return v[index];
  }
  template <typename T> void trim(std::vector<T> &v, bool ints) {
    while (!v.empty()) {
      const AttrInfo *info = attrAt(set_, ints, v.size() - 1);
      const bool scalar = info && (info->kind == AttrKind::Int || info->kind == AttrKind::Float);
      if (!scalar || info->presence != AttrPresence::Optional ||
          v.back() != static_cast<T>(info->fallback))
        return;
      v.pop_back();
    }
  }

  AttrSet set_;
  std::vector<int64_t> ints_;
  std::vector<double> floats_;
};

} // namespace ptc::kernels

#endif // PTC_KERNELS_COMMON_OP_ATTRS_H
