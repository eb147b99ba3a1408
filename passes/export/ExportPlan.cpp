//===- ExportPlan.cpp - serialize a training step to a FlatBuffers plan ---===//

#include "passes/export/Passes.h"
#include "runtime/base/option_values.h"

#include "dialects/ptc/PtcMesh.h"
#include "passes/memory/Passes.h"

#include "runtime/plan/plan_format.h"
#include "runtime/plan/plan_generated.h"
#include "runtime/plan/pipeline_segments.h"
#include "runtime/plan/plan_ops.h"
#include "runtime/schedule/schedule.h"

static_assert(static_cast<int>(mlir::ptc::SegmentKind::Step) ==
                  static_cast<int>(ptc::plan::Segment::Step),
              "the plan's Segment enum is generated from runtime/schedule/schedule_kinds.def");

#include "mlir/IR/BuiltinAttributes.h"
#include <map>
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_EXPORTPLANPASS
#include "passes/export/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::parseOption;
using ::ptc::OffloadTarget;
namespace fb = ::flatbuffers;
namespace pp = ::ptc::plan;

namespace {
FailureOr<pp::DType> toDType(Type t, Location loc) {
  if (t.isF32())
    return pp::DType::F32;
  if (t.isBF16())
    return pp::DType::BF16;
  if (t.isF16())
    return pp::DType::F16;
  if (t.isInteger(32))
    return pp::DType::I32;
  return emitError(loc) << "element type " << t << " has no plan dtype";
}

/// Opcode and attributes of one ptc op.
struct Lowered {
  pp::OpCode code;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::string function; // Unary, UnaryGrad
};

static_assert(static_cast<size_t>(pp::OpCode::MAX) + 1 == ::ptc::kernels::kNumPlanOps,
              "the plan's OpCode and the kernels' OpKind are both op_table.def's rows");

/// The op's plan instruction (PlanInstructionOpInterface), its opcode's row
/// of the op table (OpKind and the plan's OpCode are both the table's rows).
FailureOr<Lowered> lowerOp(Operation *op, const MeshInfo *mesh) {
  auto lowering = dyn_cast<PlanInstructionOpInterface>(op);
  if (!lowering)
    return op->emitOpError() << "has no plan instruction";
  PlanInstruction inst = lowering.getPlanInstruction(
      [&](StringRef axis) -> int64_t { return mesh ? mesh->axisIndex(axis) : -1; });
  const pp::OpInfo *info = pp::lookupOp(static_cast<pp::OpCode>(inst.opcode));
  if (!info)
    return op->emitOpError() << "lowers to opcode #" << static_cast<int>(inst.opcode)
                             << ", which kernels/common/op_table.def does not list";
  // Trailing optional attributes at their fallbacks are left out: a plan
  // written before they existed holds just that.
  inst.attrs.compact();
  return Lowered{info->code, inst.attrs.ints(), inst.attrs.floats(), std::move(inst.function)};
}

/// `file:line:col` or the name of a NameLoc; other locations as MLIR prints them.
std::string locationString(Location loc) {
  if (auto file = dyn_cast<FileLineColLoc>(loc))
    return (file.getFilename().getValue() + ":" + Twine(file.getLine()) + ":" +
            Twine(file.getColumn()))
        .str();
  if (auto name = dyn_cast<NameLoc>(loc))
    return name.getName().str();
  std::string s;
  llvm::raw_string_ostream os(s);
  loc.print(os);
  return s;
}

struct ExportPlanPass : mlir::ptc::impl::ExportPlanPassBase<ExportPlanPass> {
  using ExportPlanPassBase::ExportPlanPassBase;

  void runOnOperation() override {
    if (output.empty()) {
      getOperation().emitError()
          << "ptc-export-plan needs output=<plan file> (with ptc-compile: plan=<plan file>)";
      return signalPassFailure();
    }
    const std::optional<OffloadTarget> target = parseOption<OffloadTarget>(offloadTarget);
    if (!target) {
      getOperation().emitError() << "offload-target must be "
                                 << ::ptc::optionChoices<OffloadTarget>() << ", got '"
                                 << offloadTarget.getValue() << "'";
      return signalPassFailure();
    }
    if ((*target == OffloadTarget::Nvme) != !offloadPath.empty()) {
      getOperation().emitError()
          << (offloadPath.empty() ? "offload-target=nvme needs offload-path=DIR (the directory of the "
                                    "offload file)"
                                  : "offload-path needs offload-target=nvme");
      return signalPassFailure();
    }
    func::FuncOp step;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isExternal() || func.getNumResults() == 0 ||
          (!func.getResultAttr(0, PtcDialect::kLossAttrName) &&
           !func.getResultAttr(0, PtcDialect::kLogitsAttrName)))
        continue;
      if (step) {
        func.emitError() << "a plan holds one step, but @" << step.getSymName() << " and @"
                         << func.getSymName()
                         << " both return a 'ptc.loss' (or decode 'ptc.logits')";
        return signalPassFailure();
      }
      step = func;
    }
    if (!step) {
      getOperation().emitError()
          << "no function returns a 'ptc.loss' result (run ptc-autodiff first) or decode "
             "'ptc.logits' (ptc-derive-decode)";
      return signalPassFailure();
    }
    if (failed(exportStep(step)))
      return signalPassFailure();
  }

  /// A channel's producer / consumer segment (once-per-step channels: Forward).
  static pp::Segment toSegment(Operation *op) {
    SegmentKind s = getSegment(op).value_or(SegmentKind::Forward);
    return s == SegmentKind::Step ? pp::Segment::Forward : static_cast<pp::Segment>(s);
  }

  FailureOr<fb::Offset<pp::Pipeline>>
  exportPipeline(fb::FlatBufferBuilder &fbb, func::FuncOp func, DictionaryAttr pipeline,
                 const MeshInfo *mesh,
                 const std::map<int64_t, std::pair<Operation *, int32_t>> &sends,
                 const std::map<int64_t, std::pair<Operation *, int32_t>> &recvs) {
    auto schedule = func->getAttrOfType<DictionaryAttr>(PtcDialect::kScheduleAttrName);
    auto arenas = func->getAttrOfType<DenseI64ArrayAttr>(kArenaBytesPerRankAttrName);
    if (!schedule || !arenas)
      return func.emitError() << "pipelined step without a schedule or per-rank memory plan; run "
                                 "ptc-schedule-pipeline and ptc-plan-memory before ptc-export-plan";
    std::vector<fb::Offset<pp::Channel>> channels;
    for (size_t c = 0; c < sends.size(); ++c) {
      auto s = sends.find(static_cast<int64_t>(c)), r = recvs.find(static_cast<int64_t>(c));
      if (s == sends.end() || r == recvs.end())
        return func.emitError() << "channel " << c << " lacks its send or its recv";
      auto send = cast<SendOp>(s->second.first);
      channels.push_back(pp::CreateChannel(
          fbb, static_cast<int32_t>(send->getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName).getInt()),
          static_cast<int32_t>(send.getTo()), toSegment(send), toSegment(r->second.first),
          send.getPerStep(), s->second.second, r->second.second, send.getAtEnd()));
    }
    std::vector<fb::Offset<pp::RankActions>> ranks;
    for (Attribute list : cast<ArrayAttr>(schedule.get("actions"))) {
      std::vector<pp::Action> actions;
      for (Attribute a : cast<ArrayAttr>(list)) {
        auto action = dyn_cast<ScheduleActionAttr>(a);
        if (!action)
          return func.emitError() << "'ptc.schedule' holds " << a << ", not a #ptc.action";
        actions.emplace_back(static_cast<pp::ActionKind>(action.getKind()),
                             static_cast<int32_t>(action.getChunk()),
                             static_cast<int32_t>(action.getMb()),
                             static_cast<int32_t>(action.getChannel()));
      }
      ranks.push_back(pp::CreateRankActions(fbb, fbb.CreateVectorOfStructs(actions)));
    }
    std::vector<int64_t> arenaBytes(arenas.asArrayRef().begin(), arenas.asArrayRef().end());
    return pp::CreatePipeline(
        fbb, mesh ? mesh->axisIndex(MeshAxisRole::Pipeline) : -1,
        static_cast<int32_t>(cast<IntegerAttr>(pipeline.get("ranks")).getInt()),
        static_cast<int32_t>(cast<IntegerAttr>(pipeline.get("chunks")).getInt()),
        cast<BoolAttr>(pipeline.get("split_weight")).getValue(),
        fbb.CreateString(cast<StringAttr>(schedule.get("name")).str()), fbb.CreateVector(channels),
        fbb.CreateVector(ranks), fbb.CreateVector(arenaBytes));
  }

  LogicalResult exportStep(func::FuncOp func) {
    auto arenaAttr = func->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
    auto unsharedAttr = func->getAttrOfType<IntegerAttr>(kArenaBytesUnsharedAttrName);
    if (!arenaAttr || !unsharedAttr)
      return func.emitError() << "no memory plan; run ptc-plan-memory before ptc-export-plan";

    std::optional<MeshInfo> mesh;
    if (getOperation()->hasAttr(PtcDialect::kMeshAttrName)) {
      FailureOr<MeshInfo> m = getEnclosingMesh(getOperation());
      if (failed(m))
        return failure();
      mesh = *m;
    }
    auto pipelineAttr = func->getAttrOfType<DictionaryAttr>(PtcDialect::kPipelineAttrName);
    int ranks = pipelineAttr ? static_cast<int>(cast<IntegerAttr>(pipelineAttr.get("ranks")).getInt()) : 0;
    fb::FlatBufferBuilder fbb(1 << 16);
    std::vector<fb::Offset<pp::Tensor>> tensors;
    llvm::DenseMap<Value, int32_t> tensorOf;
    Block &block = func.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());

    auto addTensor = [&](Value v, StringRef name, pp::TensorKind kind, int64_t offset,
                         pp::InitKind init, double initStd, ArrayRef<char> data,
                         ArrayRef<int> dimAxes = {}, ArrayRef<int> dimBlocks = {},
                         int ppRank = -1, int32_t copyOf = -1) -> FailureOr<int32_t> {
      auto type = cast<RankedTensorType>(v.getType());
      FailureOr<pp::DType> dtype = toDType(type.getElementType(), v.getLoc());
      if (failed(dtype))
        return failure();
      std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
      auto nameOff = fbb.CreateString(name.str());
      auto shapeOff = fbb.CreateVector(shape);
      fb::Offset<fb::Vector<int32_t>> axesOff, blocksOff;
      if (!dimAxes.empty()) {
        axesOff = fbb.CreateVector(std::vector<int32_t>(dimAxes.begin(), dimAxes.end()));
        blocksOff = fbb.CreateVector(std::vector<int32_t>(dimBlocks.begin(), dimBlocks.end()));
      }
      fb::Offset<fb::Vector<uint8_t>> dataOff;
      if (!data.empty())
        dataOff = fbb.CreateVector(reinterpret_cast<const uint8_t *>(data.data()), data.size());
      pp::TensorBuilder tb(fbb);
      tb.add_name(nameOff);
      if (!dimAxes.empty()) {
        tb.add_dim_axes(axesOff);
        tb.add_dim_blocks(blocksOff);
      }
      tb.add_kind(kind);
      tb.add_dtype(*dtype);
      tb.add_shape(shapeOff);
      tb.add_arena_offset(offset);
      tb.add_init(init);
      tb.add_init_std(initStd);
      if (!data.empty())
        tb.add_data(dataOff);
      tb.add_pp_rank(ppRank);
      if (copyOf >= 0)
        tb.add_copy_of(copyOf);
      if (isOnHost(v))
        tb.add_host(true);
      tensors.push_back(tb.Finish());
      int32_t id = static_cast<int32_t>(tensors.size() - 1);
      tensorOf[v] = id;
      return id;
    };

    // Arguments: parameters, optimizer state, inputs, working copies.
    llvm::StringMap<BlockArgument> argByName, copyByParam;
    for (BlockArgument arg : block.getArguments()) {
      unsigned i = arg.getArgNumber();
      pp::TensorKind kind;
      StringAttr name;
      int32_t copyOf = -1;
      std::string copyName;
      if (auto param = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kWorkingCopyAttrName)) {
        // Named after its parameter and type: "w@bf16".
        BlockArgument source = argByName.lookup(param.getValue());
        if (!source || !tensorOf.count(source))
          return func.emitError() << "working copy argument #" << i << " of '" << param.getValue()
                                  << "' comes before its parameter";
        kind = pp::TensorKind::WorkingCopy;
        copyOf = tensorOf.at(source);
        llvm::raw_string_ostream(copyName)
            << param.getValue() << "@" << cast<RankedTensorType>(arg.getType()).getElementType();
        copyByParam[param.getValue()] = arg;
      } else if ((name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kParamAttrName)))
        kind = pp::TensorKind::Parameter;
      else if ((name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kStateAttrName)))
        kind = pp::TensorKind::OptimizerState;
      else if ((name = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kInputAttrName)))
        kind = pp::TensorKind::Input;
      else
        return func.emitError() << "argument #" << i
                                << " has no role (ptc.param, ptc.state or ptc.input)";
      pp::InitKind init = pp::InitKind::None;
      double stddev = 0.0;
      if (kind == pp::TensorKind::Parameter) {
        init = pp::InitKind::Zeros;
        if (auto spec = func.getArgAttrOfType<StringAttr>(i, PtcDialect::kInitAttrName)) {
          StringRef k;
          if (failed(PtcDialect::parseInit(spec.getValue(), k, stddev)))
            return func.emitError() << "bad ptc.init on argument #" << i;
          init = k == "ones" ? pp::InitKind::Ones
                 : k == "normal" ? pp::InitKind::Normal
                                 : pp::InitKind::Zeros;
        }
      } else if (kind == pp::TensorKind::OptimizerState) {
        init = pp::InitKind::Zeros;
      }
      if (kind != pp::TensorKind::WorkingCopy)
        argByName[name.getValue()] = arg;
      SmallVector<int> dimAxes, dimBlocks;
      if (mesh) {
        dimAxes.assign(cast<RankedTensorType>(arg.getType()).getRank(), -1);
        dimBlocks.assign(dimAxes.size(), 1);
        if (Attribute spec = func.getArgAttr(i, PtcDialect::kShardingAttrName)) {
          FailureOr<Sharding> parsed =
              getSharding(spec, *mesh, dimAxes.size(), [&] { return func.emitError(); });
          if (failed(parsed))
            return failure();
          for (auto [d, dim] : llvm::enumerate(parsed->dims)) {
            dimAxes[d] = dim.axis;
            dimBlocks[d] = dim.blocks;
          }
        }
      }
      int ppRank = -1;
      if (auto stage = func.getArgAttrOfType<IntegerAttr>(i, PtcDialect::kStageAttrName); stage && ranks > 0)
        ppRank = static_cast<int>(stage.getInt() % ranks);
      if (failed(addTensor(arg, copyOf >= 0 ? StringRef(copyName) : name.getValue(), kind, -1,
                           init, stddev, {}, dimAxes, dimBlocks, ppRank, copyOf)))
        return failure();
    }

    // Results returned with ptc.update are written into their argument.
    llvm::DenseMap<Value, BlockArgument> inPlace;
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      if (auto name = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kUpdateAttrName))
        inPlace[v] = argByName.lookup(name.getValue());
      else if (auto param = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kWorkingCopyAttrName))
        inPlace[v] = copyByParam.lookup(param.getValue());

    std::vector<fb::Offset<pp::Instruction>> instructions;
    std::map<int64_t, std::pair<Operation *, int32_t>> sends, recvs; // channel -> (op, tensor)
    llvm::DenseMap<BlockArgument, Operation *> overwrittenBy;
    int temporaryCount = 0;
    for (Operation &op : block.without_terminator()) {
      if (auto cst = dyn_cast<arith::ConstantOp>(op)) {
        auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
        if (!dense)
          return cst.emitOpError() << "only dense tensor constants can be exported";
        if (failed(addTensor(cst.getResult(), "constant", pp::TensorKind::Constant, -1,
                             pp::InitKind::None, 0.0, dense.getRawData())))
          return failure();
        continue;
      }
      auto offsets = op.getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName);
      if (!offsets || offsets.size() != static_cast<int64_t>(op.getNumResults()))
        return op.emitOpError() << "has no memory plan; run ptc-plan-memory before ptc-export-plan";
      FailureOr<Lowered> lowered = lowerOp(&op, mesh ? &*mesh : nullptr);
      if (failed(lowered))
        return failure();
      // What the runtime will accept (kernels/common/op_table.def).
      const pp::OpInfo *info = pp::lookupOp(lowered->code);
      auto fits = [](int expected, size_t actual) {
        return expected < 0 || static_cast<size_t>(expected) == actual;
      };
      const ::ptc::kernels::AttrCounts counts = ::ptc::kernels::attrCounts(info->attrs);
      auto within = [](size_t least, size_t most, size_t actual) {
        return actual >= least && actual <= most;
      };
      if (!fits(info->inputs, op.getNumOperands()) || !fits(info->outputs, op.getNumResults()) ||
          !within(counts.minInts, counts.maxInts, lowered->ints.size()) ||
          !within(counts.minFloats, counts.maxFloats, lowered->floats.size()))
        return op.emitOpError() << "lowers to a " << info->name << " instruction with "
                                << op.getNumOperands() << " inputs, " << op.getNumResults()
                                << " outputs, " << lowered->ints.size() << " integer and "
                                << lowered->floats.size()
                                << " float attributes, which the plan op table does not allow";

      std::vector<int32_t> inputs, outputs;
      for (Value v : op.getOperands()) {
        // Reading an argument after its in-place update would see the new value.
        if (auto arg = dyn_cast<BlockArgument>(v); arg && overwrittenBy.count(arg))
          return op.emitOpError() << "reads '" << v << "' after it was updated in place"
                                  << " (the update is at " << overwrittenBy[arg]->getLoc() << ")";
        inputs.push_back(tensorOf.at(v));
      }
      for (auto [r, offset] : llvm::zip(op.getResults(), offsets.asArrayRef())) {
        if (BlockArgument target = inPlace.lookup(r)) {
          tensorOf[r] = tensorOf.at(target);
          overwrittenBy[target] = &op;
        } else {
          if (offset < 0 && !isOnHost(r))
            return op.emitOpError() << "result has no arena offset";
          if (failed(addTensor(r, "t" + std::to_string(temporaryCount++),
                               pp::TensorKind::Temporary, offset, pp::InitKind::None, 0.0, {})))
            return failure();
        }
        outputs.push_back(tensorOf.at(r));
      }
      auto in = fbb.CreateVector(inputs);
      auto out = fbb.CreateVector(outputs);
      auto intsOff = fbb.CreateVector(lowered->ints);
      auto floatsOff = fbb.CreateVector(lowered->floats);
      auto locOff = fbb.CreateString(locationString(op.getLoc()));
      auto functionOff =
          lowered->function.empty() ? 0 : fbb.CreateString(lowered->function);
      int32_t chunk = -1;
      auto segment = static_cast<pp::Segment>(getSegment(&op).value_or(SegmentKind::Step));
      if (auto stage = op.getAttrOfType<IntegerAttr>(PtcDialect::kStageAttrName))
        chunk = static_cast<int32_t>(stage.getInt());
      if (auto send = dyn_cast<SendOp>(op))
        sends[send.getChannel()] = {&op, inputs[0]};
      if (auto recv = dyn_cast<RecvOp>(op))
        recvs[recv.getChannel()] = {&op, outputs[0]};
      instructions.push_back(pp::CreateInstruction(fbb, lowered->code, in, out, intsOff, floatsOff,
                                                   functionOff, locOff, chunk, segment,
                                                   op.hasAttr(PtcDialect::kOnHostAttrName)));
    }

    std::vector<fb::Offset<pp::Output>> outputs;
    // The optimizer by name: the one the optimizer pass recorded with its
    // settings (Muon), else the fused updates'.
    std::string optimizer;
    if (auto named = func->getAttrOfType<StringAttr>(PtcDialect::kOptimizerAttrName)) {
      optimizer = named.str();
    } else {
      func.walk([&](FusedUpdateOpInterface update) {
        optimizer = update.getOptimizerName().str();
      });
    }
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      std::string name;
      if (func.getResultAttr(i, PtcDialect::kLossAttrName))
        name = "loss";
      else if (func.getResultAttr(i, PtcDialect::kGradNormAttrName))
        name = "grad_norm";
      else if (func.getResultAttr(i, PtcDialect::kLossScaleAttrName))
        name = "loss_scale";
      else if (func.getResultAttr(i, PtcDialect::kLrAttrName))
        name = "lr";
      else if (func.getResultAttr(i, PtcDialect::kSkippedAttrName))
        name = "skipped";
      else if (func.getResultAttr(i, PtcDialect::kLogitsAttrName))
        name = "logits";
      else if (auto m = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kMetricAttrName))
        name = "metric:" + m.str();
      else if (auto p = func.getResultAttrOfType<StringAttr>(i, PtcDialect::kGradAttrName))
        name = "grad:" + p.str();
      else if (func.getResultAttr(i, PtcDialect::kUpdateAttrName) ||
               func.getResultAttr(i, PtcDialect::kWorkingCopyAttrName))
        continue; // written in place
      else
        return func.emitError() << "result #" << i << " has no role (ptc.loss, ptc.grad, "
                                << "ptc.grad_norm, ptc.logits or ptc.update)";
      outputs.push_back(pp::CreateOutput(fbb, fbb.CreateString(name), tensorOf.at(v)));
    }

    std::vector<fb::Offset<pp::MeshAxis>> meshAxes;
    int32_t numRanks = 1;
    if (mesh)
      for (auto [name, size] : llvm::zip(mesh->axes, mesh->sizes)) {
        meshAxes.push_back(pp::CreateMeshAxis(fbb, fbb.CreateString(name), static_cast<int32_t>(size)));
        numRanks *= static_cast<int32_t>(size);
      }
    fb::Offset<pp::Pipeline> pipelineOff;
    int32_t microbatches = 1;
    if (auto mb = func->getAttrOfType<IntegerAttr>(PtcDialect::kMicrobatchesAttrName))
      microbatches = static_cast<int32_t>(mb.getInt());
    if (pipelineAttr) {
      FailureOr<fb::Offset<pp::Pipeline>> built =
          exportPipeline(fbb, func, pipelineAttr, mesh ? &*mesh : nullptr, sends, recvs);
      if (failed(built))
        return failure();
      pipelineOff = *built;
    }
    double modelFlops = 0.0;
    if (auto flops = func->getAttrOfType<FloatAttr>(PtcDialect::kModelFlopsAttrName))
      modelFlops = flops.getValueAsDouble();
    bool hostState = false;
    for (BlockArgument arg : func.getArguments())
      hostState |= isOnHost(arg);
    if (!offloadPath.empty() && !hostState)
      return func.emitError() << "offload-target=nvme keeps offload=optimizer's host model state "
                                 "in a file: it needs offload=optimizer";
    StringAttr modelInfo;
    if (auto module = func->getParentOfType<ModuleOp>())
      modelInfo = module->getAttrOfType<StringAttr>(PtcDialect::kModelInfoAttrName);
    auto plan = pp::CreatePlan(
        fbb, ::ptc::plan::kFormatVersion, fbb.CreateString("ptc-opt"), numRanks,
        mesh ? fbb.CreateVector(meshAxes) : 0, fbb.CreateVector(tensors),
        fbb.CreateVector(instructions), fbb.CreateVector(outputs), arenaAttr.getInt(),
        unsharedAttr.getInt(), fbb.CreateString(optimizer), microbatches, pipelineOff,
        modelFlops, offloadPath.empty() ? 0 : fbb.CreateString(offloadPath.getValue()),
        modelInfo ? fbb.CreateString(modelInfo.getValue().str()) : 0);
    pp::FinishPlanBuffer(fbb, plan);

    // The stash report (and its device-memory verdict) before the file: a
    // plan that does not fit is not written.
    if (reportStash && pipelineOff.o != 0 && failed(reportPipelineStash(func, fbb)))
      return failure();
    std::error_code ec;
    llvm::raw_fd_ostream os(output, ec, llvm::sys::fs::OF_None);
    if (ec)
      return func.emitError() << "cannot write plan '" << output << "': " << ec.message();
    os.write(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize());
    return success();
  }

  /// The activation stash of every pipeline rank: the written plan loaded and
  /// verified as ptc-run loads it, each rank's schedule simulated with the
  /// executor's segment code, so the prediction is the runtime's own.
  LogicalResult reportPipelineStash(func::FuncOp func, fb::FlatBufferBuilder &fbb) {
    std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    auto loaded = ::ptc::LoadedPlan::loadBytes(std::move(bytes), output);
    if (!loaded.isOk())
      return func.emitError() << "the written plan does not load: " << loaded.status().message();
    const ::ptc::LoadedPlan &plan = **loaded;
    llvm::raw_ostream &os = llvm::outs();
    os << "ptc-export-plan: activation stash per pipeline rank (values waiting between segments "
          "and micro-batches; the schedule simulated on the plan)\n";
    int64_t worst = -1;
    int worstRank = 0;
    for (int r = 0; r < plan.pipeline().ranks; ++r) {
      auto segments = ::ptc::derivePipelineSegments(plan, r);
      if (!segments.isOk())
        return func.emitError() << "pipeline rank " << r << ": " << segments.status().message();
      int64_t stash = ::ptc::simulateStashPeak(plan, *segments, r);
      int64_t peak = ::ptc::predictedPeakBytes(plan, r) + stash;
      os << "  rank " << r << ": stash " << stash << " B, peak with the stash " << peak << " B\n";
      if (peak > worst) {
        worst = peak;
        worstRank = r;
      }
    }
    os << "  predicted peak with the stash: " << worst << " B on pipeline rank " << worstRank
       << "\n";
    os.flush();
    if (deviceMemory.empty())
      return success();
    FailureOr<double> budget = parseByteSize(deviceMemory);
    if (failed(budget))
      return func.emitError() << "device-memory '" << deviceMemory
                              << "' is not a byte size (e.g. 80GB, 512MiB)";
    if (static_cast<double>(worst) > *budget)
      return func.emitError() << "predicted peak " << worst << " B ("
                              << formatByteSize(static_cast<double>(worst)) << ") on pipeline rank "
                              << worstRank << " with its activation stash exceeds the device memory "
                              << describeByteSize(deviceMemory) << " (the stash: values waiting between segments "
                                 "and micro-batches of its schedule)";
    return success();
  }
};
} // namespace
