//===- SchedulePipeline.cpp - per-rank action lists of a pipeline ---------===//

#include "passes/pipeline/Passes.h"

#include "passes/memory/Passes.h"
#include "runtime/schedule/schedule.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_SCHEDULEPIPELINEPASS
#define GEN_PASS_DEF_SCHEDULEREPORTPASS
#include "passes/pipeline/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
namespace sch = ::ptc::schedule;

namespace {
/// A channel's producer / consumer segment (once-per-step channels: Forward).
sch::Segment segmentOf(Operation *op) {
  sch::Segment s = getSegment(op).value_or(sch::Segment::Forward);
  return s == sch::Segment::Step ? sch::Segment::Forward : s;
}

/// The pipeline of a split step: chunks, micro-batches and the channels of
/// its send/recv ops (no actions).
FailureOr<sch::Pipeline> pipelineOf(func::FuncOp func, DictionaryAttr pipeline) {
  sch::Pipeline p;
  p.ranks = static_cast<int>(cast<IntegerAttr>(pipeline.get("ranks")).getInt());
  p.chunks = static_cast<int>(cast<IntegerAttr>(pipeline.get("chunks")).getInt());
  p.splitWeight = cast<BoolAttr>(pipeline.get("split_weight")).getValue();
  p.microbatches = static_cast<int>(func->getAttrOfType<IntegerAttr>(PtcDialect::kMicrobatchesAttrName).getInt());
  llvm::DenseMap<int64_t, sch::Channel> channels;
  func.walk([&](SendOp send) {
    sch::Channel &ch = channels[send.getChannel()];
    ch.from = static_cast<int>(send->getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName).getInt());
    ch.to = static_cast<int>(send.getTo());
    ch.fromSegment = segmentOf(send);
    ch.perStep = send.getPerStep();
    ch.atEnd = send.getAtEnd();
    ch.bytes = getTensorBytes(cast<RankedTensorType>(send.getInput().getType()));
  });
  func.walk([&](RecvOp recv) { channels[recv.getChannel()].toSegment = segmentOf(recv); });
  p.channels.resize(channels.size());
  for (auto &[id, ch] : channels) {
    if (id < 0 || id >= static_cast<int64_t>(channels.size()))
      return func.emitError() << "channel ids must be 0.." << channels.size() - 1;
    p.channels[static_cast<size_t>(id)] = ch;
  }
  return p;
}

/// Prints the simulated report and/or writes the SVG.
LogicalResult report(func::FuncOp func, const sch::Pipeline &p, StringRef schedule, bool print,
                     StringRef svg) {
  ::ptc::StatusOr<sch::Report> rep = sch::simulate(p);
  if (!rep.isOk())
    return func.emitError() << rep.status().message();
  if (print) {
    auto &os = llvm::outs();
    int v = p.virtualStages();
    os << "ptc-schedule-pipeline @" << func.getSymName() << ": " << schedule << ", " << p.ranks
       << " ranks x " << v << " virtual stage" << (v > 1 ? "s" : "") << ", " << p.microbatches
       << " micro-batches, " << p.channels.size() << " channels\n";
    for (int r = 0; r < p.ranks; ++r) {
      size_t ri = static_cast<size_t>(r);
      os << llvm::format("  rank %d: %zu actions, busy %.3f of %.3f, peak in flight %d "
                         "(%.2f micro-batches)",
                         r, p.actions[ri].size(), rep->busy[ri], rep->makespan,
                         rep->peakInFlight[ri], static_cast<double>(rep->peakInFlight[ri]) / v);
      if (p.splitWeight)
        os << ", awaiting W " << rep->peakAwaitingWeight[ri];
      os << ", sends " << rep->sendBytes[ri] << " bytes per step\n";
    }
    std::optional<sch::ScheduleKind> kind = ::ptc::parseOption<sch::ScheduleKind>(schedule);
    double closed = kind ? sch::closedFormBubble(*kind, p.ranks, v, p.microbatches) : -1;
    os << llvm::format("  bubble %.4f", rep->bubble);
    if (closed >= 0)
      os << llvm::format(" (closed form %.4f)", closed);
    os << "\n";
    os.flush();
  }
  if (!svg.empty()) {
    std::error_code ec;
    llvm::raw_fd_ostream out(svg, ec, llvm::sys::fs::OF_Text);
    if (ec)
      return func.emitError() << "cannot write '" << svg << "': " << ec.message();
    out << sch::svg(p, *rep,
                    schedule.str() + ": " + std::to_string(p.ranks) + " ranks, " +
                        std::to_string(p.microbatches) + " micro-batches");
  }
  return success();
}

struct SchedulePipelinePass : mlir::ptc::impl::SchedulePipelinePassBase<SchedulePipelinePass> {
  using SchedulePipelinePassBase::SchedulePipelinePassBase;

  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      auto pipeline = func->getAttrOfType<DictionaryAttr>(PtcDialect::kPipelineAttrName);
      if (!pipeline)
        continue;
      if (failed(schedulePipeline(func, pipeline)))
        return signalPassFailure();
    }
  }

  LogicalResult schedulePipeline(func::FuncOp func, DictionaryAttr pipeline) {
    FailureOr<sch::Pipeline> built = pipelineOf(func, pipeline);
    if (failed(built))
      return failure();
    sch::Pipeline &p = *built;
    ::ptc::Status s = sch::generate(schedule, p);
    if (s.isOk())
      s = sch::verify(p);
    if (!s.isOk())
      return func.emitError() << "schedule '" << schedule << "': " << s.message();

    Builder b(func.getContext());
    SmallVector<Attribute> ranks;
    for (const auto &list : p.actions) {
      SmallVector<Attribute> actions;
      for (const sch::Action &a : list)
        actions.push_back(ScheduleActionAttr::get(b.getContext(), static_cast<int64_t>(a.kind),
                                                  a.chunk, a.mb, a.channel));
      ranks.push_back(b.getArrayAttr(actions));
    }
    func->setAttr(PtcDialect::kScheduleAttrName,
                  b.getDictionaryAttr({b.getNamedAttr("name", b.getStringAttr(schedule)),
                                       b.getNamedAttr("actions", b.getArrayAttr(ranks))}));
    if (!report && svg.empty())
      return success();
    return ::report(func, p, schedule, report, svg);
  }
};

sch::Action toScheduleAction(ScheduleActionAttr a) {
  sch::Action out;
  out.kind = static_cast<sch::ActionKind>(a.getKind());
  out.chunk = static_cast<int>(a.getChunk());
  out.mb = static_cast<int>(a.getMb());
  out.channel = static_cast<int>(a.getChannel());
  return out;
}

/// The report of a step that ptc-schedule-pipeline (or ptc-compile) already
/// scheduled: its action lists are read back, verified and simulated.
struct ScheduleReportPass : mlir::ptc::impl::ScheduleReportPassBase<ScheduleReportPass> {
  using ScheduleReportPassBase::ScheduleReportPassBase;

  void runOnOperation() override {
    bool any = false;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      auto pipeline = func->getAttrOfType<DictionaryAttr>(PtcDialect::kPipelineAttrName);
      auto schedule = func->getAttrOfType<DictionaryAttr>(PtcDialect::kScheduleAttrName);
      if (!pipeline || !schedule)
        continue;
      any = true;
      FailureOr<sch::Pipeline> p = pipelineOf(func, pipeline);
      if (failed(p))
        return signalPassFailure();
      for (Attribute list : cast<ArrayAttr>(schedule.get("actions"))) {
        p->actions.emplace_back();
        for (Attribute a : cast<ArrayAttr>(list)) {
          auto action = dyn_cast<ScheduleActionAttr>(a);
          if (!action) {
            func.emitError() << "'ptc.schedule' holds " << a << ", not a #ptc.action";
            return signalPassFailure();
          }
          p->actions.back().push_back(toScheduleAction(action));
        }
      }
      if (failed(::report(func, *p, cast<StringAttr>(schedule.get("name")).getValue(), true, svg)))
        return signalPassFailure();
    }
    if (!any) {
      getOperation().emitError() << "no scheduled pipeline to report on; compile with "
                                    "microbatches=M or a pp mesh axis first";
      signalPassFailure();
    }
  }
};
} // namespace
