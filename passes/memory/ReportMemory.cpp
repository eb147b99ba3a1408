//===- ReportMemory.cpp - per-device memory report and budget check -------===//

#include "passes/memory/Passes.h"
#include "runtime/base/option_values.h"

#include "dialects/ptc/PtcMesh.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <set>

namespace mlir::ptc {
#define GEN_PASS_DEF_REPORTMEMORYPASS
#include "passes/memory/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::parseOption;
using ::ptc::OptimizerKind;
using ::ptc::Recompute;

namespace {
/// The gradient a parameter's update reads at `op`, or null: operand 1 of
/// the fused updates, operand 0 of the op that starts an update built from
/// primitive ops (Adafactor, `ptc.optimizer_grad`).
Value optimizerGradient(Operation *op) {
  Value g;
  if (auto update = dyn_cast<FusedUpdateOpInterface>(op))
    g = update.getGradMutable().get();
  else if (op->hasAttr(PtcDialect::kOptimizerGradAttrName))
    g = op->getOperand(0);
  // ZeRO-1 keeps the gradient whole and slices the update's shard from it
  // (under mixed precision, then widens the shard): the whole one is what
  // stays resident.
  if (g)
    if (auto widen = g.getDefiningOp<ConvertOp>())
      if (widen->getOperand(0).getDefiningOp<ShardSliceOp>())
        g = widen->getOperand(0);
  if (g)
    if (auto slice = g.getDefiningOp<ShardSliceOp>())
      g = slice->getOperand(0);
  return g;
}

/// Bytes of the host temporaries `op` defines (offload=optimizer): results of
/// host ops and transfers to the host, except updates written in place.
int64_t hostTemporaryBytes(Operation &op) {
  int64_t total = 0;
  if (isa<arith::ConstantOp>(op))
    return 0;
  for (Value r : op.getResults())
    if (isOnHost(r) && !isInPlaceUpdate(r))
      total += getTensorBytes(cast<RankedTensorType>(r.getType()));
  return total;
}

std::string human(double bytes) { return formatByteSize(bytes); }


struct Consumer {
  std::string what;
  int64_t bytes;
};

/// The staging buffer a collective needs (ptc-run allocates the largest one):
/// none for a bucket that sums in place.
int64_t stagingBytes(Operation &op) {
  if (auto reduce = dyn_cast<AllReduceOp>(op); reduce && isInPlaceAllReduce(reduce))
    return 0;
  return collectiveBufferBytes(op);
}

/// Bytes of the forward values (of ops `on` accepts) that the backward pass
/// Whether the backward pass may begin at `op`: a backward op, or the loss
/// computed with its gradient (ptc-fuse-cross-entropy-grad places it at the
/// loss where the loss is read before the backward pass; the gradient it
/// gives is the backward's first).
bool beginsBackward(Operation &op) {
  return op.hasAttr(PtcDialect::kBackwardAttrName) ||
         isa<CrossEntropyWithGradOp, VocabParallelCrossEntropyWithGradOp>(op);
}

/// (from `firstBackward` on, ops `on` accepts) reads.
int64_t savedActivationBytes(Block &block, Operation *firstBackward,
                             llvm::function_ref<bool(Operation *)> on) {
  int64_t total = 0;
  if (!firstBackward)
    return 0;
  for (Operation &op : block) {
    if (&op == firstBackward)
      break;
    if (isa<arith::ConstantOp>(op) || !on(&op))
      continue;
    // Low-precision copies of parameters are model state, not activations.
    if (auto convert = dyn_cast<ConvertOp>(op); convert && isa<BlockArgument>(convert.getInput()))
      continue;
    for (Value r : op.getResults())
      if (llvm::any_of(r.getUsers(), [&](Operation *u) {
            return (u == firstBackward || firstBackward->isBeforeInBlock(u)) && on(u);
          }))
        total += getTensorBytes(cast<RankedTensorType>(r.getType()));
  }
  return total;
}

/// The parameter a low-precision copy is made from: `v` through gathers and
/// narrowing converts, or null.
BlockArgument parameterBehind(func::FuncOp func, Value v) {
  while (true) {
    Operation *def = v.getDefiningOp();
    if (!def || !isa<ConvertOp, AllGatherOp>(def))
      break;
    v = def->getOperand(0);
  }
  auto arg = dyn_cast<BlockArgument>(v);
  return arg && (func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName) ||
                 func.getArgAttr(arg.getArgNumber(), PtcDialect::kWorkingCopyAttrName))
             ? arg
             : BlockArgument();
}

/// Bytes of the forward copies of parameters (converts and gathers, ops `on`
/// accepts, those `which` accepts) that the backward pass reads.
int64_t savedParameterCopyBytes(func::FuncOp func, Operation *firstBackward,
                                llvm::function_ref<bool(Operation *)> on,
                                llvm::function_ref<bool(Operation *)> which) {
  int64_t total = 0;
  if (!firstBackward)
    return 0;
  for (Operation &op : func.getBody().front()) {
    if (&op == firstBackward)
      break;
    if (!isa<ConvertOp, AllGatherOp>(op) || !on(&op) || !which(&op) ||
        !parameterBehind(func, op.getResult(0)))
      continue;
    auto type = cast<RankedTensorType>(op.getResult(0).getType());
    if (llvm::any_of(op.getResult(0).getUsers(), [&](Operation *u) {
          return (u == firstBackward || firstBackward->isBeforeInBlock(u)) && on(u);
        }))
      total += getTensorBytes(type);
  }
  return total;
}

int rankOf(Operation *op, int ranks) {
  auto stage = op->getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName);
  return !stage || stage.getInt() < 0 ? -1 : static_cast<int>(stage.getInt() % ranks);
}

} // namespace

DeviceMemory mlir::ptc::computeDeviceMemory(func::FuncOp func, int r, int ranks) {
  Block &block = func.getBody().front();
  DeviceMemory m;
  auto on = [&](Operation *op) {
    int k = rankOf(op, ranks);
    return k < 0 || k == r;
  };
  llvm::DenseSet<Value> here;
  for (Operation &op : block) {
    if (isa<func::ReturnOp>(op) || !on(&op))
      continue;
    for (Value v : op.getOperands())
      here.insert(v);
    for (Value v : op.getResults())
      here.insert(v);
  }
  for (BlockArgument arg : block.getArguments()) {
    unsigned i = arg.getArgNumber();
    auto stage = func.getArgAttrOfType<IntegerAttr>(i, PtcDialect::kStageAttrName);
    if (!(stage && stage.getInt() % ranks == r) && !here.contains(arg))
      continue;
    int64_t bytes = getTensorBytes(cast<RankedTensorType>(arg.getType()));
    if (isOnHost(arg)) {
      m.host += bytes;
      if (func.getArgAttr(i, PtcDialect::kParamAttrName))
        m.values += getNumElements(cast<RankedTensorType>(arg.getType()));
    } else if (func.getArgAttr(i, PtcDialect::kParamAttrName)) {
      m.params += bytes;
      m.values += getNumElements(cast<RankedTensorType>(arg.getType()));
    } else if (func.getArgAttr(i, PtcDialect::kStateAttrName)) {
      m.state += bytes;
    } else if (func.getArgAttr(i, PtcDialect::kWorkingCopyAttrName)) {
      m.params += bytes; // the parameters' bf16 / f16 copies, kept between steps
    } else {
      m.inputs += bytes;
    }
  }
  Operation *firstBackward = nullptr;
  for (Operation &op : block) {
    if (!firstBackward && beginsBackward(op))
      firstBackward = &op;
    if (auto cst = dyn_cast<arith::ConstantOp>(op)) // every rank holds the constants
      (isOnHost(cst) ? m.host : m.constants) += getTensorBytes(cast<RankedTensorType>(cst.getType()));
    if (!on(&op))
      continue;
    m.host += hostTemporaryBytes(op);
    if (Value g = optimizerGradient(&op))
      m.grads += getTensorBytes(cast<RankedTensorType>(g.getType()));
    m.comm = std::max(m.comm, stagingBytes(op));
  }
  // Forward values of this rank that its backward ops read (one micro-batch).
  m.activations = savedActivationBytes(block, firstBackward, on);
  // Low-precision copies only: an fp32 gather (ZeRO-3 without mixed precision)
  // is not a working copy.
  m.workingCopies = savedParameterCopyBytes(func, firstBackward, on, [](Operation *op) {
    return cast<RankedTensorType>(op->getResult(0).getType()).getElementType().getIntOrFloatBitWidth() < 32;
  });
  // The step's results another rank computes arrive here after each step.
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands()))
    if (!func.getResultAttr(i, PtcDialect::kUpdateAttrName) && !here.contains(v))
      m.received += getTensorBytes(cast<RankedTensorType>(v.getType()));
  if (auto perRank = func->getAttrOfType<DenseI64ArrayAttr>(kArenaBytesPerRankAttrName);
      perRank && r < static_cast<int>(perRank.size()))
    m.arena = perRank[r];
  else if (auto arena = func->getAttrOfType<IntegerAttr>(kArenaBytesAttrName); arena && ranks == 1)
    m.arena = arena.getInt();
  return m;
}

namespace {
struct ReportMemoryPass : mlir::ptc::impl::ReportMemoryPassBase<ReportMemoryPass> {
  /// For the standard GPT (parameters named transformer.h.<i>.*): the saved
  /// activations of one transformer layer by the formulas of Korthikanti et al.
  /// (Reducing Activation Recomputation in Large Transformer Models), adapted to
  /// what this graph keeps: no dropout masks, and attention scores recomputed
  /// by the fused causal attention (no 5as/h term).
  LogicalResult reportLayerActivations(func::FuncOp func, const MeshInfo *mesh,
                                       int64_t activationBytes) {
    Block &block = func.getBody().front();
    // The formula is the dense MLP's; MoE layers keep their dispatch buffers instead.
    if (!func.getOps<MoeDispatchOp>().empty())
      return success();
    std::set<std::string> layers;
    int64_t h = 0, b = 0, s = 0;
    int t = 1;
    bool sp = false;
    for (BlockArgument arg : block.getArguments()) {
      unsigned i = arg.getArgNumber();
      auto type = cast<RankedTensorType>(arg.getType());
      if (auto name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kParamAttrName)) {
        StringRef n = name.getValue();
        if (n.starts_with("transformer.h.") && n.ends_with(".ln_1.weight")) {
          layers.insert(n.str());
          // The hidden size is the global one (ZeRO-3 splits this weight over dp).
          h = type.getDimSize(0);
          if (Attribute spec = func.getArgAttr(i, PtcDialect::kShardingAttrName); spec && mesh)
            if (auto parsed = getSharding(spec, *mesh, 1, [&] { return func.emitError(); });
                succeeded(parsed) && parsed->dims[0].axis >= 0)
              h *= mesh->size(parsed->dims[0].axis);
        }
      } else if (auto input = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kInputAttrName);
                 input && input.getValue() == "tokens" && type.getRank() == 2) {
        b = type.getDimSize(0);
        s = type.getDimSize(1);
        if (Attribute spec = func.getArgAttr(i, PtcDialect::kShardingAttrName); spec && mesh)
          if (auto parsed = getSharding(spec, *mesh, 2, [&] { return func.emitError(); });
              succeeded(parsed) && parsed->dims[1].axis >= 0) {
            s *= mesh->size(parsed->dims[1].axis);
            sp = true;
          }
      }
    }
    if (layers.empty() || !h || !b)
      return success();
    if (mesh && mesh->axisIndex(MeshAxisRole::Tensor) >= 0)
      t = static_cast<int>(mesh->sizes[mesh->axisIndex(MeshAxisRole::Tensor)]);
    int64_t e = 4;
    func.walk([&](LayerNormOp ln) {
      e = (ln.getType().getElementTypeBitWidth() + 7) / 8;
      return WalkResult::interrupt();
    });
    // Korthikanti et al., in bytes at 2 bytes per element: sbh(10 + 24/t + 5as/(ht)) with tensor
    // parallelism, sbh(34/t + 5as/(ht)) with sequence parallelism; minus the dropout masks
    // (2 sbh, or 2 sbh / t) and the attention scores (the 5as/(ht) term).
    // Recomputation (ptc-recompute) changes what a layer keeps: selective drops
    // the attention output and the MLP's activated hidden state (5 sbh/t);
    // full keeps only the two LayerNorm inputs of the residual stream.
    Recompute recompute = Recompute::None;
    if (auto mode = func->getAttrOfType<StringAttr>("ptc.recompute"))
      recompute = parseOption<Recompute>(mode.getValue()).value_or(Recompute::None);
    double sbh = static_cast<double>(s) * static_cast<double>(b) * static_cast<double>(h);
    // Per mode: the coefficient of sbh (at 2 bytes a value) and its formula.
    auto perMode = [&](Recompute mode) -> std::pair<double, std::string> {
      if (mode == Recompute::Selective)
        return {sp ? 22.0 / t : 8.0 + 14.0 / t,
                sp ? "22 sbh/t (selective recompute)" : "sbh (8 + 14/t) (selective recompute)"};
      if (mode == Recompute::Full)
        return {sp ? 4.0 / t : 4.0, sp ? "4 sbh/t (full recompute)" : "4 sbh (full recompute)"};
      return {sp ? 32.0 / t : 8.0 + 24.0 / t, sp ? "32 sbh/t" : "sbh (8 + 24/t)"};
    };
    // recompute-layers: that many layers follow the mode, the others keep everything.
    int64_t recomputed = static_cast<int64_t>(layers.size());
    if (auto n = func->getAttrOfType<IntegerAttr>("ptc.recompute_layers"))
      recomputed = std::min<int64_t>(n.getInt(), recomputed);
    auto &os = llvm::outs();
    os << llvm::format("  activations per layer (Korthikanti et al.; s=%lld b=%lld h=%lld t=%d%s, "
                       "%lld-byte values, no dropout, attention scores recomputed): ",
                       static_cast<long long>(s), static_cast<long long>(b),
                       static_cast<long long>(h), t, sp ? " with SP" : "",
                       static_cast<long long>(e));
    int64_t layersBytes = 0;
    auto group = [&](Recompute mode, int64_t count, bool first) {
      auto [coeff, formula] = perMode(mode);
      double perLayer = coeff * sbh * static_cast<double>(e) / 2.0;
      double gathered =
          sp && mode != Recompute::Full ? 2.0 * sbh * (1.0 - 1.0 / t) * static_cast<double>(e) : 0.0;
      os << (first ? "" : "; ") << formula << " x " << e << "/2 = "
         << static_cast<int64_t>(perLayer) << " B";
      if (gathered > 0)
        os << " + " << static_cast<int64_t>(gathered)
           << " B of all-gathered inputs of the 2 column-parallel matmuls kept for backward "
              "(Megatron gathers them again)";
      os << "; x " << count << " layers";
      layersBytes += static_cast<int64_t>((perLayer + gathered) * count);
    };
    group(recompute, recomputed, true);
    if (recomputed < static_cast<int64_t>(layers.size()))
      group(Recompute::None, static_cast<int64_t>(layers.size()) - recomputed, false);
    // Attention's softmax statistics (ptc-save-attention-stats): 4 bytes per
    // query row and head, outside the formula (those of forwards recomputed
    // in the backward pass are not kept from the forward).
    int64_t statsBytes = 0;
    func.walk([&](Operation *op) {
      if (op->hasAttr("ptc.recomputed"))
        return;
      Value stats;
      if (auto a = dyn_cast<CausalAttentionOp>(op))
        stats = a.getStats();
      else if (auto a = dyn_cast<CausalAttentionQkvOp>(op))
        stats = a.getStats();
      else if (auto a = dyn_cast<RingAttentionOp>(op))
        stats = a.getStats();
      if (stats)
        statsBytes += getTensorBytes(cast<RankedTensorType>(stats.getType()));
    });
    os << " = " << layersBytes << " B, the other " << activationBytes - layersBytes
       << " B of saved activations are embeddings, the final LayerNorm and the logits";
    if (statsBytes)
      os << ", and attention's softmax statistics (" << statsBytes << " B)";
    os << "\n";
    return success();
  }

  using ReportMemoryPassBase::ReportMemoryPassBase;

  void runOnOperation() override {
    // params=nan printed nothing, params=-1 reported on the IR, dp=0 "on 0
    // data-parallel devices": every estimate option is checked first.
    if (!std::isfinite(params) || params < 0) {
      getOperation().emitError() << "params=" << llvm::formatv("{0}", params.getValue()).str()
                                 << " must be a finite number of parameters >= 0 (0: the IR)";
      return signalPassFailure();
    }
    for (auto [name, value] : {std::pair<const char *, int>{"dp", dp}, {"tp", tp}, {"pp", pp}})
      if (value < 1) {
        getOperation().emitError() << name << "=" << value << " must be at least 1";
        return signalPassFailure();
      }
    if (params > 0) {
      estimate();
      return;
    }
    std::optional<double> budget;
    if (!deviceMemory.empty()) {
      FailureOr<double> parsed = parseByteSize(deviceMemory);
      if (failed(parsed)) {
        getOperation().emitError() << "device-memory '" << deviceMemory
                                   << "' is not a size such as 80GB or 512MiB";
        return signalPassFailure();
      }
      budget = *parsed;
    }
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && func->hasAttr(kArenaBytesAttrName) &&
          failed(report(func, budget)))
        return signalPassFailure();
  }

  /// The ZeRO paper's model-state bytes per device (Rajbhandari et al., Fig. 1).
  void estimate() {
    const int split = std::max<int>(1, tp) * std::max<int>(1, pp);
    double psi = params / split, nd = std::max<int>(1, dp);
    double p = fp32 ? 4 : 2, g = fp32 ? 4 : 2, k = fp32 ? 8 : 12;
    llvm::raw_ostream &os = llvm::outs();
    os << "ZeRO model-state memory per device for " << llvm::format("%g", params.getValue())
       << " parameters";
    if (split > 1)
      os << " split evenly over tp=" << tp << " x pp=" << pp << " ("
         << llvm::format("%g", psi) << " per device)";
    os << " on " << dp << " data-parallel devices (" << (fp32 ? "fp32" : "mixed-precision")
       << " AdamW: " << llvm::format("%g + %g + %g", p, g, k) << " bytes per parameter):\n";
    double stages[4] = {(p + g + k) * psi, (p + g) * psi + k * psi / nd, p * psi + (g + k) * psi / nd,
                        (p + g + k) * psi / nd};
    const char *names[4] = {"zero=0 (baseline)", "zero=1 (optimizer state)",
                            "zero=2 (+ gradients)", "zero=3 (+ parameters)"};
    for (int i = 0; i < 4; ++i)
      os << llvm::format("  %-26s %10.2f GB\n", names[i], stages[i] / 1e9);
    os << "  (model state only: activations, sequence parallelism, recomputation and uneven "
          "stages need the shapes; compile them with report-memory=true, e.g. ptc-model llama "
          "--preset llama3-70b ... | ptc-opt --ptc-compile=\"mesh=pp:8,tp:8,dp:16 ... "
          "report-memory=true\")\n";
    os.flush();
  }

  /// The report of a pipelined step: every pipeline rank's own memory, and the
  /// largest as the verdict.
  LogicalResult reportPipelined(func::FuncOp func, int ranks, std::optional<double> budget) {
    llvm::raw_ostream &os = llvm::outs();
    FailureOr<MeshInfo> mesh = getEnclosingMesh(getOperation());
    os << "ptc-report-memory @" << func.getSymName() << " (per device, per pipeline rank";
    if (succeeded(mesh))
      for (auto [a, s] : llvm::zip(mesh->axes, mesh->sizes))
        os << ", " << a << "=" << s;
    os << ")\n";
    os << llvm::format("  %-4s %14s %14s %14s %14s %14s %14s %14s %14s", "rank", "parameters",
                       "gradients", "optim. state", "inputs+const", "saved act.", "communication",
                       "arena", "peak");
    bool offloaded = false;
    for (BlockArgument arg : func.getArguments())
      offloaded |= isOnHost(arg);
    if (offloaded)
      os << llvm::format(" %14s", "host (offload)");
    os << "\n";
    int worst = 0;
    int64_t worstPeak = -1;
    std::vector<DeviceMemory> all;
    for (int r = 0; r < ranks; ++r) {
      DeviceMemory m = computeDeviceMemory(func, r, ranks);
      all.push_back(m);
      os << llvm::format("  %-4d %14lld %14lld %14lld %14lld %14lld %14lld %14lld %14lld", r,
                         static_cast<long long>(m.params), static_cast<long long>(m.grads),
                         static_cast<long long>(m.state),
                         static_cast<long long>(m.inputs + m.constants + m.received),
                         static_cast<long long>(m.activations), static_cast<long long>(m.comm),
                         static_cast<long long>(m.arena), static_cast<long long>(m.peak()));
      if (offloaded)
        os << llvm::format("%15lld", static_cast<long long>(m.host));
      os << "\n";
      if (m.peak() > worstPeak) {
        worstPeak = m.peak();
        worst = r;
      }
    }
    const DeviceMemory &w = all[static_cast<size_t>(worst)];
    os << "  predicted peak " << worstPeak << " B (" << human(static_cast<double>(worstPeak))
       << ") on pipeline rank " << worst << ": parameters " << human(static_cast<double>(w.params))
       << " (" << w.values << " values), optimizer state " << human(static_cast<double>(w.state))
       << ", arena " << human(static_cast<double>(w.arena))
       << (w.host ? ", offloaded to host memory " + human(static_cast<double>(w.host)) + " (not in the peak)" : std::string())
       << " (gradients and saved activations of one micro-batch live in the arena; values "
          "waiting between micro-batches are the activation stash, which ptc-export-plan "
          "predicts per rank when a plan is written)\n";
    os.flush();
    if (budget && static_cast<double>(worstPeak) > *budget)
      return func.emitError() << "predicted peak " << human(static_cast<double>(worstPeak))
                              << " on pipeline rank " << worst << " exceeds the device memory "
                              << describeByteSize(deviceMemory) << " (parameters " << human(static_cast<double>(w.params))
                              << ", optimizer state " << human(static_cast<double>(w.state))
                              << ", arena " << human(static_cast<double>(w.arena)) << ")";
    return success();
  }

  LogicalResult report(func::FuncOp func, std::optional<double> budget) {
    if (auto pipeline = func->getAttrOfType<DictionaryAttr>(PtcDialect::kPipelineAttrName)) {
      int ranks = static_cast<int>(cast<IntegerAttr>(pipeline.get("ranks")).getInt());
      if (ranks > 1)
        return reportPipelined(func, ranks, budget);
    }
    Block &block = func.getBody().front();
    std::vector<Consumer> consumers;
    int64_t paramBytes = 0, stateBytes = 0, inputBytes = 0, constBytes = 0, gradBytes = 0,
            activationBytes = 0, commBytes = 0, localParams = 0, perParamStateBytes = 0,
            hostBytes = 0;
    for (BlockArgument arg : block.getArguments()) {
      auto type = cast<RankedTensorType>(arg.getType());
      int64_t bytes = getTensorBytes(type);
      unsigned i = arg.getArgNumber();
      if (isOnHost(arg)) {
        hostBytes += bytes;
        if (func.getArgAttr(i, PtcDialect::kParamAttrName))
          localParams += getNumElements(type);
      } else if (auto name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kParamAttrName)) {
        paramBytes += bytes;
        localParams += getNumElements(type);
        consumers.push_back({"parameter '" + name.str() + "'", bytes});
      } else if (auto name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kStateAttrName)) {
        stateBytes += bytes;
        if (type.getRank() > 0) // the step counter is not per-parameter state
          perParamStateBytes += bytes;
        consumers.push_back({"optimizer state '" + name.str() + "'", bytes});
      } else {
        inputBytes += bytes;
      }
    }
    Operation *firstBackward = nullptr;
    llvm::DenseSet<Value> grads;
    bool adamw = false;
    for (Operation &op : block) {
      if (!firstBackward && beginsBackward(op))
        firstBackward = &op;
      if (auto cst = dyn_cast<arith::ConstantOp>(op))
        (isOnHost(cst) ? hostBytes : constBytes) += getTensorBytes(cast<RankedTensorType>(cst.getType()));
      hostBytes += hostTemporaryBytes(op);
      if (Value g = optimizerGradient(&op))
        grads.insert(g);
      if (auto update = dyn_cast<FusedUpdateOpInterface>(op))
        adamw |= parseOption<OptimizerKind>(update.getOptimizerName()) == OptimizerKind::AdamW;
      commBytes = std::max(commBytes, stagingBytes(op));
    }
    for (Value g : grads)
      gradBytes += getTensorBytes(cast<RankedTensorType>(g.getType()));
    activationBytes = savedActivationBytes(block, firstBackward, [](Operation *) { return true; });
    // Of those, gathered parameters (or their low-precision copies) that the
    // backward pass reads again: ZeRO-1/2 with sharded master weights gather
    // each bf16 copy once per step and keep it whole.
    int64_t gatheredParamBytes = savedParameterCopyBytes(
        func, firstBackward, [](Operation *) { return true; },
        [](Operation *op) { return isa<AllGatherOp>(op); });
    int64_t arena = func->getAttrOfType<IntegerAttr>(kArenaBytesAttrName).getInt();
    int64_t peak = paramBytes + stateBytes + inputBytes + constBytes + arena + commBytes;

    llvm::raw_ostream &os = llvm::outs();
    FailureOr<MeshInfo> mesh = getEnclosingMesh(getOperation());
    os << "ptc-report-memory @" << func.getSymName() << " (per device";
    if (succeeded(mesh))
      for (auto [a, s] : llvm::zip(mesh->axes, mesh->sizes))
        os << ", " << a << "=" << s;
    os << ")\n";
    auto line = [&](const char *what, int64_t bytes, StringRef note = "") {
      os << llvm::format("  %-20s %14lld B  %12s", what, static_cast<long long>(bytes),
                         human(static_cast<double>(bytes)).c_str());
      if (!note.empty())
        os << "  " << note;
      os << "\n";
    };
    line("parameters", paramBytes,
         (Twine(localParams) + " values" + (hostBytes ? ", in host memory (offloaded)" : "")).str());
    line("gradients", gradBytes,
         hostBytes ? "inputs of the optimizer updates (copied to host memory for the update)"
                   : "inputs of the optimizer updates (in the arena)");
    line("optimizer state", stateBytes);
    line("inputs, constants", inputBytes + constBytes);
    line("saved activations", activationBytes,
         gatheredParamBytes > 0
             ? (Twine("forward values read by the backward pass (in the arena), of which ") +
                Twine(gatheredParamBytes) + " B are gathered parameters kept for it")
                   .str()
             : std::string("forward values read by the backward pass (in the arena)"));
    line("communication", commBytes, "largest collective buffer");
    line("arena", arena, "all temporaries, reused by lifetime");
    line("predicted peak", peak, "parameters + state + inputs + constants + arena + communication");
    if (hostBytes > 0)
      line("host (offloaded)", hostBytes,
           "fp32 master weights, optimizer state and the update's temporaries in host memory, "
           "not in the peak");
    {
      // The peak by kind: model states (what ZeRO divides), the activations
      // the backward pass reads, and buffers (communication and the arena's
      // other temporaries; gradients and activations share the arena over
      // time, so this is what the arena holds beyond both at once).
      int64_t states = (hostBytes ? 0 : paramBytes + stateBytes) + gradBytes;
      int64_t buffers = commBytes + std::max<int64_t>(0, arena - gradBytes - activationBytes);
      os << "  by kind: model states " << states << " B (" << human(static_cast<double>(states))
         << ": parameters, gradients, optimizer state" << (hostBytes ? " on the device" : "")
         << "), activations " << activationBytes << " B (" << human(static_cast<double>(activationBytes))
         << "), buffers " << buffers << " B (" << human(static_cast<double>(buffers))
         << ": communication and other temporaries); gradients and activations take turns in "
            "the arena, so the three can add up to more than the peak\n";
    }

    // The ZeRO paper's model state for fp32 AdamW, where it applies (no tp,
    // no experts split over ep).
    auto hasAxis = [&](MeshAxisRole role) {
      return succeeded(mesh) && mesh->axisIndex(role) >= 0 && mesh->sizes[mesh->axisIndex(role)] > 1;
    };
    bool hasTp = hasAxis(MeshAxisRole::Tensor);
    // Mixture of experts: the expert parameters on this device and the
    // dispatch buffers (one per MoE layer and direction: dispatch, combine,
    // and their gradients, each moved by an all_to_all under ep).
    int64_t expertBytes = 0, expertLocal = 0, experts = 0, moeLayers = 0, bufferBytes = 0;
    for (BlockArgument arg : block.getArguments())
      if (auto e = func.getArgAttrOfType<IntegerAttr>(arg.getArgNumber(), PtcDialect::kExpertsAttrName)) {
        expertBytes += getTensorBytes(cast<RankedTensorType>(arg.getType()));
        experts = e.getInt();
        expertLocal = cast<RankedTensorType>(arg.getType()).getDimSize(0);
      }
    for (MoeDispatchOp d : func.getOps<MoeDispatchOp>()) {
      ++moeLayers;
      bufferBytes = std::max(bufferBytes, getTensorBytes(d.getType()));
    }
    if (moeLayers > 0)
      os << "  experts: " << expertBytes << " B of expert parameters on this device (" << expertLocal
         << " of " << experts << " experts per layer" << (hasAxis(MeshAxisRole::Expert) ? ", split over ep" : "")
         << "), dispatch buffers " << bufferBytes << " B per MoE layer and direction ("
         << moeLayers << " layers x 4: dispatch, combine and their gradients)\n";
    if (adamw && !hasTp && !hostBytes && !(moeLayers > 0 && hasAxis(MeshAxisRole::Expert))) {
      int64_t psi = 0;
      for (BlockArgument arg : block.getArguments())
        if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName)) {
          int64_t n = getNumElements(cast<RankedTensorType>(arg.getType()));
          if (Attribute spec = func.getArgAttr(arg.getArgNumber(), PtcDialect::kShardingAttrName);
              spec && succeeded(mesh))
            if (auto parsed = getSharding(spec, *mesh,
                                          cast<RankedTensorType>(arg.getType()).getRank(),
                                          [&] { return func.emitError(); });
                succeeded(parsed))
              for (const DimShard &d : parsed->dims)
                if (d.axis >= 0)
                  n *= mesh->size(d.axis);
          psi += n;
        }
      int dpSize = succeeded(mesh) && mesh->axisIndex(MeshAxisRole::Data) >= 0 ? mesh->sizes[mesh->axisIndex(MeshAxisRole::Data)] : 1;
      os << "  ZeRO formula (fp32 AdamW, 4 + 4 + 8 bytes x " << psi << " parameters, dp=" << dpSize
         << "): params " << paramBytes << " B = 4 psi" << (paramBytes * dpSize == 4 * psi && dpSize > 1 ? " / dp" : "")
         << ", optimizer state " << perParamStateBytes << " B = 8 psi"
         << (perParamStateBytes * dpSize == 8 * psi && dpSize > 1 ? " / dp" : "") << ", gradients " << gradBytes
         << " B = ";
      // Gradients stay whole at stages 0 and 1 (2 bytes each in bf16 / f16),
      // are sharded at stages 2 and 3.
      if (gradBytes * dpSize == 4 * psi && dpSize > 1)
        os << "4 psi / dp";
      else if (gradBytes == 2 * psi)
        os << "2 psi (whole, low precision)";
      else if (gradBytes * dpSize == 2 * psi && dpSize > 1)
        os << "2 psi / dp";
      else
        os << llvm::format("%.3g psi", static_cast<double>(gradBytes) / static_cast<double>(psi));
      os << "\n";
    }
    if (failed(reportLayerActivations(func, succeeded(mesh) ? &*mesh : nullptr,
                                      activationBytes - gatheredParamBytes)))
      return failure();
    // Mixed precision: low-precision working copies of the fp32 master weights.
    int64_t copyBytes = 0, keptBytes = 0;
    std::string copyType;
    for (BlockArgument arg : block.getArguments()) {
      if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kWorkingCopyAttrName)) {
        auto type = cast<RankedTensorType>(arg.getType());
        keptBytes += getTensorBytes(type);
        if (copyType.empty())
          llvm::raw_string_ostream(copyType) << type.getElementType() << " ";
      }
      if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kParamAttrName))
        for (Operation *user : arg.getUsers())
          if (auto convert = dyn_cast<ConvertOp>(user)) {
            copyBytes += getTensorBytes(convert.getType());
            if (copyType.empty())
              llvm::raw_string_ostream(copyType) << convert.getType().getElementType() << " ";
          }
    }
    if (keptBytes > 0)
      os << "  mixed precision: " << copyType << "working copies of the parameters " << keptBytes
         << " B kept between steps (2 bytes each, with the parameters; written by the update, "
            "ptc-keep-working-copies)"
         << (copyBytes > 0 ? ", " + std::to_string(copyBytes) + " B more converted every step"
                           : std::string())
         << "; master weights, gradients and AdamW state stay fp32\n";
    if (copyBytes > 0 && hostBytes > 0)
      os << "  mixed precision + offload: " << copyType << "working copies of the parameters "
         << copyBytes << " B (2 bytes each, converted on the host from the fp32 master weights "
         << "and copied to the device every step, in the arena); gradients cross to the host "
            "in "
         << copyType << "and are widened there\n";
    else if (copyBytes > 0 && keptBytes == 0)
      os << "  mixed precision: " << copyType << "working copies of the parameters " << copyBytes
         << " B (2 bytes each, in the arena, converted from the fp32 master weights every step); "
            "master weights, gradients and AdamW state stay fp32 (4 + 4 + 8 bytes per parameter, "
            "the 16 of the ZeRO paper's 2 + 2 + 12 in another split)\n";
    os.flush();

    if (budget && static_cast<double>(peak) > *budget) {
      consumers.push_back({"the arena of temporaries", arena});
      llvm::sort(consumers, [](const Consumer &a, const Consumer &b) { return a.bytes > b.bytes; });
      InFlightDiagnostic diag = func.emitError()
                                << "predicted peak " << human(static_cast<double>(peak))
                                << " per device exceeds the device memory " << describeByteSize(deviceMemory)
                                << "; largest consumers:";
      for (size_t i = 0; i < std::min<size_t>(5, consumers.size()); ++i)
        diag << (i ? ", " : " ") << consumers[i].what << " (" << human(consumers[i].bytes) << ")";
      return failure();
    }
    return success();
  }
};
} // namespace

std::string mlir::ptc::formatByteSize(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format(u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return s;
}

/// "80GB", "512MiB", "1e9" -> bytes (GB = 1e9, GiB = 2^30).
std::string mlir::ptc::describeByteSize(StringRef text) {
  FailureOr<double> bytes = parseByteSize(text);
  if (failed(bytes) || text.ends_with("iB"))
    return text.str();
  return text.str() + " (" + formatByteSize(*bytes) + ")";
}

FailureOr<double> mlir::ptc::parseByteSize(StringRef text) {
  StringRef number = text.take_while([](char c) { return isdigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+'; });
  StringRef unit = text.drop_front(number.size()).trim();
  double value;
  if (number.getAsDouble(value) || value <= 0)
    return failure();
  static const std::pair<const char *, double> units[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (auto [name, scale] : units)
    if (unit == name)
      return value * scale;
  return failure();
}

