// CPU kernels: embedding lookups and cross-entropy (whole and vocabulary-parallel pieces).
#include "kernels/cpu/internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

void rowMax(const float *logits, int64_t rows, int64_t classes, float *out) {
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r)
    out[r] = maxOf(logits + r * classes, classes);
}

void rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max, float *out) {
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r)
    out[r] = sumExpShifted(logits + r * classes, classes, max[r]);
}

KernelResult targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                   int64_t offset, int64_t totalClasses, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0 || targets[r] >= totalClasses)
      return badId("target", targets[r], r, totalClasses);
    int64_t c = static_cast<int64_t>(targets[r]) - offset;
    out[r] = c >= 0 && c < classes ? logits[r * classes + c] : 0.0f;
  }
  return KernelResult::ok();
}

KernelResult crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                    float *loss) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= classes)
      return badId("target", targets[r], r, classes);
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = logits + r * classes;
    const float mx = maxOf(x, classes);
    const float sum = sumExpShifted(x, classes, mx);
    total += static_cast<double>(mx + std::log(sum) - x[targets[r]]);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
  return KernelResult::ok();
}

static KernelResult crossEntropyGrad(const float *logits, const int32_t *targets, const float *g,
                        int64_t rows, int64_t classes, float *out) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= classes)
      return badId("target", targets[r], r, classes);
  const float scale = *g / static_cast<float>(rows);
#pragma omp parallel for if (rows * classes > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = logits + r * classes;
    float *o = out + r * classes;
    const float mx = maxOf(x, classes);
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
    o[targets[r]] -= scale;
  }
  return KernelResult::ok();
}

void addEmbeddingAndLossKernels(KernelTable &t) {
  // The vocabulary-parallel cross-entropy's pieces (kernel_call.h).
  t.add(OpKind::RowMax, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    rowMax(x.f32(), x.rows(), x.dim(-1), c.output(0).f32());
    return KernelResult::ok();
  });
  t.add(OpKind::RowSumExp, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    rowSumExp(x.f32(), x.rows(), x.dim(-1), c.input(1).f32(), c.output(0).f32());
    return KernelResult::ok();
  });
  t.add(OpKind::TargetLogit, [](const KernelCall &c) {
    const TensorView &x = c.input(0);
    return targetLogit(x.f32(), c.input(1).i32(), x.rows(), x.dim(-1), c.integer(0),
                       c.integer(1), c.output(0).f32());
  });
  t.add(OpKind::LossFromParts, [](const KernelCall &c) {
    const float *max = c.input(0).f32(), *sumExp = c.input(1).f32(), *target = c.input(2).f32();
    const int64_t rows = c.input(0).elements;
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      sum += std::log(static_cast<double>(sumExp[r])) + max[r] - target[r];
    *c.output(0).f32() = static_cast<float>(sum / static_cast<double>(rows));
    return KernelResult::ok();
  });
  t.add(OpKind::VocabParallelGrad, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    const float *x = logits.f32(), *max = c.input(3).f32(), *sumExp = c.input(4).f32();
    const int32_t *targets = c.input(1).i32();
    const int64_t rows = logits.rows(), classes = logits.dim(-1);
    const int64_t offset = c.integer(0), total = c.integer(1);
    float *out = c.output(0).f32();
    const float scale = *c.input(2).f32() / static_cast<float>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0 || targets[r] >= total)
        return badId("target", targets[r], r, total);
      const float inv = scale / sumExp[r];
      for (int64_t k = 0; k < classes; ++k)
        out[r * classes + k] = std::exp(x[r * classes + k] - max[r]) * inv;
      const int64_t local = static_cast<int64_t>(targets[r]) - offset;
      if (local >= 0 && local < classes)
        out[r * classes + local] -= scale;
    }
    return KernelResult::ok();
  });
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
  t.add(OpKind::CrossEntropy, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    return crossEntropy(logits.f32(), c.input(1).i32(), logits.rows(), logits.dim(-1),
                        c.output(0).f32());
  });
  t.add(OpKind::CrossEntropyGrad, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    return crossEntropyGrad(logits.f32(), c.input(1).i32(), c.input(2).f32(), logits.rows(),
                            logits.dim(-1), c.output(0).f32());
  });
}

} // namespace ptc::kernels::cpu
