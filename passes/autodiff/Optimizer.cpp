//===- Optimizer.cpp - append AdamW / SGD updates after the backward pass -===//

#include "passes/autodiff/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::ptc {
#define GEN_PASS_DEF_OPTIMIZERPASS
#include "passes/autodiff/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;

namespace {
struct OptimizerPass : mlir::ptc::impl::OptimizerPassBase<OptimizerPass> {
  using OptimizerPassBase::OptimizerPassBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal() || func.getNumResults() == 0 ||
        !func.getResultAttr(0, PtcDialect::kLossAttrName))
      return; // not a differentiated training step
    if (optimizer != "adamw" && optimizer != "sgd") {
      func.emitError() << "unknown optimizer '" << optimizer << "' (expected adamw or sgd)";
      return signalPassFailure();
    }
    const bool adamw = optimizer == "adamw";
    Block &block = func.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    OpBuilder b(ret);
    Location loc = func.getLoc();

    // Pair each gradient result with its parameter argument.
    struct Entry {
      BlockArgument param;
      StringAttr name;
      Value grad;
    };
    SmallVector<Entry> entries;
    llvm::StringMap<SmallVector<BlockArgument, 1>> paramsByName;
    for (BlockArgument arg : block.getArguments())
      if (auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kParamAttrName))
        paramsByName[name.getValue()].push_back(arg);
    for (unsigned r = 1; r < func.getNumResults(); ++r) {
      auto name = func.getResultAttrOfType<StringAttr>(r, PtcDialect::kGradAttrName);
      if (!name) {
        func.emitError() << "result #" << r << " is not a 'ptc.grad' result; run ptc-optimizer "
                         << "directly after ptc-autodiff";
        return signalPassFailure();
      }
      for (BlockArgument arg : paramsByName.lookup(name.getValue()))
        entries.push_back({arg, name, ret.getOperand(r)});
    }

    // Optimizer state arguments go right after the last parameter.
    unsigned insertAt = 0;
    for (const Entry &e : entries)
      insertAt = std::max(insertAt, e.param.getArgNumber() + 1);
    // Every state argument in the order addState hands them out, inserted in
    // one call (one at a time rebuilds the signature each time: quadratic).
    SmallVector<std::pair<Type, std::string>> states;
    auto scalarType = RankedTensorType::get({}, b.getF32Type());
    if (dynamicLossScale) {
      states.push_back({scalarType, "loss_scale.exponent"});
      states.push_back({scalarType, "loss_scale.good_steps"});
    }
    const bool scheduled = lrSchedule != "constant" || warmupSteps > 0;
    if (lrSchedule != "constant" && lrSchedule != "cosine" && lrSchedule != "linear") {
      func.emitError() << "lr-schedule must be constant, cosine or linear, got '"
                       << lrSchedule << "'";
      return signalPassFailure();
    }
    if (scheduled && (warmupSteps < 0 || minLr < 0.0 || minLr > lr ||
                      (lrSchedule != "constant" && decaySteps <= warmupSteps))) {
      func.emitError() << "lr-schedule=" << lrSchedule << " needs 0 <= warmup-steps ("
                       << warmupSteps.getValue() << ") < decay-steps (" << decaySteps.getValue()
                       << ") and 0 <= min-lr (" << minLr.getValue() << ") <= lr ("
                       << lr.getValue() << ")";
      return signalPassFailure();
    }
    const bool counted = adamw || scheduled; // the step count is state
    if (counted)
      states.push_back({scalarType, "optimizer.step"});
    for (const Entry &e : entries) {
      if (adamw) {
        states.push_back({e.param.getType(), e.name.str() + ".exp_avg"});
        states.push_back({e.param.getType(), e.name.str() + ".exp_avg_sq"});
      } else {
        states.push_back({e.param.getType(), e.name.str() + ".momentum_buffer"});
      }
    }
    bool inserted = false;
    size_t nextState = 0;
    auto addState = [&](Type type, const Twine &name) -> BlockArgument {
      if (!inserted) {
        SmallVector<unsigned> at(states.size(), insertAt);
        SmallVector<Type> types;
        SmallVector<DictionaryAttr> attrs;
        for (auto &[t, n] : states) {
          types.push_back(t);
          attrs.push_back(b.getDictionaryAttr(
              b.getNamedAttr(PtcDialect::kStateAttrName, b.getStringAttr(n))));
        }
        SmallVector<Location> locs(states.size(), loc);
        if (failed(func.insertArguments(at, types, attrs, locs)))
          return {};
        inserted = true;
      }
      assert(nextState < states.size() && states[nextState].first == type &&
             states[nextState].second == name.str() && "state arguments in the planned order");
      (void)type;
      return func.getArgument(insertAt + static_cast<unsigned>(nextState++));
    };

    SmallVector<Value> grads;
    for (const Entry &e : entries)
      grads.push_back(e.grad);

    // Dynamic loss scaling: the backward pass starts from the current scale;
    // gradients are unscaled and checked; a step with an overflow changes
    // nothing but the scale.
    auto scalar = RankedTensorType::get({}, b.getF32Type());
    Value skip, scale;
    BlockArgument scaleExp, scaleGood;
    if (dynamicLossScale) {
      Operation *seed = nullptr;
      func.walk([&](arith::ConstantOp c) {
        if (c->hasAttr(PtcDialect::kLossSeedAttrName))
          seed = c;
      });
      if (!seed) {
        func.emitError() << "dynamic loss scaling needs the backward pass's seed; run "
                            "ptc-autodiff (without loss-scale) first";
        return signalPassFailure();
      }
      if (lossScaleInit <= 0.0 || lossScaleWindow < 1) {
        func.emitError() << "loss-scale-init must be > 0 and loss-scale-window >= 1";
        return signalPassFailure();
      }
      scaleExp = addState(scalar, "loss_scale.exponent");
      scaleGood = addState(scalar, "loss_scale.good_steps");
      OpBuilder sb = OpBuilder::atBlockBegin(&block);
      scale = LossScaleOp::create(sb, loc, scalar, scaleExp, sb.getF64FloatAttr(lossScaleInit));
      seed->getResult(0).replaceAllUsesWith(scale);
      seed->erase();
      SmallVector<Type> types;
      for (Value g : grads)
        types.push_back(g.getType());
      types.push_back(scalar);
      auto unscale = UnscaleGradsOp::create(b, loc, types, grads, scale, ArrayAttr());
      for (auto [i, u] : llvm::enumerate(unscale.getUnscaled()))
        grads[i] = u;
      skip = unscale.getFoundInf();
    }
    Value gradNorm;
    if (maxGradNorm > 0.0) {
      SmallVector<Type> types;
      for (Value g : grads)
        types.push_back(g.getType());
      types.push_back(RankedTensorType::get({}, b.getF32Type()));
      auto clip = ClipGradNormOp::create(b, loc, types, grads, b.getF64FloatAttr(maxGradNorm),
                                         ArrayAttr());
      for (auto [i, c] : llvm::enumerate(clip.getClipped()))
        grads[i] = c;
      gradNorm = clip.getNorm();
    }

    SmallVector<Value> results{ret.getOperand(0)};
    SmallVector<DictionaryAttr> resultAttrs{func.getResultAttrDict(0)};
    if (gradNorm) {
      results.push_back(gradNorm);
      resultAttrs.push_back(
          b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kGradNormAttrName, b.getUnitAttr())));
    }
    if (scale) {
      results.push_back(scale);
      resultAttrs.push_back(
          b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kLossScaleAttrName, b.getUnitAttr())));
    }
    auto update = [&](Value v, StringRef name) {
      results.push_back(v);
      resultAttrs.push_back(b.getDictionaryAttr(
          b.getNamedAttr(PtcDialect::kUpdateAttrName, b.getStringAttr(name))));
    };

    Value step, scheduledLr;
    if (counted) {
      BlockArgument stepArg = addState(scalar, "optimizer.step");
      Value one = arith::ConstantOp::create(
          b, loc, DenseElementsAttr::get(scalar, b.getF32FloatAttr(1.0f)));
      if (skip) // a skipped step does not count
        one = SubOp::create(b, loc, one, skip);
      step = AddOp::create(b, loc, stepArg, one);
    }
    if (scheduled) {
      scheduledLr = LrScheduleOp::create(b, NameLoc::get(b.getStringAttr("optimizer:lr")), scalar,
                                         step, b.getStringAttr(lrSchedule),
                                         b.getF64FloatAttr(lr), b.getF64FloatAttr(minLr),
                                         b.getI64IntegerAttr(warmupSteps),
                                         b.getI64IntegerAttr(decaySteps));
      results.push_back(scheduledLr);
      resultAttrs.push_back(
          b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kLrAttrName, b.getUnitAttr())));
    }
    for (auto [i, e] : llvm::enumerate(entries)) {
      Type t = e.param.getType();
      double wd = cast<RankedTensorType>(t).getRank() >= 2 ? weightDecay.getValue() : 0.0;
      std::string base = e.name.str();
      Location ploc = NameLoc::get(b.getStringAttr("optimizer:" + base));
      if (adamw) {
        BlockArgument m = addState(t, base + ".exp_avg");
        BlockArgument v = addState(t, base + ".exp_avg_sq");
        auto op = AdamWUpdateOp::create(b, ploc, t, t, t, e.param, grads[i], m, v, step, skip,
                                        scheduledLr, b.getF64FloatAttr(lr), b.getF64FloatAttr(beta1),
                                        b.getF64FloatAttr(beta2), b.getF64FloatAttr(eps),
                                        b.getF64FloatAttr(wd));
        update(op.getNewParam(), base);
        update(op.getNewExpAvg(), base + ".exp_avg");
        update(op.getNewExpAvgSq(), base + ".exp_avg_sq");
      } else {
        BlockArgument buf = addState(t, base + ".momentum_buffer");
        auto op = SgdUpdateOp::create(b, ploc, t, t, e.param, grads[i], buf, skip, scheduledLr,
                                      b.getF64FloatAttr(lr), b.getF64FloatAttr(momentum),
                                      b.getF64FloatAttr(wd));
        update(op.getNewParam(), base);
        update(op.getNewMomentumBuffer(), base + ".momentum_buffer");
      }
    }
    if (counted)
      update(step, "optimizer.step");
    if (skip) {
      auto next = LossScaleUpdateOp::create(b, loc, scalar, scalar, scaleExp, scaleGood, skip,
                                            b.getI64IntegerAttr(lossScaleWindow));
      update(next.getNewExponent(), "loss_scale.exponent");
      update(next.getNewGoodSteps(), "loss_scale.good_steps");
    }

    replaceReturn(func, results, resultAttrs);
  }
};
} // namespace
