// CUDA kernels: embeddings and cross-entropy (whole and vocabulary-parallel) (see kernels.h).

#include "kernels/cuda/internal.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <climits>

namespace ptc::kernels::cuda {
namespace {
// ---- Embedding and cross-entropy -----------------------------------------------------
// Templated on the table's stored type T (f32, bf16, f16): rows copied as
// stored; the gradient's sums in f32, each rounded once.
template <typename T>
__global__ void embeddingKernel(const T *table, int64_t rows, int64_t dim, const int32_t *ids,
                                int64_t n, T *out, int64_t offset, int64_t total,
                                ErrorRecord *err) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t t = i / dim, id = ids[t];
    if ((id < 0 || id >= total) && i % dim == 0)
      recordError(err, kBadEmbeddingId, id, t, total);
    int64_t r = id - offset;
    out[i] = r >= 0 && r < rows ? table[r * dim + i % dim] : fromFloat<T>(0.0f);
  }
}

/// The embedding gradient without atomics: the token ids sorted (stably, so
/// each id's positions stay in order), then one block per run of equal ids
/// sums that id's gradient rows in position order and writes its table row.
/// The same sums in the same order on every run (and as the CPU adds them).
__global__ void iotaKernel(int32_t *p, int64_t n) {
  PTC_GRID_LOOP(i, n) p[i] = static_cast<int32_t>(i);
}
template <typename T>
__global__ void embeddingGradRunsKernel(const int32_t *sortedIds, const int32_t *order, int64_t n,
                                        const T *g, T *dtable, int64_t rows, int64_t dim,
                                        int64_t offset, int64_t total, ErrorRecord *err) {
  for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const int32_t id = sortedIds[p];
    if (p > 0 && sortedIds[p - 1] == id)
      continue; // inside another block's run
    if (id < 0 || id >= total) {
      if (threadIdx.x == 0)
        recordError(err, kBadEmbeddingId, id, order[p], total);
      continue;
    }
    const int64_t r = id - offset;
    if (r < 0 || r >= rows)
      continue; // another rank's block of the table
    int64_t end = p + 1;
    while (end < n && sortedIds[end] == id)
      ++end;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      float sum = 0.0f;
      for (int64_t q = p; q < end; ++q)
        sum += toFloat(g[static_cast<int64_t>(order[q]) * dim + c]);
      dtable[r * dim + c] = fromFloat<T>(sum);
    }
  }
}

/// One block per row: the row's loss into rowLoss (summed by orderedSumKernel
/// in a fixed order: no atomics). Logits f32, bf16 or f16 (T), read as
/// stored, in f32 registers.
template <typename T>
__global__ void crossEntropyRowsKernel(const T *logits, const int32_t *targets, int64_t rows,
                                       int64_t classes, float *rowLoss, ErrorRecord *err) {
  const T *row = logits + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  float m;
  float s = rowExpSum(row, classes, m);
  if (threadIdx.x == 0) {
    if (t < 0 || t >= classes) {
      recordError(err, kBadTarget, t, blockIdx.x, classes);
      rowLoss[blockIdx.x] = 0.0f;
      return;
    }
    rowLoss[blockIdx.x] = logf(s) + m - toFloat(row[t]);
  }
}

/// The logits' gradient in their type T: f32 math, one rounding. With
/// `rowLoss` (ptc.cross_entropy_with_grad), the row's loss too, from the same
/// maximum and sum (crossEntropyRowsKernel's numbers): the row is read for
/// them once, not again by a separate loss kernel.
template <typename T>
__global__ void crossEntropyGradKernel(const T *logits, const int32_t *targets, const float *g,
                                       int64_t rows, int64_t classes, T *out, ErrorRecord *err,
                                       float *rowLoss) {
  const T *row = logits + blockIdx.x * classes;
  T *o = out + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  if (threadIdx.x == 0 && (t < 0 || t >= classes))
    recordError(err, kBadTarget, t, blockIdx.x, classes);
  float m;
  float s = rowExpSum(row, classes, m);
  if (rowLoss && threadIdx.x == 0)
    rowLoss[blockIdx.x] = t < 0 || t >= classes ? 0.0f : logf(s) + m - toFloat(row[t]);
  float scale = *g / static_cast<float>(rows), inv = scale / s;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    o[c] = fromFloat<T>(expf(toFloat(row[c]) - m) * inv - (c == t ? scale : 0.0f));
}

template <typename T> __global__ void rowMaxKernel(const T *x, int64_t cols, float *out) {
  const T *row = x + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    m = fmaxf(m, toFloat(row[c]));
  m = blockMax(m);
  if (threadIdx.x == 0)
    out[blockIdx.x] = m;
}

template <typename T>
__global__ void rowSumExpKernel(const T *x, int64_t cols, const float *max, float *out) {
  const T *row = x + blockIdx.x * cols;
  float s = 0.0f, m = max[blockIdx.x];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += expf(toFloat(row[c]) - m);
  s = blockSum(s);
  if (threadIdx.x == 0)
    out[blockIdx.x] = s;
}

template <typename T>
__global__ void targetLogitKernel(const T *x, const int32_t *targets, int64_t rows,
                                  int64_t classes, int64_t offset, int64_t total, float *out,
                                  ErrorRecord *err) {
  PTC_GRID_LOOP(r, rows) {
    int64_t t = targets[r];
    if (t < 0 || t >= total)
      recordError(err, kBadTarget, t, r, total);
    int64_t c = t - offset;
    out[r] = c >= 0 && c < classes ? toFloat(x[r * classes + c]) : 0.0f;
  }
}

__global__ void lossFromPartsKernel(const float *max, const float *sum, const float *target,
                                    int64_t rows, float *loss) {
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    s += logf(sum[r]) + max[r] - target[r];
  s = blockSum(s);
  if (threadIdx.x == 0)
    *loss = s / static_cast<float>(rows);
}

template <typename T>
__global__ void vocabParallelGradKernel(const T *x, const int32_t *targets, const float *g,
                                        const float *max, const float *sum, int64_t rows,
                                        int64_t classes, int64_t offset, int64_t total, T *out,
                                        ErrorRecord *err) {
  int64_t r = blockIdx.x;
  int64_t t = targets[r];
  if (threadIdx.x == 0 && (t < 0 || t >= total))
    recordError(err, kBadTarget, t, r, total);
  float scale = *g / static_cast<float>(rows), inv = scale / sum[r], m = max[r];
  int64_t local = t - offset;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    out[r * classes + c] =
        fromFloat<T>(expf(toFloat(x[r * classes + c]) - m) * inv - (c == local ? scale : 0.0f));
}

} // namespace

std::string describe(const ErrorRecord &e) {
  const char *what = e.kind == kBadEmbeddingId ? "embedding index"
                     : e.kind == kBadTarget    ? "target"
                     : e.kind == kBadPosition  ? "position"
                                               : "expert index";
  return std::string(what) + " " + std::to_string(e.id) + " at position " +
         std::to_string(e.where) + " is outside [0, " + std::to_string(e.limit) + ")";
}


namespace {
template <typename T>
void embedding(const T *table, int64_t rows, int64_t dim, const int32_t *ids, int64_t n, T *out,
               int64_t rowOffset, int64_t totalRows, ErrorRecord *err, void *stream) {
  embeddingKernel<<<gridFor(n * dim), kThreads, 0, S(stream)>>>(table, rows, dim, ids, n, out,
                                                                rowOffset, totalRows, err);
}

/// The scratch of embeddingGrad for n ids: sorted ids, positions, sorted
/// positions (each 256-byte aligned), then CUB's sort storage.
int64_t alignedBytes(int64_t n) { return (n * 4 + 255) / 256 * 256; }
size_t sortStorageBytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t *>(nullptr),
                                  static_cast<int32_t *>(nullptr),
                                  static_cast<const int32_t *>(nullptr),
                                  static_cast<int32_t *>(nullptr), static_cast<int>(n));
  return bytes;
}

int64_t embeddingGradScratchBytes(int64_t n) {
  return 3 * alignedBytes(n) + static_cast<int64_t>(sortStorageBytes(n));
}

template <typename T>
KernelResult embeddingGrad(const int32_t *ids, int64_t n, const T *g, T *dtable, int64_t rows,
                           int64_t dim, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
                           void *scratch, void *stream) {
  // Zero bits are +0 in every float type.
  cudaMemsetAsync(dtable, 0, static_cast<size_t>(rows * dim) * sizeof(T), S(stream));
  if (n == 0)
    return KernelResult::ok();
  if (n > INT32_MAX)
    return KernelResult::error("an embedding gradient over ", n, " ids (at most 2^31 - 1)");
  char *base = static_cast<char *>(scratch);
  auto *sortedIds = reinterpret_cast<int32_t *>(base);
  auto *order = reinterpret_cast<int32_t *>(base + alignedBytes(n));
  auto *sortedOrder = reinterpret_cast<int32_t *>(base + 2 * alignedBytes(n));
  void *storage = base + 3 * alignedBytes(n);
  size_t storageBytes = sortStorageBytes(n);
  iotaKernel<<<gridFor(n), kThreads, 0, S(stream)>>>(order, n);
  cudaError_t e = cub::DeviceRadixSort::SortPairs(storage, storageBytes, ids, sortedIds, order,
                                                  sortedOrder, static_cast<int>(n), 0, 32,
                                                  S(stream));
  if (e != cudaSuccess)
    return KernelResult::error("sorting the embedding gradient's ids: ", cudaGetErrorString(e));
  embeddingGradRunsKernel<<<static_cast<unsigned>(std::min<int64_t>(n, 65535)), kThreads, 0,
                            S(stream)>>>(sortedIds, sortedOrder, n, g, dtable, rows, dim,
                                         rowOffset, totalRows, err);
  return KernelResult::ok();
}

template <typename T>
void crossEntropy(const T *logits, const int32_t *targets, int64_t rows, int64_t classes,
                  float *loss, float *rowLoss, ErrorRecord *err, void *stream) {
  if (rows == 0) {
    cudaMemsetAsync(loss, 0, sizeof(float), S(stream));
    return;
  }
  crossEntropyRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      logits, targets, rows, classes, rowLoss, err);
  orderedSumKernel<<<1, 1024, 0, S(stream)>>>(rowLoss, rows, 1.0f / static_cast<float>(rows),
                                              loss);
}

/// With `loss`, the mean loss too, its rows' losses in `rowLoss` (scratch)
/// summed as crossEntropy sums them.
template <typename T>
void crossEntropyGrad(const T *logits, const int32_t *targets, const float *g, int64_t rows,
                      int64_t classes, T *out, ErrorRecord *err, void *stream,
                      float *loss = nullptr, float *rowLoss = nullptr) {
  if (rows == 0) {
    if (loss)
      cudaMemsetAsync(loss, 0, sizeof(float), S(stream));
    return;
  }
  crossEntropyGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
      logits, targets, g, rows, classes, out, err, loss ? rowLoss : nullptr);
  if (loss)
    orderedSumKernel<<<1, 1024, 0, S(stream)>>>(rowLoss, rows, 1.0f / static_cast<float>(rows),
                                                loss);
}

/// The loss's types computed natively: f32, bf16 or f16 logits, i32 targets,
/// an f32 scalar (the loss, or its gradient), the gradient in the logits'
/// type, the gradient's optional second output (the loss) f32. (A 16-bit loss
/// is widened by the executor.)
bool crossEntropyTypes(const KernelCall &c) {
  const DType logits = c.input(0).dtype;
  const bool grad = c.numInputs == 3;
  const DType scalar = grad ? c.input(2).dtype : c.output(0).dtype;
  return logits != DType::I32 && c.input(1).dtype == DType::I32 && scalar == DType::F32 &&
         (!grad || c.output(0).dtype == logits) &&
         (c.numOutputs < 2 || c.output(1).dtype == DType::F32);
}

template <typename T>
void rowMax(const T *logits, int64_t rows, int64_t classes, float *out, void *stream) {
  if (rows > 0)
    rowMaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(logits, classes, out);
}

template <typename T>
void rowSumExp(const T *logits, int64_t rows, int64_t classes, const float *max, float *out,
               void *stream) {
  if (rows > 0)
    rowSumExpKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(logits, classes, max,
                                                                             out);
}

template <typename T>
void targetLogit(const T *logits, const int32_t *targets, int64_t rows, int64_t classes,
                 int64_t offset, int64_t total, float *out, ErrorRecord *err, void *stream) {
  targetLogitKernel<<<gridFor(rows), kThreads, 0, S(stream)>>>(logits, targets, rows, classes,
                                                               offset, total, out, err);
}

template <typename T>
void vocabParallelGrad(const T *logits, const int32_t *targets, const float *g, const float *max,
                       const float *sumExp, int64_t rows, int64_t classes, int64_t offset,
                       int64_t total, T *out, ErrorRecord *err, void *stream) {
  if (rows > 0)
    vocabParallelGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, g, max, sumExp, rows, classes, offset, total, out, err);
}

/// The vocabulary-parallel pieces' types: f32, bf16 or f16 logits (input 0)
/// and VocabParallelGrad's gradient (output 0) in their type; the rest f32
/// (and i32 targets).
bool vocabPieceTypes(const KernelCall &c) {
  return c.input(0).dtype != DType::I32 && vocabPieceOperandTypes(c);
}
} // namespace

void lossFromParts(const float *max, const float *sumExp, const float *target, int64_t rows,
                   float *loss, void *stream) {
  lossFromPartsKernel<<<1, 1024, 0, S(stream)>>>(max, sumExp, target, rows, loss);
}

void addEmbeddingAndLossKernels(KernelTable &t) {
  // The vocabulary-parallel cross-entropy's pieces (kernel_call.h).
  t.add(
      OpKind::RowMax,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        withFloatType(x.dtype, [&](auto tag) {
          using T = decltype(tag);
          rowMax(inputAs<T>(c, 0), x.rows(), x.dim(-1), c.output(0).f32(), streamOf(c));
          return 0;
        });
        return KernelResult::ok();
      },
      vocabPieceTypes);
  t.add(
      OpKind::RowSumExp,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        withFloatType(x.dtype, [&](auto tag) {
          using T = decltype(tag);
          rowSumExp(inputAs<T>(c, 0), x.rows(), x.dim(-1), c.input(1).f32(), c.output(0).f32(),
                    streamOf(c));
          return 0;
        });
        return KernelResult::ok();
      },
      vocabPieceTypes);
  t.add(
      OpKind::TargetLogit,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        withFloatType(x.dtype, [&](auto tag) {
          using T = decltype(tag);
          targetLogit(inputAs<T>(c, 0), c.input(1).i32(), x.rows(), x.dim(-1),
                      c.attr(attr::ClassBlock::first_class), c.attr(attr::ClassBlock::classes),
                      c.output(0).f32(), context(c).err, streamOf(c));
          return 0;
        });
        return KernelResult::ok();
      },
      vocabPieceTypes);
  t.add(OpKind::LossFromParts, [](const KernelCall &c) {
    lossFromParts(c.input(0).f32(), c.input(1).f32(), c.input(2).f32(), c.input(0).elements,
                  c.output(0).f32(), streamOf(c));
    return KernelResult::ok();
  });
  t.add(
      OpKind::VocabParallelGrad,
      [](const KernelCall &c) {
        const TensorView &x = c.input(0);
        withFloatType(x.dtype, [&](auto tag) {
          using T = decltype(tag);
          vocabParallelGrad(inputAs<T>(c, 0), c.input(1).i32(), c.input(2).f32(),
                            c.input(3).f32(), c.input(4).f32(), x.rows(), x.dim(-1),
                            c.attr(attr::ClassBlock::first_class),
                            c.attr(attr::ClassBlock::classes), outputAs<T>(c, 0),
                            context(c).err, streamOf(c));
          return 0;
        });
        return KernelResult::ok();
      },
      vocabPieceTypes);
  // A vocabulary-parallel table (ints: its mesh axis) is this rank's block of rows.
  // The table and the rows in f32, bf16 or f16 (one type), i32 ids.
  t.add(
      OpKind::Embedding,
      [](const KernelCall &c) {
        const TensorView &table = c.input(0), &ids = c.input(1);
        VocabularyBlock block = vocabularyBlock(c, table.dim(0));
        withFloatType(table.dtype, [&](auto tag) {
          using T = decltype(tag);
          embedding(inputAs<T>(c, 0), table.dim(0), table.dim(1), ids.i32(), ids.elements,
                    outputAs<T>(c, 0), block.offset, block.total, context(c).err, streamOf(c));
          return 0;
        });
        return KernelResult::ok();
      },
      [](const KernelCall &c) { return oneFloatType(c, 1); });
  // ids (i32), then the rows' gradient and the table's in one float type.
  t.add(
      OpKind::EmbeddingGrad,
      [](const KernelCall &c) {
        const TensorView &ids = c.input(0), &dtable = c.output(0);
        VocabularyBlock block = vocabularyBlock(c, dtable.dim(0));
        const int64_t bytes = embeddingGradScratchBytes(ids.elements);
        void *work = scratch(c, bytes);
        if (!work)
          return scratchFailure(c, bytes);
        return withFloatType(dtable.dtype, [&](auto tag) {
          using T = decltype(tag);
          return embeddingGrad(ids.i32(), ids.elements, inputAs<T>(c, 1), outputAs<T>(c, 0),
                               dtable.dim(0), dtable.dim(1), block.offset, block.total,
                               context(c).err, work, streamOf(c));
        });
      },
      [](const KernelCall &c) {
        const DType t = c.output(0).dtype;
        return c.input(0).dtype == DType::I32 && t != DType::I32 && c.input(1).dtype == t;
      });
  t.add(
      OpKind::CrossEntropy,
      [](const KernelCall &c) {
        const TensorView &logits = c.input(0);
        const int64_t bytes = std::max<int64_t>(logits.rows(), 1) * 4;
        auto *rowLoss = static_cast<float *>(scratch(c, bytes));
        if (!rowLoss)
          return scratchFailure(c, bytes);
        withFloatType(logits.dtype, [&](auto tag) {
          using T = decltype(tag);
          crossEntropy(inputAs<T>(c, 0), c.input(1).i32(), logits.rows(), logits.dim(-1),
                       c.output(0).f32(), rowLoss, context(c).err, streamOf(c));
          return 0;
        });
        return KernelResult::ok();
      },
      crossEntropyTypes);
  t.add(
      OpKind::CrossEntropyGrad,
      [](const KernelCall &c) {
        // With a second output, the loss too (ptc.cross_entropy_with_grad).
        const TensorView &logits = c.input(0);
        const bool withLoss = c.numOutputs > 1;
        float *rowLoss = nullptr;
        if (withLoss) {
          const int64_t bytes = std::max<int64_t>(logits.rows(), 1) * 4;
          rowLoss = static_cast<float *>(scratch(c, bytes));
          if (!rowLoss)
            return scratchFailure(c, bytes);
        }
        withFloatType(logits.dtype, [&](auto tag) {
          using T = decltype(tag);
          crossEntropyGrad(inputAs<T>(c, 0), c.input(1).i32(), c.input(2).f32(), logits.rows(),
                           logits.dim(-1), outputAs<T>(c, 0), context(c).err, streamOf(c),
                           withLoss ? c.output(1).f32() : nullptr, rowLoss);
          return 0;
        });
        return KernelResult::ok();
      },
      crossEntropyTypes);
}
} // namespace ptc::kernels::cuda
