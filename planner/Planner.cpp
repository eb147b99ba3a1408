//===- Planner.cpp - probes, the cost model and the search -----------------===//

#include "planner/Planner.h"

#include "planner/CostModel.h"
#include "planner/ModelBlocks.h"

#include "dialects/ptc/PtcMesh.h"
#include "dialects/ptc/PtcOps.h"
#include "passes/Passes.h"
#include "passes/analysis/ModelStatistics.h"
#include "passes/memory/Passes.h"
#include "runtime/plan/pipeline_segments.h"
#include "runtime/plan/plan_loader.h"
#include "runtime/schedule/schedule.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FileUtilities.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <functional>
#include <chrono>
#include <cmath>
#include <sstream>
#include <set>
#include <tuple>

using namespace mlir;
using namespace mlir::ptc;

namespace ptc::planner {

namespace {
/// One ptc-compile option a layout sets: its spelling and value (the text
/// ptc-plan prints, the probes' cache key) and the same value set on the
/// typed options (what the probes compile with), side by side.
struct LayoutOption {
  std::string name, value;
  std::function<void(CompilePipelineOptions &)> set;
};

std::vector<LayoutOption> layoutOptions(const Layout &l, Precision precision) {
  std::vector<LayoutOption> out;
  std::string mesh;
  auto axis = [&](MeshAxisRole role, int64_t n) {
    if (n > 1)
      mesh += (mesh.empty() ? "" : ",") + meshAxisName(role).str() + ":" + std::to_string(n);
  };
  // Major to minor: pipeline stages across nodes, tensor parallelism fastest.
  axis(MeshAxisRole::Pipeline, l.pp);
  axis(MeshAxisRole::Data, l.dp);
  axis(MeshAxisRole::Expert, l.ep);
  axis(MeshAxisRole::Context, l.cp);
  axis(MeshAxisRole::Tensor, l.tp);
  if (!mesh.empty())
    out.push_back({"mesh", mesh, [mesh](CompilePipelineOptions &o) { o.mesh = mesh; }});
  if (l.cp > 1 && l.cpAttention != CpAttention::Ring) {
    std::string name(optionName(l.cpAttention));
    out.push_back({"cp-attention", name, [name](CompilePipelineOptions &o) { o.cpAttention = name; }});
  }
  if (l.microbatches > 1 || l.pp > 1) {
    const int64_t n = l.microbatches;
    out.push_back({"microbatches", std::to_string(n),
                   [n](CompilePipelineOptions &o) { o.microbatches = n; }});
  }
  if (l.pp > 1) {
    std::string name(optionName(l.schedule));
    out.push_back({"schedule", name, [name](CompilePipelineOptions &o) { o.schedule = name; }});
    if (l.virtualStages > 1) {
      const int v = static_cast<int>(l.virtualStages);
      out.push_back({"virtual-stages", std::to_string(v),
                     [v](CompilePipelineOptions &o) { o.virtualStages = v; }});
    }
  }
  if (l.sequenceParallel)
    out.push_back({"sequence-parallel", "true",
                   [](CompilePipelineOptions &o) { o.sequenceParallel = true; }});
  if (l.zero > 0) {
    const int z = l.zero;
    out.push_back({"zero", std::to_string(z), [z](CompilePipelineOptions &o) { o.zero = z; }});
  }
  if (l.recompute != Recompute::None) {
    std::string name(optionName(l.recompute));
    out.push_back({"recompute", name, [name](CompilePipelineOptions &o) { o.recompute = name; }});
  }
  if (precision != Precision::Fp32) {
    std::string name(optionName(precision));
    out.push_back({"precision", name, [name](CompilePipelineOptions &o) { o.precision = name; }});
  }
  return out;
}
} // namespace

std::string Layout::compileOptions(Precision precision) const {
  std::string text;
  for (const LayoutOption &o : layoutOptions(*this, precision))
    text += (text.empty() ? "" : " ") + o.name + "=" + o.value;
  return text;
}

void Layout::applyTo(CompilePipelineOptions &options, Precision precision) const {
  for (const LayoutOption &o : layoutOptions(*this, precision))
    o.set(options);
}

std::string Layout::describe() const {
  std::ostringstream os;
  os << "dp" << dp;
  if (ep > 1)
    os << " ep" << ep;
  if (cp > 1)
    os << " cp" << cp << (cpAttention == CpAttention::Ring ? "" : "u");
  os << " tp" << tp << " pp" << pp;
  if (virtualStages > 1)
    os << "x" << virtualStages;
  os << " mb" << microBatch << "x" << microbatches;
  if (sequenceParallel)
    os << " sp";
  if (zero)
    os << " z" << zero;
  if (recompute != Recompute::None)
    os << " rc:" << (recompute == Recompute::Selective ? "sel" : optionName(recompute));
  if (pp > 1)
    os << " " << (schedule == schedule::ScheduleKind::Interleaved1F1B ? "int" : optionName(schedule));
  return os.str();
}

namespace {
/// A rank's memory figures (bytes) that extrapolate linearly with depth.
struct RankBytes {
  double peak = 0, modelState = 0, activations = 0;
  static RankBytes of(const DeviceMemory &m) {
    return {static_cast<double>(m.peak()),
            static_cast<double>(m.params + m.grads + m.state + m.workingCopies),
            static_cast<double>(m.activations)};
  }
  RankBytes plus(const RankBytes &o, double k) const {
    return {peak + k * o.peak, modelState + k * o.modelState, activations + k * o.activations};
  }
  RankBytes scaled(double k) const { return {peak * k, modelState * k, activations * k}; }
};

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0)
      d.push_back(i);
  return d;
}

template <typename T> bool allowed(const std::vector<T> &list, T v) {
  return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
}
} // namespace

struct Planner::Impl {
  MLIRContext &context;
  ModelSpec model;
  const Cluster &cluster;
  SearchSpace space;
  Pricer price;
  int64_t probes = 0;
  OwningOpRef<ModuleOp> fileModule;

  struct Probe {
    std::map<int, Costs> costs;                   // per chunk
    std::vector<DeviceMemory> memory;             // per pipeline rank
    /// Per pipeline rank, the exported plan's predicted peak with the
    /// activation stash (probes that export their plan).
    std::vector<double> planPeak;
    double forwardModelFlops = 0; // unsharded forward matmul + attention FLOPs
    std::string error;            // the compiler's diagnostic when the layout is refused
  };
  std::map<std::string, Probe> cache;
  std::map<std::tuple<schedule::ScheduleKind, int64_t, int64_t, int64_t>, schedule::Pipeline> pipelines;

  Impl(MLIRContext &c, ModelSpec m, const Cluster &cl, SearchSpace s)
      : context(c), model(std::move(m)), cluster(cl), space(std::move(s)),
        price(cl, cl.ranksPerNode(space.devices)) {}

  /// A model file's first input: its batch (dimension 0) and its elements
  /// (the tokens of a language model's step).
  std::pair<int64_t, int64_t> fileInput() {
    if (!fileModule)
      return {0, 0};
    for (auto func : fileModule->getOps<func::FuncOp>())
      for (BlockArgument arg : func.getArguments())
        if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName)) {
          auto type = cast<RankedTensorType>(arg.getType());
          return {type.getDimSize(0), getNumElements(type)};
        }
    return {0, 0};
  }
  int64_t fileBatch() { return fileInput().first; }

  /// The sequence length: the builder's, or a file's first input's
  /// dimension 1 ([batch, seq]).
  int64_t sequenceLength() {
    if (model.kind != ModelSource::File)
      return model.seq();
    if (fileModule)
      for (auto func : fileModule->getOps<func::FuncOp>())
        for (BlockArgument arg : func.getArguments())
          if (func.getArgAttr(arg.getArgNumber(), PtcDialect::kInputAttrName)) {
            auto type = cast<RankedTensorType>(arg.getType());
            return type.getRank() >= 2 ? type.getDimSize(1) : 0;
          }
    return 0;
  }

  /// Whether the search tries context parallelism of size `cp`: the listed
  /// sizes, or by default those leaving each rank kMinCpChunk tokens or more.
  bool cpAllowed(int64_t cp) {
    if (!space.cp.empty())
      return allowed(space.cp, cp);
    int64_t seq = sequenceLength();
    return cp == 1 || (seq % cp == 0 && seq / cp >= kMinCpChunk);
  }

  /// The file's repeated blocks, when it has them (probes cut to a few).
  std::optional<FileBlocks> fileBlocks;

  /// Blocks per chunk of a file layout whose probes are cut to two and three
  /// blocks per chunk and extrapolated (0: compile the whole file).
  int64_t fileBlocksPerChunk(const Layout &l) const {
    int64_t chunks = l.pp * l.virtualStages;
    if (!fileBlocks || fileBlocks->layers % chunks != 0 || fileBlocks->layers / chunks < 4)
      return 0;
    return fileBlocks->layers / chunks;
  }

  llvm::Expected<OwningOpRef<ModuleOp>> buildModel(int64_t layers, int64_t batch) {
    if (model.kind == ModelSource::File) {
      if (layers > 0 && fileBlocks) {
        OwningOpRef<ModuleOp> cut = truncateBlocks(*fileModule, *fileBlocks, layers);
        if (cut)
          return std::move(cut);
        return llvm::createStringError("cannot cut '" + model.file + "' to " +
                                       std::to_string(layers) + " of its blocks");
      }
      return OwningOpRef<ModuleOp>(cast<ModuleOp>(fileModule->getOperation()->clone()));
    }
    if (model.kind == ModelSource::Gpt) {
      GptConfig c = model.gpt;
      c.layers = layers;
      c.batch = batch;
      return buildGptModel(context, c);
    }
    LlamaConfig c = model.llama;
    c.layers = layers;
    c.batch = batch;
    return buildLlamaModel(context, c);
  }

  /// Compiles the model at `layers` layers and `batch` sequences with
  /// ptc-compile `options` (cached). `accumulates`: one micro-batch of a
  /// layout that accumulates gradients over several (its updates read the
  /// f32 sums, not the micro-batch's bf16 gradients: the probe keeps their
  /// conversions, which the accumulating plan runs every micro-batch).
  /// `exportPlan`: the plan is written too, loaded as ptc-run loads it, and
  /// each pipeline rank's peak with its activation stash read from it (the
  /// figures ptc-opt prints and refuses a layout by).
  const Probe &probe(int64_t layers, int64_t batch, const Layout &layout, int pp,
                     bool accumulates = false, bool exportPlan = false) {
    const std::string options = layout.compileOptions(space.precision);
    std::string key = std::to_string(layers) + "|" + std::to_string(batch) + "|" + options +
                      (accumulates ? "|accumulates" : "") + (exportPlan ? "|plan" : "");
    auto it = cache.find(key);
    if (it != cache.end())
      return it->second;
    Probe &p = cache[key];
    ++probes;
    auto module = buildModel(layers, batch);
    if (!module) {
      p.error = llvm::toString(module.takeError());
      return p;
    }
    func::FuncOp func;
    for (auto f : (**module).getOps<func::FuncOp>())
      func = f;
    p.forwardModelFlops = computeModelStatistics(func).forwardFlops;
    SmallString<128> planPath;
    std::optional<llvm::FileRemover> removePlan;
    if (exportPlan) {
      if (std::error_code ec = llvm::sys::fs::createTemporaryFile("ptc-plan-probe", "plan", planPath)) {
        p.error = "cannot create a temporary plan file: " + ec.message();
        return p;
      }
      removePlan.emplace(planPath);
    }
    std::string diagnostics;
    {
      ScopedDiagnosticHandler handler(&context, [&](Diagnostic &d) {
        if (d.getSeverity() == DiagnosticSeverity::Error && diagnostics.empty())
          diagnostics = d.str();
        return success();
      });
      PassManager pm(&context);
      // The layout's options typed, then the job's own (text as the user
      // gave them; theirs win where both set one, as on ptc-opt's line).
      auto opts = std::make_unique<CompilePipelineOptions>();
      layout.applyTo(*opts, space.precision);
      std::string program = space.compileOptions;
      if (program.rfind("optimizer=", 0) != 0 && program.find(" optimizer=") == std::string::npos)
        program += " optimizer=" + std::string(optionName(space.optimizer));
      if (failed(opts->parseFromString(program))) {
        p.error = "cannot parse ptc-compile options '" + program + "'";
        return p;
      }
      opts->fuseGradientWidening = !accumulates;
      if (exportPlan)
        opts->plan = planPath.str().str();
      buildCompilePipeline(pm, *opts);
      if (failed(pm.run(**module))) {
        p.error = diagnostics.empty() ? "the compiler refused it" : diagnostics;
        return p;
      }
    }
    for (auto f : (**module).getOps<func::FuncOp>())
      func = f;
    p.costs = aggregate(func, price);
    for (int r = 0; r < pp; ++r)
      p.memory.push_back(computeDeviceMemory(func, r, pp));
    if (exportPlan) {
      auto loaded = ::ptc::LoadedPlan::loadFile(planPath.str().str());
      if (!loaded.isOk()) {
        p.error = "the compiled plan does not load: " + loaded.status().message();
        return p;
      }
      const ::ptc::LoadedPlan &plan = **loaded;
      for (int r = 0; r < pp; ++r) {
        int64_t stash = 0;
        if (plan.pipelined()) {
          auto segments = ::ptc::derivePipelineSegments(plan, r);
          if (!segments.isOk()) {
            p.error = "pipeline rank " + std::to_string(r) + ": " + segments.status().message();
            return p;
          }
          stash = ::ptc::simulateStashPeak(plan, *segments, r);
        }
        p.planPeak.push_back(static_cast<double>(::ptc::predictedPeakBytes(plan, r) + stash));
      }
    }
    return p;
  }

  /// The layout a probe compiles: `l`, or without pipeline stages.
  static Layout probeLayout(const Layout &l, bool withPipeline) {
    Layout q = l;
    if (!withPipeline) {
      q.pp = 1;
      q.microbatches = 1;
      q.virtualStages = 1;
    }
    return q;
  }

  /// How a group of `size` devices `stride` ranks apart is linked.
  const Link &linkFor(int64_t stride, int64_t size) const {
    return stride * size <= cluster.ranksPerNode(space.devices) ? cluster.intraNode : cluster.interNode;
  }

  double collectiveSeconds(const CollKey &k, const Collective &c, const Layout &l) const {
    auto [mask, kind] = k;
    // Ranks are numbered pp, dp, ep, cp, tp (tp fastest): the group of the
    // axes in `mask` has p members and spans `extent` consecutive ranks.
    struct Axis {
      MeshAxisRole role;
      int64_t size;
    } order[] = {{MeshAxisRole::Tensor, l.tp}, {MeshAxisRole::Context, l.cp}, {MeshAxisRole::Expert, l.ep},
                 {MeshAxisRole::Data, l.dp}, {MeshAxisRole::Pipeline, l.pp}};
    int64_t p = 1, stride = 1, extent = 1;
    for (const Axis &a : order) {
      if (mask & roleBit(a.role)) {
        p *= a.size;
        extent = stride * a.size;
      }
      stride *= a.size;
    }
    if (p <= 1)
      return 0;
    const Link &link = extent <= cluster.ranksPerNode(space.devices) ? cluster.intraNode : cluster.interNode;
    double n = static_cast<double>(p);
    double factor = kind == kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
    double steps = kind == kAllReduce ? 2 * (n - 1) : (n - 1);
    double seconds = c.count * steps * link.latency + factor * c.bytes / link.busBandwidth;
    // An all-reduce may run as a tree instead (NCCL picks it for small
    // messages on many ranks): 2 log2(p) steps, the whole message up and down.
    if (kind == kAllReduce)
      seconds = std::min(seconds, c.count * 2 * std::ceil(std::log2(n)) * link.latency + 2 * c.bytes / link.busBandwidth);
    // Oversubscribed ranks (CPU) wait for a core before they can progress a collective.
    return seconds * price.slowdown;
  }

  /// Ring attention's transfers (each cp rank to the next, tp ranks apart;
  /// the ring's slowest link bounds it) and what of them stays exposed: all
  /// of it where the cluster does not overlap communication with compute
  /// (CPU ranks), else what the attention blocks do not hide.
  double ringSeconds(const PhaseCost &pc, const Layout &l) const {
    if (pc.ring.count <= 0)
      return 0;
    const Link &link = linkFor(l.tp, l.cp);
    const double latency = link.p2pSeconds(0);
    double seconds = (pc.ring.count * latency + (link.p2pSeconds(pc.ring.bytes) - latency)) * price.slowdown;
    return cluster.overlap ? std::max(0.0, seconds - pc.ringComputeSeconds) : seconds;
  }

  double collectivesSeconds(const PhaseCost &pc, const Layout &l, MeshAxisRole cls) const {
    double t = 0;
    for (const auto &[k, c] : pc.collectives)
      if (classOf(k) == cls)
        t += collectiveSeconds(k, c, l);
    return t;
  }

  std::string invalidReason(const Layout &l) const {
    if (l.devices() != space.devices)
      return "dp x ep x cp x tp x pp != devices";
    if (l.ep > 1 && (model.experts() == 0 || model.experts() % l.ep))
      return model.experts() ? "ep does not divide the experts" : "ep needs a mixture-of-experts model";
    if (model.kind != ModelSource::File) {
      if (model.heads() % l.tp || model.kvHeads() % l.tp)
        return "tp does not divide the (key/value) heads";
      if (model.layers() % (l.pp * l.virtualStages))
        return "pp x virtual stages does not divide the layers";
      if (l.sequenceParallel && model.seq() % l.tp)
        return "tp does not divide the sequence (sp)";
      if (l.cp > 1 && model.seq() % (l.cp * (l.sequenceParallel ? l.tp : 1)))
        return "cp does not divide the sequence";
      if (l.cp > 1 && l.cpAttention == CpAttention::Ulysses &&
          (model.heads() % (l.tp * l.cp) || model.kvHeads() % (l.tp * l.cp)))
        return "tp x cp does not divide the (key/value) heads (ulysses)";
    }
    if (l.cp == 1 && l.cpAttention != CpAttention::Ring)
      return "cp attention without cp";
    if (l.tp > cluster.ranksPerNode(space.devices) && !space.tpAcrossNodes)
      return "tp spans nodes (--tp-across-nodes allows it)";
    if (l.zero > 0 && l.dp == 1)
      return "ZeRO needs dp > 1";
    if (l.sequenceParallel && l.tp == 1)
      return "sp needs tp > 1";
    if (l.pp == 1 && (l.virtualStages > 1 || l.schedule != schedule::ScheduleKind::OneFOneB))
      return "schedule options without pp";
    if (l.pp > 1 && (l.virtualStages > 1) != (l.schedule == schedule::ScheduleKind::Interleaved1F1B))
      return "interleaving needs virtual stages > 1 and the reverse";
    if (l.schedule == schedule::ScheduleKind::Interleaved1F1B && l.microbatches % l.pp)
      return "interleaved-1f1b needs micro-batches divisible by pp";
    if (l.pp > 1 && l.microbatches < l.pp)
      return "fewer micro-batches than pipeline ranks";
    return "";
  }

  /// Per-chunk costs of a layout for one micro-batch and its model FLOPs per
  /// step; `error` is the compiler's diagnostic when a probe is refused.
  std::vector<Costs> chunkCosts(const Layout &l, double &modelFlops, std::string &error) {
    int64_t chunks = l.pp * l.virtualStages;
    std::vector<Costs> out(static_cast<size_t>(chunks));
    if (model.kind == ModelSource::File) {
      // The file cut to two and three blocks per chunk, compiled in the
      // layout; each chunk's cost grows by the difference per block.
      const int64_t n = fileBlocksPerChunk(l);
      const Probe &a = layoutProbe(l, n ? 2 * chunks : 0);
      const Probe &b = n ? layoutProbe(l, 3 * chunks) : a;
      if (!a.error.empty() || !b.error.empty()) {
        error = a.error.empty() ? b.error : a.error;
        return out;
      }
      const double more = n ? static_cast<double>(n - 2) : 0.0;
      for (auto &[c, costs] : a.costs)
        if (c < chunks) {
          Costs &o = out[static_cast<size_t>(c)];
          o = costs;
          if (n && b.costs.count(c))
            o.add(b.costs.at(c), more).add(costs, -more);
        }
      modelFlops = 3 * (a.forwardModelFlops + more * (b.forwardModelFlops - a.forwardModelFlops));
      return out;
    }
    // Without pp the ZeRO shards and the dp collectives need a dp axis of
    // their own: probes use dp = min(dp, 2) and one micro-batch; the step
    // segment's sharded work scales with dp.
    Layout q = l;
    q.dp = std::min<int64_t>(l.dp, 2);
    const Layout probed = probeLayout(q, false);
    const bool accumulates = l.microbatches > 1;
    const Probe &one = probe(1, l.microBatch * q.dp * l.ep, probed, 1, accumulates);
    const Probe &two = probe(2, l.microBatch * q.dp * l.ep, probed, 1, accumulates);
    if (!one.error.empty() || !two.error.empty()) {
      error = one.error.empty() ? two.error : one.error;
      return out;
    }
    Costs layer, base;
    layer.add(two.costs.at(0), 1).add(one.costs.at(0), -1);
    base.add(one.costs.at(0), 1).add(layer, -1);
    if (l.zero > 0 && l.dp > q.dp) {
      double s = static_cast<double>(q.dp) / static_cast<double>(l.dp);
      for (Costs *c : {&layer, &base}) {
        c->phase[kStep].seconds *= s;
        c->phase[kStep].matmulSeconds *= s;
      }
    }
    int64_t n = model.layers() / chunks;
    for (int64_t c = 0; c < chunks; ++c) {
      out[static_cast<size_t>(c)].add(layer, static_cast<double>(n));
      if (c == chunks - 1)
        out[static_cast<size_t>(c)].add(base, 1);
    }
    double layerFlops = two.forwardModelFlops - one.forwardModelFlops;
    double perProbe = one.forwardModelFlops + (model.layers() - 1) * layerFlops;
    modelFlops = 3 * perProbe * static_cast<double>(space.globalBatch) /
                 static_cast<double>(l.microBatch * q.dp * l.ep);
    return out;
  }

  /// The model at `layers` layers (0: all of it) compiled in the whole
  /// layout `l`, its plan exported (builders at the global batch; a file cut
  /// to `layers` of its blocks).
  const Probe &layoutProbe(const Layout &l, int64_t layers) {
    const Layout probed = probeLayout(l, true);
    if (model.kind == ModelSource::File)
      return probe(layers, 0, probed, static_cast<int>(l.pp), false, /*exportPlan=*/true);
    return probe(layers ? layers : model.layers(), space.globalBatch, probed, static_cast<int>(l.pp),
                 false, /*exportPlan=*/true);
  }

  /// Memory of each pipeline rank of `l`: the peak of the plan the compiler
  /// writes for it (its arena, model state and buffers, and the activation
  /// stash of its schedule simulated on the plan, as ptc-opt predicts it).
  /// `exact`: the whole model compiled. Otherwise, where a chunk holds four
  /// blocks or more, the model cut to two and three blocks per chunk,
  /// compiled in the layout and extrapolated linearly in depth (one block per
  /// chunk is not yet linear: the head's moment can hold a rank's peak
  /// there), an estimate that screens layouts before the whole compile.
  /// `exactOut` says which.
  std::vector<RankBytes> rankMemory(const Layout &l, bool exact, bool &exactOut, std::string &error) {
    std::vector<RankBytes> out;
    const int64_t chunks = l.pp * l.virtualStages;
    const int64_t perChunk =
        model.kind == ModelSource::File ? fileBlocksPerChunk(l)
                             : (model.layers() % chunks == 0 && model.layers() / chunks >= 4 ? model.layers() / chunks : 0);
    exactOut = exact || perChunk == 0;
    auto of = [](const Probe &p, size_t r) {
      RankBytes b = RankBytes::of(p.memory[r]);
      b.peak = p.planPeak[r];
      return b;
    };
    if (exactOut) {
      const Probe &whole = layoutProbe(l, 0);
      if (!whole.error.empty()) {
        error = whole.error;
        return out;
      }
      for (size_t r = 0; r < whole.planPeak.size(); ++r)
        out.push_back(of(whole, r));
      return out;
    }
    const Probe &two = layoutProbe(l, 2 * chunks), &three = layoutProbe(l, 3 * chunks);
    if (!two.error.empty() || !three.error.empty()) {
      error = two.error.empty() ? three.error : two.error;
      return out;
    }
    for (size_t r = 0; r < two.planPeak.size() && r < three.planPeak.size(); ++r) {
      RankBytes b = of(two, r);
      out.push_back(b.plus(of(three, r).plus(b, -1), static_cast<double>(perChunk - 2)));
    }
    return out;
  }

  const schedule::Pipeline *pipeline(const Layout &l, std::string &error) {
    auto key = std::make_tuple(l.schedule, l.pp, l.virtualStages, l.microbatches);
    auto it = pipelines.find(key);
    if (it != pipelines.end())
      return &it->second;
    schedule::Pipeline p;
    p.ranks = static_cast<int>(l.pp);
    p.chunks = static_cast<int>(l.pp * l.virtualStages);
    p.microbatches = static_cast<int>(l.microbatches);
    p.splitWeight = l.schedule == schedule::ScheduleKind::ZbH1;
    for (int c = 0; c + 1 < p.chunks; ++c) {
      p.channels.push_back({c, c + 1, schedule::Segment::Forward, schedule::Segment::Forward, false, false, 0});
      p.channels.push_back({c + 1, c, schedule::Segment::Backward, schedule::Segment::Backward, false, false, 0});
    }
    Status s = schedule::generate(l.schedule, p);
    if (s.isOk())
      s = schedule::verify(p); // once; each layout's timing then simulates it unverified
    if (!s.isOk()) {
      error = s.message();
      return nullptr;
    }
    return &pipelines.emplace(key, std::move(p)).first->second;
  }

  /// What evaluate() finds of a layout's memory: nothing, an estimate
  /// from probes (exact where the probes are the whole model), or the whole
  /// model's compiled plan.
  enum class Memory { None, Bound, Compiled };

  llvm::Expected<Estimate> evaluate(const Layout &l, Memory memory) {
    Estimate e;
    e.layout = l;
    std::string reason = invalidReason(l);
    if (!reason.empty())
      return llvm::createStringError(reason);
    double modelFlops = 0;
    std::string error;
    std::vector<Costs> costs = chunkCosts(l, modelFlops, error);
    if (!error.empty())
      return llvm::createStringError(error);
    const MeshAxisRole tensor = MeshAxisRole::Tensor, data = MeshAxisRole::Data, expert = MeshAxisRole::Expert;
    const double m = static_cast<double>(l.microbatches);
    int64_t chunks = l.pp * l.virtualStages;
    schedule::Timing timing;
    std::vector<double> tpPerRank(static_cast<size_t>(l.pp), 0), epPerRank(static_cast<size_t>(l.pp), 0),
        cpPerRank(static_cast<size_t>(l.pp), 0),
        computePerRank(static_cast<size_t>(l.pp), 0), dpPerRank(static_cast<size_t>(l.pp), 0),
        stepPerRank(static_cast<size_t>(l.pp), 0), lastBackward(static_cast<size_t>(l.pp), 0),
        gatherExposed(static_cast<size_t>(l.pp), 0);
    double hardwareFlops = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const Costs &cc = costs[static_cast<size_t>(c)];
      size_t r = static_cast<size_t>(c % l.pp);
      double seg[2];
      for (int ph : {kForward, kBackward}) {
        const PhaseCost &pc = cc.phase[ph];
        double tp = collectivesSeconds(pc, l, tensor), ep = collectivesSeconds(pc, l, expert);
        double cp = collectivesSeconds(pc, l, MeshAxisRole::Context) + ringSeconds(pc, l);
        // dp collectives inside a micro-batch: ZeRO-3's parameter gathers
        // (ahead of their layer, overlapping the previous one's compute on
        // a GPU) and, in the probes' single micro-batch, the gradients.
        double dpIn = 0;
        for (const auto &[k, coll] : pc.collectives)
          if (classOf(k) == data && !(ph == kBackward && (k.second == kAllReduce || k.second == kReduceScatter)))
            dpIn += collectiveSeconds(k, coll, l);
        double gathered = cluster.overlap ? std::max(0.0, dpIn - pc.seconds) : dpIn;
        seg[ph] = pc.seconds + tp + ep + cp + gathered;
        tpPerRank[r] += m * tp;
        epPerRank[r] += m * ep;
        cpPerRank[r] += m * cp;
        gatherExposed[r] += m * gathered;
        computePerRank[r] += m * pc.seconds;
        hardwareFlops += m * pc.flops;
      }
      const PhaseCost &bw = cc.phase[kBackward];
      for (const auto &[k, coll] : bw.collectives)
        if (classOf(k) == data && (k.second == kAllReduce || k.second == kReduceScatter))
          dpPerRank[r] += collectiveSeconds(k, coll, l);
      lastBackward[r] += seg[kBackward];
      const PhaseCost &st = cc.phase[kStep];
      stepPerRank[r] += st.seconds + collectivesSeconds(st, l, data) + collectivesSeconds(st, l, tensor);
      hardwareFlops += st.flops;
      if (l.schedule == schedule::ScheduleKind::ZbH1) {
        // The weight gradients: half of the backward GEMMs.
        double w = 0.5 * bw.matmulSeconds;
        timing.forward.push_back(seg[kForward]);
        timing.backward.push_back(seg[kBackward] - w);
        timing.weight.push_back(w);
      } else {
        timing.forward.push_back(seg[kForward]);
        timing.backward.push_back(seg[kBackward]);
      }
    }
    double makespan = 0;
    if (l.pp == 1) {
      makespan = m * (timing.forward[0] + timing.backward[0]);
      e.bubble = 0;
    } else {
      const schedule::Pipeline *p = pipeline(l, error);
      if (!p)
        return llvm::createStringError(error);
      // One micro-batch's activations between neighbouring ranks.
      double bytes = static_cast<double>(l.microBatch) * model.seq() * model.hidden() *
                     (space.precision == Precision::Fp32 ? 4 : 2) / (l.sequenceParallel ? l.tp : 1) / l.cp;
      const Link &link = linkFor(l.dp * l.ep * l.cp * l.tp, 2);
      timing.transfer = link.p2pSeconds(bytes) * price.slowdown;
      StatusOr<schedule::Report> rep = schedule::simulate(*p, timing, /*verified=*/true);
      if (!rep.isOk())
        return llvm::createStringError(rep.status().message());
      makespan = rep->makespan;
      e.bubble = rep->bubble;
      e.ppComm = 2 * m * timing.transfer;
    }
    // Gradient reductions once per step (after the last micro-batch's
    // backward pass); DDP buckets overlap that backward pass on a GPU,
    // except the last bucket.
    double tail = 0;
    for (int64_t r = 0; r < l.pp; ++r) {
      size_t i = static_cast<size_t>(r);
      double dp = dpPerRank[i];
      double exposed = cluster.overlap ? std::max(dp - lastBackward[i] / static_cast<double>(l.virtualStages), 0.1 * dp) : dp;
      tail = std::max(tail, exposed + stepPerRank[i]);
      e.dpComm = std::max(e.dpComm, exposed + gatherExposed[i]);
      e.tpComm = std::max(e.tpComm, tpPerRank[i]);
      e.epComm = std::max(e.epComm, epPerRank[i]);
      e.cpComm = std::max(e.cpComm, cpPerRank[i]);
      e.compute = std::max(e.compute, computePerRank[i]);
      e.optimizer = std::max(e.optimizer, stepPerRank[i]);
    }
    e.step = makespan + tail;
    double tokens = model.kind == ModelSource::File ? static_cast<double>(fileInput().second)
                                         : static_cast<double>(space.globalBatch * model.seq());
    e.tokensPerSecond = tokens / e.step;
    e.tflopsPerDevice = hardwareFlops / static_cast<double>(l.pp) / e.step / 1e12;
    double peak = price.profile ? interpolate(price.profile->matmul, 1e30) : cluster.peak(std::string(optionName(computeDtype(space.precision))));
    e.mfu = modelFlops / static_cast<double>(space.devices) / e.step / peak;
    // What the step is mostly spent on.
    std::pair<double, const char *> parts[] = {{e.compute, "compute"},
                                               {e.tpComm, "tp communication"},
                                               {e.dpComm, "dp communication"},
                                               {e.epComm, "ep communication"},
                                               {e.cpComm, "cp communication"},
                                               {e.bubble * makespan, "pipeline bubble"},
                                               {e.optimizer, "optimizer step"}};
    e.limit = std::max_element(std::begin(parts), std::end(parts))->second;
    if (memory != Memory::None) {
      std::vector<RankBytes> mem = rankMemory(l, memory == Memory::Compiled, e.memoryExact, error);
      if (!error.empty())
        return llvm::createStringError(error);
      for (size_t r = 0; r < mem.size(); ++r)
        if (mem[r].peak > e.memory) {
          e.memory = mem[r].peak;
          e.modelStateMemory = mem[r].modelState;
          e.memoryRank = static_cast<int>(r);
        }
      e.fits = cluster.memoryBytes <= 0 || e.memory <= cluster.memoryBytes;
    }
    return e;
  }

  std::vector<Layout> layouts(SearchStats &stats) {
    std::vector<Layout> out;
    const int64_t n = space.devices;
    int64_t fileB = fileBatch();
    for (int64_t tp : divisors(n)) {
      if (!allowed(space.tp, tp))
        continue;
      for (int64_t pp : divisors(n / tp)) {
        if (!allowed(space.pp, pp))
          continue;
        for (int64_t ep : divisors(n / (tp * pp))) {
        if (!allowed(space.ep, ep) || (ep > 1 && model.experts() == 0))
          continue;
        for (int64_t cp : divisors(n / (tp * pp * ep))) {
        if (!cpAllowed(cp))
          continue;
        int64_t dp = n / (tp * pp * ep * cp);
        if (!allowed(space.dp, dp))
          continue;
        // The batch splits over dp x ep replicas.
        int64_t replicas = dp * ep;
        std::vector<std::pair<int64_t, int64_t>> batches; // (micro-batch size, micro-batches)
        if (model.kind == ModelSource::File) {
          for (int64_t mb : divisors(std::max<int64_t>(1, fileB)))
            if (fileB % (replicas * mb) == 0)
              batches.push_back({fileB / (replicas * mb), mb});
        } else {
          // The listed sizes, and the whole per-replica batch as one micro-batch.
          std::vector<int64_t> sizes = space.microBatchSizes;
          if (space.globalBatch % replicas == 0)
            sizes.push_back(space.globalBatch / replicas);
          std::sort(sizes.begin(), sizes.end());
          sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
          for (int64_t mbs : sizes)
            if (space.globalBatch % (replicas * mbs) == 0)
              batches.push_back({mbs, space.globalBatch / (replicas * mbs)});
        }
        const std::vector<CpAttention> ring{CpAttention::Ring};
        for (auto [mbs, m] : batches)
          for (CpAttention cpAttention : cp > 1 ? space.cpAttention : ring)
          for (int64_t v : space.virtualStages)
            for (schedule::ScheduleKind sched : space.schedules)
              for (bool sp : space.sequenceParallel)
                for (int z : space.zero)
                  for (Recompute rc : space.recompute) {
                    // Combinations that are not layouts: schedules and virtual
                    // stages without pp (one pp=1 layout per schedule list),
                    // interleaving without virtual stages and the reverse, sp without tp.
                    if ((pp == 1 && (v > 1 || sched != space.schedules.front())) ||
                        (pp > 1 && (v > 1) != (sched == schedule::ScheduleKind::Interleaved1F1B)) || (sp && tp == 1))
                      continue;
                    Layout l{dp, tp, pp, v, mbs, m, sp, z, rc,
                             pp == 1 ? schedule::ScheduleKind::OneFOneB : sched, ep, cp, cpAttention};
                    std::string why = invalidReason(l);
                    if (!why.empty()) {
                      ++stats.invalid;
                      ++stats.invalidReasons[why];
                      continue;
                    }
                    out.push_back(l);
                  }
        }
        }
      }
    }
    return out;
  }
};

Planner::Planner(MLIRContext &context, ModelSpec model, Cluster cluster, SearchSpace space)
    : cluster_(std::move(cluster)) {
  impl_ = std::make_unique<Impl>(context, std::move(model), cluster_, std::move(space));
  if (impl_->model.kind == ModelSource::File) {
    impl_->fileModule = parseSourceFile<ModuleOp>(impl_->model.file, &context);
    if (impl_->fileModule)
      for (auto func : impl_->fileModule->getOps<func::FuncOp>()) {
        for (BlockArgument arg : func.getArguments())
          if (auto e = func.getArgAttrOfType<IntegerAttr>(arg.getArgNumber(), PtcDialect::kExpertsAttrName))
            impl_->model.fileExperts = e.getInt();
        if (!func.isExternal())
          impl_->fileBlocks = findBlocks(func);
      }
  }
}

Planner::~Planner() = default;

std::string Planner::invalidReason(const Layout &layout) const { return impl_->invalidReason(layout); }

llvm::Expected<Estimate> Planner::evaluate(const Layout &layout) {
  if (impl_->model.kind == ModelSource::File && !impl_->fileModule)
    return llvm::createStringError("cannot parse '" + impl_->model.file + "'");
  return impl_->evaluate(layout, Impl::Memory::Compiled);
}

llvm::Expected<std::vector<Estimate>> Planner::search(size_t keep, SearchStats &stats) {
  auto start = std::chrono::steady_clock::now();
  if (impl_->model.kind == ModelSource::File && !impl_->fileModule)
    return llvm::createStringError("cannot parse '" + impl_->model.file + "'");
  std::vector<Layout> all = impl_->layouts(stats);
  stats.layouts = static_cast<int64_t>(all.size());
  std::vector<Estimate> timed;
  for (const Layout &l : all) {
    auto e = impl_->evaluate(l, Impl::Memory::None);
    if (!e) {
      ++stats.invalid;
      ++stats.invalidReasons[llvm::toString(e.takeError())];
      continue;
    }
    timed.push_back(*e);
  }
  std::sort(timed.begin(), timed.end(), [](const Estimate &a, const Estimate &b) { return a.step < b.step; });
  // Memory in order of speed until `keep` layouts fit: the probes' estimate
  // rejects a layout, the whole model's plan accepts it (so every layout
  // returned has the memory ptc-opt predicts for its plan).
  std::vector<Estimate> out;
  for (const Estimate &t : timed) {
    if (out.size() >= keep)
      break;
    auto e = impl_->evaluate(t.layout, Impl::Memory::Bound);
    if (e && e->fits && !e->memoryExact) {
      ++stats.wholeCompiles;
      e = impl_->evaluate(t.layout, Impl::Memory::Compiled);
    }
    if (!e) {
      ++stats.invalid;
      ++stats.invalidReasons[llvm::toString(e.takeError())];
      continue;
    }
    if (!e->fits) {
      ++stats.outOfMemory;
      if (!stats.smallest || e->memory < stats.smallest->memory)
        stats.smallest = *e;
      continue;
    }
    out.push_back(*e);
  }
  stats.probes = impl_->probes;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

} // namespace ptc::planner
