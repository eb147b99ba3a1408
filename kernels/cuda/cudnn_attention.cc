// cuDNN fused attention (see cudnn_attention.h): the forward and backward
// graphs in cuDNN's backend API, their execution plans cached per problem.

#include "kernels/cuda/cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

namespace ptc::kernels::cuda::cudnn {
namespace {

/// The first cuDNN version whose fused attention backward has a deterministic
/// algorithm on Hopper.
constexpr size_t kDeterministicBackwardVersion = 91801;
constexpr int64_t kAlignment = 256; // of each scratch region

int64_t alignUp(int64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

std::string describeStatus(cudnnStatus_t st) {
  std::string s = cudnnGetErrorString(st);
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0])
    s += std::string(" (") + detail + ")";
  return s;
}

// ---- The handle of each GPU ------------------------------------------------------
struct Library {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles; // by device ordinal
  std::map<int, std::string> failures;
};
Library &library() {
  static Library *lib = new Library(); // kept to exit: cuDNN's teardown order is its own
  return *lib;
}

/// The current GPU's handle, or null with `why` set. Called with the mutex held.
cudnnHandle_t handleLocked(std::string &why) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    why = "no current CUDA device";
    return nullptr;
  }
  Library &lib = library();
  if (auto it = lib.handles.find(device); it != lib.handles.end())
    return it->second;
  if (auto it = lib.failures.find(device); it != lib.failures.end()) {
    why = it->second;
    return nullptr;
  }
  cudnnHandle_t h = nullptr;
  cudnnStatus_t st = cudnnCreate(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    why = "cudnnCreate failed: " + describeStatus(st);
    lib.failures[device] = why;
    return nullptr;
  }
  lib.handles[device] = h;
  return h;
}

std::string versionText(size_t v) {
  std::ostringstream os;
  os << v / 10000 << "." << v / 100 % 100 << "." << v % 100;
  return os.str();
}

// ---- A graph under construction ----------------------------------------------------
/// A tensor of the graph: its descriptor and unique id.
struct Tensor {
  cudnnBackendDescriptor_t desc = nullptr;
  int64_t uid = 0;
};

/// Builds backend descriptors, keeping each alive (an execution plan refers
/// to them) and the first failure's message.
class GraphBuilder {
public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  bool ok() const { return error_.empty(); }
  const std::string &error() const { return error_; }
  std::vector<cudnnBackendDescriptor_t> takeDescriptors() { return std::move(owned_); }

  /// A tensor [dims] with `strides`; uid > 0 for the graph's inputs and
  /// outputs (they get device pointers), a fresh one for intermediates.
  Tensor tensor(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type,
                bool isVirtual, int64_t uid = 0, bool byValue = false) {
    Tensor t{make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor"), uid ? uid : nextUid_++};
    if (!t.desc)
      return t;
    const int64_t alignment = 16;
    set(t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, "tensor id");
    set(t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    set(t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "alignment");
    set(t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()),
        dims.data(), "tensor dimensions");
    set(t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()),
        strides.data(), "tensor strides");
    bool v = isVirtual;
    set(t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "virtual");
    if (byValue) {
      bool b = true;
      set(t.desc, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &b, "by value");
    }
    finalize(t.desc, "a tensor");
    return t;
  }
  /// A float scalar passed by value (its host pointer in the variant pack).
  Tensor scalar(int64_t uid) {
    return tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, uid, true);
  }

  /// y = mode(x[, b[, t]]) computed in `math`.
  void pointwise(cudnnPointwiseMode_t mode, const Tensor &x, const Tensor *b, const Tensor *t,
                 const Tensor &y, cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "a pointwise op");
    if (!pw)
      return;
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "pointwise math");
    if (axis >= 0)
      set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "index axis");
    finalize(pw, "a pointwise op");
    cudnnBackendDescriptor_t op =
        make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "a pointwise operation");
    if (!op)
      return;
    setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc);
    if (b)
      setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b->desc);
    if (t)
      setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t->desc);
    setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc);
    addOperation(op, "a pointwise operation");
  }
  /// c = a b over the last two dimensions (f32 accumulation).
  void matmul(const Tensor &a, const Tensor &b, const Tensor &c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "a matmul");
    if (!mm)
      return;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul type");
    finalize(mm, "a matmul");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "a matmul op");
    if (!op)
      return;
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc);
    setDesc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    addOperation(op, "a matmul operation");
  }
  /// y = reduce(x) over the dimensions where y has size 1 (or fewer heads).
  void reduction(cudnnReduceTensorOp_t mode, const Tensor &x, const Tensor &y) {
    cudnnBackendDescriptor_t red = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "a reduction");
    if (!red)
      return;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        "reduction operator");
    set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction type");
    finalize(red, "a reduction");
    cudnnBackendDescriptor_t op =
        make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "a reduction op");
    if (!op)
      return;
    setDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc);
    setDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc);
    setDesc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
    addOperation(op, "a reduction operation");
  }
  /// y: x's elements under other dimensions and strides (a transposed view).
  void reshape(const Tensor &x, const Tensor &y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "a reshape");
    if (!op)
      return;
    setDesc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc);
    setDesc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc);
    addOperation(op, "a reshape operation");
  }

  /// The operation graph of every operation added, finalized; null on failure.
  cudnnBackendDescriptor_t operationGraph() {
    if (!ok())
      return nullptr;
    cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the graph");
    if (!g)
      return nullptr;
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "graph handle");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data(), "graph operations");
    finalize(g, "the operation graph");
    return ok() ? g : nullptr;
  }

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char *what) {
    if (!ok())
      return nullptr;
    cudnnBackendDescriptor_t d = nullptr;
    check(cudnnBackendCreateDescriptor(type, &d), "creating", what);
    if (d)
      owned_.push_back(d);
    return ok() ? d : nullptr;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what) {
    if (ok())
      check(cudnnBackendSetAttribute(d, name, type, count, value), "setting", what);
  }
  void finalize(cudnnBackendDescriptor_t d, const char *what) {
    if (ok())
      check(cudnnBackendFinalize(d), "finalizing", what);
  }

private:
  void setDesc(cudnnBackendDescriptor_t op, cudnnBackendAttributeName_t name,
               cudnnBackendDescriptor_t value) {
    set(op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, "an operand");
  }
  void addOperation(cudnnBackendDescriptor_t op, const char *what) {
    finalize(op, what);
    if (ok())
      ops_.push_back(op);
  }
  void check(cudnnStatus_t st, const char *verb, const char *what) {
    if (st != CUDNN_STATUS_SUCCESS && error_.empty())
      error_ = std::string(verb) + " " + what + ": " + describeStatus(st);
  }

  cudnnHandle_t handle_;
  std::vector<cudnnBackendDescriptor_t> owned_, ops_;
  std::string error_;
  int64_t nextUid_ = 1000;
};

// Unique ids of the graphs' device and by-value tensors.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kGradO, kGradQ, kGradK, kGradV, kRowDot
};

cudnnDataType_t ioType(FloatType t) {
  return t == FloatType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}
std::vector<int64_t> headStrides(const HeadStrides &s) { return {s.batch, s.head, s.seq, 1}; }
/// A transposed [batch, heads, dim, seq] view of the same memory.
std::vector<int64_t> transposedStrides(const HeadStrides &s) { return {s.batch, s.head, 1, s.seq}; }

/// Dimensions and packed strides of the scores [b, h, sq, skv] and of the
/// rows' statistics [b, h, sq, 1].
struct Shapes {
  std::vector<int64_t> scores, scoreStrides, scoresT, scoreStridesT, rows, rowStrides;
  explicit Shapes(const AttentionProblem &p) {
    const int64_t b = p.batch, h = p.heads, s = p.seq;
    scores = {b, h, s, s};
    scoreStrides = {h * s * s, s * s, s, 1};
    scoresT = {b, h, s, s};
    scoreStridesT = {h * s * s, s * s, 1, s};
    rows = {b, h, s, 1};
    rowStrides = {h * s, s, 1, 1};
  }
};

/// scores where the key is at or before the query (top-left causal), -inf
/// elsewhere.
Tensor causalMask(GraphBuilder &g, const Shapes &sh, const Tensor &scores, const Tensor &negInf) {
  Tensor row = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_INT32, true);
  Tensor col = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_INT32, true);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  Tensor visible = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_BOOLEAN, true);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, visible, CUDNN_DATA_BOOLEAN);
  Tensor masked = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, &negInf, &visible, masked);
  return masked;
}

/// scale q k^T: the scores [b, h, sq, skv] (f32, virtual).
Tensor scaledScores(GraphBuilder &g, const Shapes &sh, const Tensor &q, const Tensor &kT,
                    const Tensor &scale) {
  Tensor scores = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.matmul(q, kT, scores);
  Tensor scaled = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_MUL, scores, &scale, nullptr, scaled);
  return scaled;
}

/// The forward graph: o and the rows' log-sum-exp (stats).
void buildForward(GraphBuilder &g, const AttentionProblem &p) {
  const cudnnDataType_t io = ioType(p.type);
  const int64_t b = p.batch, h = p.heads, hk = p.kvHeads, s = p.seq, d = p.dim;
  const Shapes sh(p);
  Tensor q = g.tensor({b, h, s, d}, headStrides(p.q), io, false, kQ);
  Tensor kT = g.tensor({b, hk, d, s}, transposedStrides(p.k), io, false, kK);
  Tensor v = g.tensor({b, hk, s, d}, headStrides(p.v), io, false, kV);
  Tensor o = g.tensor({b, h, s, d}, headStrides(p.o), io, false, kO);
  Tensor stats = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, false, kStats);
  Tensor scale = g.scalar(kScale);

  // (-inf, the mask's fill, is a graph input only where there is a mask.)
  Tensor scores = scaledScores(g, sh, q, kT, scale);
  Tensor masked = p.causal ? causalMask(g, sh, scores, g.scalar(kNegInf)) : scores;
  Tensor max = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, true);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  Tensor shifted = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, &max, nullptr, shifted);
  Tensor e = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  Tensor sum = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, true);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  Tensor logSum = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, logSum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, &logSum, nullptr, stats);
  Tensor probs = g.tensor(sh.scores, sh.scoreStrides, io, true);
  g.pointwise(CUDNN_POINTWISE_DIV, e, &sum, nullptr, probs);
  g.matmul(probs, v, o);
}

/// The backward graph (deterministic: dq from dS in the engine's workspace,
/// no accumulation by atomics): dq, dk, dv from q, k, v, o, stats and dO.
void buildBackward(GraphBuilder &g, const AttentionProblem &p) {
  const cudnnDataType_t io = ioType(p.type);
  const int64_t b = p.batch, h = p.heads, hk = p.kvHeads, s = p.seq, d = p.dim;
  const Shapes sh(p);
  Tensor q = g.tensor({b, h, s, d}, headStrides(p.q), io, false, kQ);
  Tensor kT = g.tensor({b, hk, d, s}, transposedStrides(p.k), io, false, kK);
  Tensor vT = g.tensor({b, hk, d, s}, transposedStrides(p.v), io, false, kV);
  Tensor o = g.tensor({b, h, s, d}, headStrides(p.o), io, false, kO);
  Tensor dO = g.tensor({b, h, s, d}, headStrides(p.o), io, false, kGradO);
  Tensor stats = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, false, kStats);
  Tensor dQ = g.tensor({b, h, s, d}, headStrides(p.q), io, false, kGradQ);
  Tensor dK = g.tensor({b, hk, s, d}, headStrides(p.k), io, false, kGradK);
  Tensor dV = g.tensor({b, hk, s, d}, headStrides(p.v), io, false, kGradV);
  Tensor scale = g.scalar(kScale), one = g.scalar(kOne);

  // D_i = dO_i . o_i, kept in device memory (scratch) for the kernel.
  Tensor prod = g.tensor({b, h, s, d}, {h * s * d, s * d, h * d, 1}, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_MUL, dO, &o, nullptr, prod);
  Tensor dot = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, true);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, dot);
  Tensor rowDot = g.tensor(sh.rows, sh.rowStrides, CUDNN_DATA_FLOAT, false, kRowDot);
  g.pointwise(CUDNN_POINTWISE_MUL, dot, &one, nullptr, rowDot);

  // P = exp(scale q k^T - lse) under the causal mask.
  Tensor shifted = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_SUB, scaledScores(g, sh, q, kT, scale), &stats, nullptr, shifted);
  Tensor masked = p.causal ? causalMask(g, sh, shifted, g.scalar(kNegInf)) : shifted;
  Tensor probs = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, probs);

  // dV = P^T dO (summed over the query heads of a group).
  Tensor probsT = g.tensor(sh.scoresT, sh.scoreStridesT, io, true);
  g.reshape(probs, probsT);
  const bool grouped = h != hk;
  auto intoKvHeads = [&](const Tensor &a, const Tensor &bOperand, const Tensor &out) {
    if (!grouped) {
      g.matmul(a, bOperand, out);
      return;
    }
    Tensor full = g.tensor({b, h, s, d}, {h * s * d, s * d, d, 1}, io, true);
    g.matmul(a, bOperand, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  intoKvHeads(probsT, dO, dV);

  // dS = P * (dO v^T - D) * scale.
  Tensor dP = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.matmul(dO, vT, dP);
  Tensor centered = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_SUB, dP, &rowDot, nullptr, centered);
  Tensor weighted = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_MUL, centered, &probs, nullptr, weighted);
  Tensor dS = g.tensor(sh.scores, sh.scoreStrides, CUDNN_DATA_FLOAT, true);
  g.pointwise(CUDNN_POINTWISE_MUL, weighted, &scale, nullptr, dS);

  // dK = dS^T q; dq = dS k.
  Tensor dST = g.tensor(sh.scoresT, sh.scoreStridesT, io, true);
  g.reshape(dS, dST);
  intoKvHeads(dST, q, dK);
  Tensor k = g.tensor({b, hk, s, d}, headStrides(p.k), io, true);
  g.reshape(kT, k);
  g.matmul(dS, k, dQ);
}

// ---- Execution plans ---------------------------------------------------------------
struct Plan {
  cudnnHandle_t handle = nullptr;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  std::string error; // why there is none
};

/// The first engine configuration of the heuristics' list that finalizes
/// (passing over non-deterministic ones when `deterministic`).
void choosePlan(GraphBuilder &g, cudnnBackendDescriptor_t graph, bool deterministic, Plan &out) {
  cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  if (!heur) {
    out.error = g.error();
    return;
  }
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
        "heuristics graph");
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  g.finalize(heur, "the engine heuristics (no engine matches the graph)");
  if (!g.ok()) {
    out.error = g.error();
    return;
  }
  int64_t count = 0;
  if (cudnnStatus_t st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
      st != CUDNN_STATUS_SUCCESS) {
    out.error = "reading the heuristics' results: " + describeStatus(st);
    return;
  }
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i)
    configs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine configuration"));
  if (!g.ok()) {
    out.error = g.error();
    return;
  }
  int64_t got = 0;
  if (count > 0)
    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             count, &got, configs.data());
  std::string last = "the heuristics list no engine for the graph";
  for (int64_t i = 0; i < got; ++i) {
    if (deterministic) {
      cudnnBackendDescriptor_t engine = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "an engine");
      int64_t n = 0;
      std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
      bool nondeterministic = false;
      if (engine &&
          cudnnBackendGetAttribute(configs[static_cast<size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
              CUDNN_STATUS_SUCCESS &&
          cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                   CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                                   notes.data()) == CUDNN_STATUS_SUCCESS)
        for (int64_t j = 0; j < n; ++j)
          nondeterministic |= notes[static_cast<size_t>(j)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
      if (nondeterministic) {
        last = "every engine the heuristics list is non-deterministic";
        continue;
      }
    }
    cudnnBackendDescriptor_t plan = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    cudnnStatus_t st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                                CUDNN_TYPE_HANDLE, 1, &out.handle);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                    &configs[static_cast<size_t>(i)]);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendFinalize(plan);
    int64_t ws = 0, n = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                    CUDNN_TYPE_INT64, 1, &n, &ws);
    if (st != CUDNN_STATUS_SUCCESS) {
      last = "no engine configuration finalizes: " + describeStatus(st);
      cudnnBackendDestroyDescriptor(plan);
      continue;
    }
    out.plan = plan;
    out.workspace = ws;
    return;
  }
  out.error = last;
}

using ProblemKey = std::tuple<int, bool, bool, int, int64_t, int64_t, int64_t, int64_t, int64_t,
                              std::vector<int64_t>>;
ProblemKey keyOf(int device, const AttentionProblem &p, bool backward) {
  return {device,
          backward,
          p.causal,
          static_cast<int>(p.type),
          p.batch,
          p.heads,
          p.kvHeads,
          p.seq,
          p.dim,
          {p.q.batch, p.q.head, p.q.seq, p.k.batch, p.k.head, p.k.seq, p.v.batch, p.v.head,
           p.v.seq, p.o.batch, p.o.head, p.o.seq}};
}

/// Shape checks cuDNN's fused attention states in its documentation.
std::string shapeRefusal(const AttentionProblem &p) {
  // Called on every attention call (the entries' accepts): no text built
  // unless something is refused.
  if (p.type == FloatType::F32)
    return "f32 tensors (cuDNN's fused attention takes bf16 and f16)";
  if (p.dim % 8 != 0 || p.dim > 256)
    return "head dimension " + std::to_string(p.dim) +
           " (cuDNN's fused attention takes multiples of 8 up to 256)";
  if (p.seq < 2)
    return "a sequence of " + std::to_string(p.seq) + " (cuDNN's fused attention takes 2 or more)";
  if (p.kvHeads <= 0 || p.heads % p.kvHeads != 0)
    return std::to_string(p.kvHeads) + " key/value heads for " + std::to_string(p.heads) +
           " query heads";
  for (const HeadStrides *s : {&p.q, &p.k, &p.v, &p.o})
    if (s->batch % 8 || s->head % 8 || s->seq % 8)
      return "strides (" + std::to_string(s->batch) + ", " + std::to_string(s->head) + ", " +
             std::to_string(s->seq) + ") that are not 16-byte multiples";
  return {};
}

/// The cached plan of `p` (built on first use); null with `why` set when
/// cuDNN cannot run it.
const Plan *planFor(const AttentionProblem &p, bool backward, std::string &why) {
  if (std::string refusal = shapeRefusal(p); !refusal.empty()) {
    why = refusal;
    return nullptr;
  }
  if (backward && cudnnGetVersion() < kDeterministicBackwardVersion) {
    why = "cuDNN " + versionText(cudnnGetVersion()) + " is loaded; the deterministic backward needs " +
          versionText(kDeterministicBackwardVersion) + " or later";
    return nullptr;
  }
  Library &lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  cudnnHandle_t handle = handleLocked(why);
  if (!handle)
    return nullptr;
  int device = 0;
  cudaGetDevice(&device);
  static auto *cache = new std::map<ProblemKey, Plan>(); // plans live as long as the process
  ProblemKey key = keyOf(device, p, backward);
  auto it = cache->find(key);
  if (it == cache->end()) {
    Plan plan;
    plan.handle = handle;
    GraphBuilder g(handle);
    if (backward)
      buildBackward(g, p);
    else
      buildForward(g, p);
    cudnnBackendDescriptor_t graph = g.operationGraph();
    if (!graph)
      plan.error = g.error();
    else
      choosePlan(g, graph, backward, plan);
    // The descriptors stay alive with the plan (the cache is never emptied).
    (void)g.takeDescriptors();
    it = cache->emplace(key, plan).first;
  }
  if (!it->second.plan) {
    why = it->second.error;
    return nullptr;
  }
  return &it->second;
}

/// Runs `plan` on the tensors `uids` -> `pointers`.
KernelResult execute(const Plan &plan, std::vector<int64_t> uids, std::vector<void *> pointers,
                     void *workspace, void *stream, const char *what) {
  cudnnSetStream(plan.handle, static_cast<cudaStream_t>(stream));
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                  static_cast<int64_t>(uids.size()), uids.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                  static_cast<int64_t>(pointers.size()), pointers.data());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                  &workspace);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendFinalize(pack);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendExecute(plan.handle, plan.plan, pack);
  if (pack)
    cudnnBackendDestroyDescriptor(pack);
  if (st != CUDNN_STATUS_SUCCESS)
    return KernelResult::error("cuDNN fused attention ", what, " failed: ", describeStatus(st));
  return KernelResult::ok();
}

int64_t outputBytes(const AttentionProblem &p) {
  return p.batch * p.heads * p.seq * p.dim * 2; // bf16 / f16
}
int64_t rowBytes(const AttentionProblem &p) { return p.batch * p.heads * p.seq * 4; }

/// Workspace of a plan that exists (0 otherwise: the call then fails first).
int64_t workspaceOf(const AttentionProblem &p, bool backward) {
  std::string why;
  const Plan *plan = planFor(p, backward, why);
  return plan ? plan->workspace : 0;
}
} // namespace

std::string libraryDescription() {
  Library &lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  std::string why;
  if (!handleLocked(why))
    return "cuDNN unavailable: " + why;
  std::string text = "cuDNN " + versionText(cudnnGetVersion()) + " fused attention";
  if (cudnnGetVersion() < kDeterministicBackwardVersion)
    text += " (forward only: the deterministic backward needs " +
            versionText(kDeterministicBackwardVersion) + ")";
  return text;
}

std::string supports(const AttentionProblem &p, bool backward) {
  std::string why;
  if (!planFor(p, false, why) || (backward && !planFor(p, true, why)))
    return why;
  return {};
}

int64_t forwardScratchBytes(const AttentionProblem &p, bool stats) {
  return (stats ? 0 : alignUp(rowBytes(p))) + alignUp(workspaceOf(p, false));
}

int64_t backwardScratchBytes(const AttentionProblem &p, bool stats) {
  // Given the statistics: D's rows and the backward's workspace; else also
  // the recomputed forward's output and statistics (and its workspace).
  if (stats)
    return alignUp(rowBytes(p)) + alignUp(workspaceOf(p, true));
  return alignUp(outputBytes(p)) + 2 * alignUp(rowBytes(p)) +
         alignUp(std::max(workspaceOf(p, false), workspaceOf(p, true)));
}

KernelResult forward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                     void *o, float *stats, float scale, void *scratch, void *stream) {
  std::string why;
  const Plan *plan = planFor(p, false, why);
  if (!plan)
    return KernelResult::error("cuDNN fused attention cannot run this problem: ", why);
  char *workspace = static_cast<char *>(scratch);
  void *rows = stats;
  if (!stats) {
    rows = workspace;
    workspace += alignUp(rowBytes(p));
  }
  float negInf = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void *> pointers{const_cast<void *>(q), const_cast<void *>(k), const_cast<void *>(v),
                               o, rows, &scale};
  if (p.causal) {
    uids.push_back(kNegInf);
    pointers.push_back(&negInf);
  }
  return execute(*plan, uids, pointers, workspace, stream, "forward");
}

KernelResult backward(const AttentionProblem &p, const void *q, const void *k, const void *v,
                      const void *o, const float *stats, const void *g, void *dq, void *dk,
                      void *dv, float scale, void *scratch, void *stream) {
  std::string why;
  const Plan *fwd = stats ? nullptr : planFor(p, false, why);
  const Plan *bwd = (stats || fwd) ? planFor(p, true, why) : nullptr;
  if (!bwd)
    return KernelResult::error("cuDNN fused attention cannot run this problem: ", why);
  char *next = static_cast<char *>(scratch);
  void *out = const_cast<void *>(o), *rows = const_cast<float *>(stats);
  void *in[3] = {const_cast<void *>(q), const_cast<void *>(k), const_cast<void *>(v)};
  float negInf = -std::numeric_limits<float>::infinity(), one = 1.0f;
  if (!stats) {
    // The forward's output and statistics recomputed into scratch.
    out = next;
    rows = next + alignUp(outputBytes(p));
    next += alignUp(outputBytes(p)) + alignUp(rowBytes(p));
  }
  char *rowDot = next;
  void *workspace = rowDot + alignUp(rowBytes(p));
  // (-inf, the mask's fill, is a graph input only where there is a mask.)
  auto withMask = [&](std::vector<int64_t> uids, std::vector<void *> pointers) {
    if (p.causal) {
      uids.push_back(kNegInf);
      pointers.push_back(&negInf);
    }
    return std::pair{std::move(uids), std::move(pointers)};
  };
  if (!stats) {
    auto [uids, pointers] =
        withMask({kQ, kK, kV, kO, kStats, kScale}, {in[0], in[1], in[2], out, rows, &scale});
    if (KernelResult r = execute(*fwd, uids, pointers, workspace, stream,
                                 "forward (recomputed for the backward)");
        !r.isOk())
      return r;
  }
  auto [uids, pointers] =
      withMask({kQ, kK, kV, kO, kGradO, kStats, kGradQ, kGradK, kGradV, kRowDot, kScale, kOne},
               {in[0], in[1], in[2], out, const_cast<void *>(g), rows, dq, dk, dv, rowDot, &scale,
                &one});
  return execute(*bwd, uids, pointers, workspace, stream, "backward");
}

} // namespace ptc::kernels::cuda::cudnn
