// CUDA kernels: embeddings and cross-entropy (whole and vocabulary-parallel) (see kernels.h).

#include "kernels/cuda/internal.cuh"

namespace ptc::kernels::cuda {
namespace {
// ---- Embedding and cross-entropy -----------------------------------------------------
__global__ void embeddingKernel(const float *table, int64_t rows, int64_t dim, const int32_t *ids,
                                int64_t n, float *out, int64_t offset, int64_t total,
                                ErrorRecord *err) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t t = i / dim, id = ids[t];
    if ((id < 0 || id >= total) && i % dim == 0)
      recordError(err, kBadEmbeddingId, id, t, total);
    int64_t r = id - offset;
    out[i] = r >= 0 && r < rows ? table[r * dim + i % dim] : 0.0f;
  }
}

__global__ void embeddingGradKernel(const int32_t *ids, int64_t n, const float *g, float *dtable,
                                    int64_t rows, int64_t dim, int64_t offset, int64_t total,
                                    ErrorRecord *err) {
  PTC_GRID_LOOP(i, n * dim) {
    int64_t t = i / dim, id = ids[t];
    if (id < 0 || id >= total) {
      if (i % dim == 0)
        recordError(err, kBadEmbeddingId, id, t, total);
      continue;
    }
    int64_t r = id - offset;
    if (r >= 0 && r < rows)
      atomicAdd(&dtable[r * dim + i % dim], g[i]);
  }
}

/// One block per row: adds this row's loss / rows into *loss (zeroed first).
__global__ void crossEntropyKernel(const float *logits, const int32_t *targets, int64_t rows,
                                   int64_t classes, float *loss, ErrorRecord *err) {
  const float *row = logits + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  float m;
  float s = rowExpSum(row, classes, m);
  if (threadIdx.x == 0) {
    if (t < 0 || t >= classes) {
      recordError(err, kBadTarget, t, blockIdx.x, classes);
      return;
    }
    atomicAdd(loss, (logf(s) + m - row[t]) / static_cast<float>(rows));
  }
}

__global__ void crossEntropyGradKernel(const float *logits, const int32_t *targets, const float *g,
                                       int64_t rows, int64_t classes, float *out,
                                       ErrorRecord *err) {
  const float *row = logits + blockIdx.x * classes;
  float *o = out + blockIdx.x * classes;
  int32_t t = targets[blockIdx.x];
  if (threadIdx.x == 0 && (t < 0 || t >= classes))
    recordError(err, kBadTarget, t, blockIdx.x, classes);
  float m;
  float s = rowExpSum(row, classes, m);
  float scale = *g / static_cast<float>(rows), inv = scale / s;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    o[c] = expf(row[c] - m) * inv - (c == t ? scale : 0.0f);
}

__global__ void rowMaxKernel(const float *x, int64_t cols, float *out) {
  const float *row = x + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    m = fmaxf(m, row[c]);
  m = blockMax(m);
  if (threadIdx.x == 0)
    out[blockIdx.x] = m;
}

__global__ void rowSumExpKernel(const float *x, int64_t cols, const float *max, float *out) {
  const float *row = x + blockIdx.x * cols;
  float s = 0.0f, m = max[blockIdx.x];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += expf(row[c] - m);
  s = blockSum(s);
  if (threadIdx.x == 0)
    out[blockIdx.x] = s;
}

__global__ void targetLogitKernel(const float *x, const int32_t *targets, int64_t rows,
                                  int64_t classes, int64_t offset, int64_t total, float *out,
                                  ErrorRecord *err) {
  PTC_GRID_LOOP(r, rows) {
    int64_t t = targets[r];
    if (t < 0 || t >= total)
      recordError(err, kBadTarget, t, r, total);
    int64_t c = t - offset;
    out[r] = c >= 0 && c < classes ? x[r * classes + c] : 0.0f;
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

__global__ void vocabParallelGradKernel(const float *x, const int32_t *targets, const float *g,
                                        const float *max, const float *sum, int64_t rows,
                                        int64_t classes, int64_t offset, int64_t total,
                                        float *out, ErrorRecord *err) {
  int64_t r = blockIdx.x;
  int64_t t = targets[r];
  if (threadIdx.x == 0 && (t < 0 || t >= total))
    recordError(err, kBadTarget, t, r, total);
  float scale = *g / static_cast<float>(rows), inv = scale / sum[r], m = max[r];
  int64_t local = t - offset;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    out[r * classes + c] = expf(x[r * classes + c] - m) * inv - (c == local ? scale : 0.0f);
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


void embedding(const float *table, int64_t rows, int64_t dim, const int32_t *ids, int64_t n,
               float *out, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
               void *stream) {
  embeddingKernel<<<gridFor(n * dim), kThreads, 0, S(stream)>>>(table, rows, dim, ids, n, out,
                                                                rowOffset, totalRows, err);
}

void embeddingGrad(const int32_t *ids, int64_t n, const float *g, float *dtable, int64_t rows,
                   int64_t dim, int64_t rowOffset, int64_t totalRows, ErrorRecord *err,
                   void *stream) {
  cudaMemsetAsync(dtable, 0, static_cast<size_t>(rows * dim) * sizeof(float), S(stream));
  embeddingGradKernel<<<gridFor(n * dim), kThreads, 0, S(stream)>>>(ids, n, g, dtable, rows, dim,
                                                                    rowOffset, totalRows, err);
}

void crossEntropy(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                  float *loss, ErrorRecord *err, void *stream) {
  cudaMemsetAsync(loss, 0, sizeof(float), S(stream));
  if (rows > 0)
    crossEntropyKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, rows, classes, loss, err);
}

void crossEntropyGrad(const float *logits, const int32_t *targets, const float *g, int64_t rows,
                      int64_t classes, float *out, ErrorRecord *err, void *stream) {
  if (rows > 0)
    crossEntropyGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, g, rows, classes, out, err);
}

void rowMax(const float *logits, int64_t rows, int64_t classes, float *out, void *stream) {
  if (rows > 0)
    rowMaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(logits, classes, out);
}

void rowSumExp(const float *logits, int64_t rows, int64_t classes, const float *max, float *out,
               void *stream) {
  if (rows > 0)
    rowSumExpKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(logits, classes, max,
                                                                             out);
}

void targetLogit(const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
                 int64_t offset, int64_t total, float *out, ErrorRecord *err, void *stream) {
  targetLogitKernel<<<gridFor(rows), kThreads, 0, S(stream)>>>(logits, targets, rows, classes,
                                                               offset, total, out, err);
}

void lossFromParts(const float *max, const float *sumExp, const float *target, int64_t rows,
                   float *loss, void *stream) {
  lossFromPartsKernel<<<1, 1024, 0, S(stream)>>>(max, sumExp, target, rows, loss);
}

void vocabParallelGrad(const float *logits, const int32_t *targets, const float *g,
                       const float *max, const float *sumExp, int64_t rows, int64_t classes,
                       int64_t offset, int64_t total, float *out, ErrorRecord *err,
                       void *stream) {
  if (rows > 0)
    vocabParallelGradKernel<<<static_cast<unsigned>(rows), kThreads, 0, S(stream)>>>(
        logits, targets, g, max, sumExp, rows, classes, offset, total, out, err);
}

void addEmbeddingAndLossKernels(KernelTable &t) {
  // A vocabulary-parallel table (ints: its mesh axis) is this rank's block of rows.
  t.add(OpKind::Embedding, [](const KernelCall &c) {
    const TensorView &table = c.input(0), &ids = c.input(1);
    VocabularyBlock block = vocabularyBlock(c, table.dim(0));
    embedding(table.f32(), table.dim(0), table.dim(1), ids.i32(), ids.elements, c.output(0).f32(),
              block.offset, block.total, context(c).err, streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::EmbeddingGrad, [](const KernelCall &c) {
    const TensorView &ids = c.input(0), &dtable = c.output(0);
    VocabularyBlock block = vocabularyBlock(c, dtable.dim(0));
    embeddingGrad(ids.i32(), ids.elements, c.input(1).f32(), dtable.f32(), dtable.dim(0),
                  dtable.dim(1), block.offset, block.total, context(c).err, streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::CrossEntropy, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    crossEntropy(logits.f32(), c.input(1).i32(), logits.rows(), logits.dim(-1), c.output(0).f32(),
                 context(c).err, streamOf(c));
    return KernelResult::ok();
  });
  t.add(OpKind::CrossEntropyGrad, [](const KernelCall &c) {
    const TensorView &logits = c.input(0);
    crossEntropyGrad(logits.f32(), c.input(1).i32(), c.input(2).f32(), logits.rows(),
                     logits.dim(-1), c.output(0).f32(), context(c).err, streamOf(c));
    return KernelResult::ok();
  });
}
} // namespace ptc::kernels::cuda
