// CPU kernels: embedding lookups and cross-entropy (whole and vocabulary-parallel pieces).
#include "kernels/cpu/internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace ptc::kernels::cpu {
using namespace internal;


static KernelResult embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids,
                 int64_t count, float *out, int64_t rowOffset, int64_t totalRows) {
  if (totalRows < 0)
    totalRows = rows;
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= totalRows)
      return badId("embedding index", ids[i], i, totalRows);
#pragma omp parallel for if (count * dim > 32768)
  for (int64_t i = 0; i < count; ++i) {
    int64_t r = static_cast<int64_t>(ids[i]) - rowOffset;
    if (r >= 0 && r < rows)
      std::memcpy(out + i * dim, table + r * dim, sizeof(float) * static_cast<size_t>(dim));
    else
      std::fill(out + i * dim, out + (i + 1) * dim, 0.0f);
  }
  return KernelResult::ok();
}

static KernelResult embeddingGrad(const int32_t *ids, int64_t count, const float *g, float *dtable,
                     int64_t rows, int64_t dim, int64_t rowOffset, int64_t totalRows) {
  if (totalRows < 0)
    totalRows = rows;
  std::fill(dtable, dtable + rows * dim, 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= totalRows)
      return badId("embedding index", ids[i], i, totalRows);
    int64_t r = static_cast<int64_t>(ids[i]) - rowOffset;
    if (r < 0 || r >= rows)
      continue;
    float *row = dtable + r * dim;
    const float *gi = g + i * dim;
#pragma omp simd
    for (int64_t c = 0; c < dim; ++c)
      row[c] += gi[c];
  }
  return KernelResult::ok();
}

namespace {
/// Row `r` of `logits` as f32: the row itself, or (bf16 storage, `T` =
/// uint16_t) widened into `buffer` (exact).
template <typename T>
const float *f32Row(const T *logits, int64_t r, int64_t classes, std::vector<float> &buffer) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buffer;
    return logits + r * classes;
  } else {
    buffer.resize(static_cast<size_t>(classes));
    const T *row = logits + r * classes;
#pragma omp simd
    for (int64_t c = 0; c < classes; ++c)
      buffer[static_cast<size_t>(c)] = bf16ToF32(row[c]);
    return buffer.data();
  }
}

/// Row r's loss from its f32 values x and maximum mx.
inline double rowLoss(const float *x, int64_t classes, float mx, int32_t target) {
  const float sum = sumExpShifted(x, classes, mx);
  return static_cast<double>(mx + std::log(sum) - x[target]);
}

/// Row r's gradient into `out` (its storage T: f32, or bf16 computed in f32
/// in `computed` and rounded once, as converting an f32 gradient would).
template <typename T>
void rowGradient(const float *x, int64_t classes, float mx, int32_t target, float scale, T *out,
                 std::vector<float> &computed) {
  float *o;
  if constexpr (std::is_same_v<T, float>) {
    o = out;
  } else {
    computed.resize(static_cast<size_t>(classes));
    o = computed.data();
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < classes; ++c) {
    o[c] = expNonPositive(x[c] - mx);
    sum += o[c];
  }
  const float inv = scale / sum;
#pragma omp simd
  for (int64_t c = 0; c < classes; ++c)
    o[c] *= inv;
  o[target] -= scale;
  if constexpr (!std::is_same_v<T, float>) {
#pragma omp simd
    for (int64_t c = 0; c < classes; ++c)
      out[c] = f32ToBf16(o[c]);
  }
}

KernelResult checkTargets(const int32_t *targets, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= classes)
      return badId("target", targets[r], r, classes);
  return KernelResult::ok();
}

/// The mean loss over f32 or bf16 logits (the loss f32 either way).
template <typename T>
KernelResult crossEntropyOf(const T *logits, const int32_t *targets, int64_t rows, int64_t classes,
                            float *loss) {
  if (KernelResult r = checkTargets(targets, rows, classes); !r.isOk())
    return r;
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    static thread_local std::vector<float> widened;
    const float *x = f32Row(logits, r, classes, widened);
    total += rowLoss(x, classes, maxOf(x, classes), targets[r]);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
  return KernelResult::ok();
}

/// The logits' gradient in their storage; with `loss`, the mean loss too
/// (ptc.cross_entropy_with_grad): each row read once for the maximum both
/// take, while it is in cache for both (the same numbers as the two kernels:
/// the same row sums, the losses added in the same per-thread order).
template <typename T>
KernelResult crossEntropyGradOf(const T *logits, const int32_t *targets, const float *g,
                                int64_t rows, int64_t classes, T *out, float *loss = nullptr) {
  if (KernelResult r = checkTargets(targets, rows, classes); !r.isOk())
    return r;
  const float scale = *g / static_cast<float>(rows);
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    static thread_local std::vector<float> widened, computed;
    const float *x = f32Row(logits, r, classes, widened);
    const float mx = maxOf(x, classes);
    if (loss)
      total += rowLoss(x, classes, mx, targets[r]);
    rowGradient(x, classes, mx, targets[r], scale, out + r * classes, computed);
  }
  if (loss)
    *loss = static_cast<float>(total / static_cast<double>(rows));
  return KernelResult::ok();
}

// The vocabulary-parallel cross-entropy's pieces over this device's block of
// classes [offset, offset + classes) of `totalClasses`, on f32 or bf16
// logits (each row widened once, exact: the f32 pieces' numbers).
template <typename T> void rowMax(const T *logits, int64_t rows, int64_t classes, float *out) {
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    static thread_local std::vector<float> widened;
    out[r] = maxOf(f32Row(logits, r, classes, widened), classes);
  }
}

template <typename T>
void rowSumExp(const T *logits, int64_t rows, int64_t classes, const float *max, float *out) {
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    static thread_local std::vector<float> widened;
    out[r] = sumExpShifted(f32Row(logits, r, classes, widened), classes, max[r]);
  }
}

/// Each row's target logit, 0 where another device holds it.
template <typename T>
KernelResult targetLogit(const T *logits, const int32_t *targets, int64_t rows, int64_t classes,
                         int64_t offset, int64_t totalClasses, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0 || targets[r] >= totalClasses)
      return badId("target", targets[r], r, totalClasses);
    int64_t c = static_cast<int64_t>(targets[r]) - offset;
    float x = 0.0f;
    if (c >= 0 && c < classes) {
      if constexpr (std::is_same_v<T, float>)
        x = logits[r * classes + c];
      else
        x = bf16ToF32(logits[r * classes + c]);
    }
    out[r] = x;
  }
  return KernelResult::ok();
}

/// `g * (softmax - onehot) / rows` of the block, the softmax from the group's
/// row maxima and sums; bf16 computed in f32 and rounded once.
template <typename T>
KernelResult vocabParallelGrad(const T *logits, const int32_t *targets, float g, const float *max,
                               const float *sumExp, int64_t rows, int64_t classes, int64_t offset,
                               int64_t totalClasses, T *out) {
  if (KernelResult r = checkTargets(targets, rows, totalClasses); !r.isOk())
    return r;
  const float scale = g / static_cast<float>(rows);
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    static thread_local std::vector<float> widened, computed;
    const float *x = f32Row(logits, r, classes, widened);
    float *o;
    if constexpr (std::is_same_v<T, float>) {
      o = out + r * classes;
    } else {
      computed.resize(static_cast<size_t>(classes));
      o = computed.data();
    }
    const float inv = scale / sumExp[r];
    for (int64_t k = 0; k < classes; ++k)
      o[k] = std::exp(x[k] - max[r]) * inv;
    const int64_t local = static_cast<int64_t>(targets[r]) - offset;
    if (local >= 0 && local < classes)
      o[local] -= scale;
    if constexpr (!std::is_same_v<T, float>) {
#pragma omp simd
      for (int64_t k = 0; k < classes; ++k)
        out[r * classes + k] = f32ToBf16(o[k]);
    }
  }
  return KernelResult::ok();
}

/// The pieces' types: f32 or bf16 logits (input 0), and VocabParallelGrad's
/// gradient (output 0) in their type; the rest f32 (and i32 targets).
bool vocabPieceTypes(const KernelCall &c) {
  const DType logits = c.input(0).dtype;
  return (logits == DType::F32 || logits == DType::BF16) && vocabPieceOperandTypes(c);
}

/// The loss's types computed natively: f32 or bf16 logits, i32 targets, an
/// f32 scalar (the loss, or its gradient), the gradient in the logits' type.
/// (A bf16 loss over bf16 logits is widened by the executor.)
/// The gradient's optional second output, the loss, f32 likewise.
bool crossEntropyTypes(const KernelCall &c) {
  const DType logits = c.input(0).dtype;
  const bool grad = c.numInputs == 3;
  const DType scalar = grad ? c.input(2).dtype : c.output(0).dtype;
  return (logits == DType::F32 || logits == DType::BF16) && c.input(1).dtype == DType::I32 &&
         scalar == DType::F32 && (!grad || c.output(0).dtype == logits) &&
         (c.numOutputs < 2 || c.output(1).dtype == DType::F32);
}
} // namespace

KernelResult crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                          float *loss) {
  return crossEntropyOf(logits, targets, rows, classes, loss);
}

void addEmbeddingAndLossKernels(KernelTable &t) {
  // The vocabulary-parallel cross-entropy's pieces (kernel_call.h).
  // The logits (input 0) read as stored (vocabPieceTypes).
  t.add(
      OpKind::RowMax,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        return onStorage(x.dtype, [&](auto t) {
          rowMax(as<const decltype(t)>(x), x.rows(), x.dim(-1), c.output(0).f32());
        });
      },
      vocabPieceTypes);
  t.add(
      OpKind::RowSumExp,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        return onStorage(x.dtype, [&](auto t) {
          rowSumExp(as<const decltype(t)>(x), x.rows(), x.dim(-1), c.input(1).f32(),
                    c.output(0).f32());
        });
      },
      vocabPieceTypes);
  t.add(
      OpKind::TargetLogit,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        KernelResult r = KernelResult::ok();
        (void)onStorage(x.dtype, [&](auto t) {
          r = targetLogit(as<const decltype(t)>(x), c.input(1).i32(), x.rows(), x.dim(-1),
                          c.attr(attr::ClassBlock::first_class), c.attr(attr::ClassBlock::classes),
                          c.output(0).f32());
        });
        return r;
      },
      vocabPieceTypes);
  t.add(OpKind::LossFromParts, [](const KernelCall &c) {
    const float *max = c.input(0).f32(), *sumExp = c.input(1).f32(), *target = c.input(2).f32();
    const int64_t rows = c.input(0).elements;
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      sum += std::log(static_cast<double>(sumExp[r])) + max[r] - target[r];
    *c.output(0).f32() = static_cast<float>(sum / static_cast<double>(rows));
    return KernelResult::ok();
  });
  t.add(
      OpKind::VocabParallelGrad,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        KernelResult r = KernelResult::ok();
        (void)onStorage(x.dtype, [&](auto t) { // the gradient has the logits' storage
          using T = decltype(t);
          r = vocabParallelGrad(as<const T>(x), c.input(1).i32(), *c.input(2).f32(),
                                c.input(3).f32(), c.input(4).f32(), x.rows(), x.dim(-1),
                                c.attr(attr::ClassBlock::first_class),
                                c.attr(attr::ClassBlock::classes), as<T>(c.output(0)));
        });
        return r;
      },
      vocabPieceTypes);
  // A vocabulary-parallel table (ints: its mesh axis) is this rank's block of rows.
  t.add(OpKind::Embedding, [](const KernelCall &c) {
    const TensorView &table = c.input(0), &ids = c.input(1);
    VocabularyBlock block = vocabularyBlock(c, table.dim(0));
    return embedding(table.f32(), table.dim(0), table.dim(1), ids.i32(), ids.elements,
                     c.output(0).f32(), block.offset, block.total);
  });
  t.add(OpKind::EmbeddingGrad, [](const KernelCall &c) {
    const TensorView &ids = c.input(0), &dtable = c.output(0);
    VocabularyBlock block = vocabularyBlock(c, dtable.dim(0));
    return embeddingGrad(ids.i32(), ids.elements, c.input(1).f32(), dtable.f32(), dtable.dim(0),
                         dtable.dim(1), block.offset, block.total);
  });
  // f32 or bf16 logits, read as stored (crossEntropyTypes).
  t.add(
      OpKind::CrossEntropy,
      [](const KernelCall &c) {
        const TensorView &logits = c.input(0);
        return logits.dtype == DType::BF16
                   ? crossEntropyOf(bf16In(logits), c.input(1).i32(), logits.rows(),
                                    logits.dim(-1), c.output(0).f32())
                   : crossEntropyOf(logits.f32(), c.input(1).i32(), logits.rows(),
                                    logits.dim(-1), c.output(0).f32());
      },
      crossEntropyTypes);
  // The gradient, and with a second output the loss too (one pass).
  t.add(
      OpKind::CrossEntropyGrad,
      [](const KernelCall &c) {
        const TensorView &logits = c.input(0);
        KernelResult r = KernelResult::ok();
        (void)onStorage(c, [&](auto t) { // the gradient has the logits' storage
          using T = decltype(t);
          r = crossEntropyGradOf(as<T>(logits), c.input(1).i32(), c.input(2).f32(),
                                 logits.rows(), logits.dim(-1), as<T>(c.output(0)),
                                 c.numOutputs > 1 ? c.output(1).f32() : nullptr);
        });
        return r;
      },
      crossEntropyTypes);
}

} // namespace ptc::kernels::cpu
