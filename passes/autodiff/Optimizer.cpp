//===- Optimizer.cpp - append optimizer updates after the backward pass ---===//
//
// AdamW and SGD are one fused op per parameter; Adafactor and Muon are built
// from primitive ops (Adafactor's row/column means and the update's RMS are
// reductions, Muon's Newton-Schulz iterations batched matmuls), so that
// sharding them under ZeRO or tensor parallelism is the ops' ordinary rules:
// a mean over a split dimension becomes a partial sum and ptc-shard inserts
// the all-reduce; Muon's stacks of matrices carry the split that deals them
// over dp (ptc-propagate-sharding, muonDefaults).

#include "passes/autodiff/Passes.h"

#include "kernels/common/lr_schedule.h"
#include "runtime/base/option_values.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstdio>

namespace mlir::ptc {
#define GEN_PASS_DEF_OPTIMIZERPASS
#include "passes/autodiff/Passes.h.inc"
} // namespace mlir::ptc

using namespace mlir;
using namespace mlir::ptc;
using ::ptc::FloatDtype;
using ::ptc::OptimizerKind;
using ::ptc::parseOption;
using ::ptc::kernels::LrScheduleKind;
using ::ptc::kernels::lookupLrScheduleKind;

namespace {
/// An f32 scalar constant (a 0-d tensor) of the optimizer's arithmetic.
Value scalarConstant(OpBuilder &b, Location loc, double v) {
  auto scalar = RankedTensorType::get({}, b.getF32Type());
  return arith::ConstantOp::create(
      b, loc, DenseElementsAttr::get(scalar, b.getF32FloatAttr(static_cast<float>(v))));
}

/// A setting as written back to the user: shortest round trip of a double.
std::string settingText(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

struct OptimizerPass : mlir::ptc::impl::OptimizerPassBase<OptimizerPass> {
  using OptimizerPassBase::OptimizerPassBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal() || func.getNumResults() == 0 ||
        !func.getResultAttr(0, PtcDialect::kLossAttrName))
      return; // not a differentiated training step
    const std::optional<OptimizerKind> kind = parseOption<OptimizerKind>(optimizer);
    if (!kind || *kind == OptimizerKind::None) {
      func.emitError() << "unknown optimizer '" << optimizer
                       << "' (expected adamw, sgd, adafactor or muon)";
      return signalPassFailure();
    }
    const bool muon = *kind == OptimizerKind::Muon;
    const bool adamw = *kind == OptimizerKind::AdamW;
    const bool adafactor = *kind == OptimizerKind::Adafactor;
    const std::optional<FloatDtype> nsDtype = parseOption<FloatDtype>(muonNsDtype);
    if (muon) {
      // Each setting that cannot take effect, by name.
      std::string bad;
      auto check = [&](bool ok, const Twine &what) {
        if (!ok)
          bad += (bad.empty() ? "" : "; ") + what.str();
      };
      check(muonMomentum >= 0.0 && muonMomentum < 1.0,
            "muon-momentum=" + settingText(muonMomentum) + " is not in [0, 1)");
      check(muonNsSteps >= 1, "muon-ns-steps=" + Twine(muonNsSteps.getValue()) + " is not >= 1");
      check(nsDtype == FloatDtype::F32 || nsDtype == FloatDtype::Bf16,
            "muon-ns-dtype='" + muonNsDtype.getValue() + "' is not f32 or bf16");
      check(muonScale > 0.0, "muon-scale=" + settingText(muonScale) + " is not > 0");
      check(muonRanks >= 0, "muon-ranks=" + Twine(muonRanks.getValue()) + " is not >= 0");
      if (!bad.empty()) {
        func.emitError() << "optimizer=muon: " << bad;
        return signalPassFailure();
      }
    }
    if (adafactor) {
      if (!(adafactorBeta1 >= 0.0 && adafactorBeta1 < 1.0) || !(adafactorEps > 0.0) ||
          !(clipThreshold > 0.0) || !(decayRate > 0.0 && decayRate <= 1.0)) {
        func.emitError() << "adafactor needs 0 <= adafactor-beta1 (" << adafactorBeta1.getValue()
                         << ") < 1, adafactor-eps (" << adafactorEps.getValue()
                         << ") > 0, clip-threshold (" << clipThreshold.getValue()
                         << ") > 0 and 0 < decay-rate (" << decayRate.getValue() << ") <= 1";
        return signalPassFailure();
      }
    }
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
    SmallVector<unsigned> metrics; // reported as they are
    for (unsigned r = 1; r < func.getNumResults(); ++r) {
      if (func.getResultAttr(r, PtcDialect::kMetricAttrName)) {
        metrics.push_back(r);
        continue;
      }
      auto name = func.getResultAttrOfType<StringAttr>(r, PtcDialect::kGradAttrName);
      if (!name) {
        func.emitError() << "result #" << r << " is not a 'ptc.grad' result; run ptc-optimizer "
                         << "directly after ptc-autodiff";
        return signalPassFailure();
      }
      for (BlockArgument arg : paramsByName.lookup(name.getValue()))
        entries.push_back({arg, name, ret.getOperand(r)});
    }

    // Muon takes the hidden matrices; AdamW every other parameter.
    SmallVector<bool> orthogonalized(entries.size(), false);
    if (muon)
      for (auto [i, e] : llvm::enumerate(entries))
        orthogonalized[i] = isHiddenMatrix(e.param);

    // Optimizer state arguments go right after the last parameter.
    unsigned insertAt = 0;
    for (const Entry &e : entries)
      insertAt = std::max(insertAt, e.param.getArgNumber() + 1);
    // Every state argument in the order addState hands them out, inserted in
    // one call (one at a time rebuilds the signature each time: quadratic).
    // Per-parameter state says whose it is (ptc.state_of: the parameter's
    // name, and for a factored second moment the dimension it averages out).
    struct State {
      Type type;
      std::string name;
      DictionaryAttr of;
    };
    SmallVector<State> states;
    auto stateOf = [&](StringAttr param, int64_t dropped = -1) {
      SmallVector<NamedAttribute> entries{b.getNamedAttr("param", param)};
      if (dropped >= 0)
        entries.push_back(b.getNamedAttr("dropped_dim", b.getI64IntegerAttr(dropped)));
      return b.getDictionaryAttr(entries);
    };
    auto scalarType = RankedTensorType::get({}, b.getF32Type());
    if (dynamicLossScale) {
      states.push_back({scalarType, "loss_scale.exponent", {}});
      states.push_back({scalarType, "loss_scale.good_steps", {}});
    }
    if (!std::isfinite(maxGradNorm) || maxGradNorm < 0) {
      func.emitError() << "max-grad-norm=" << llvm::formatv("{0}", maxGradNorm.getValue()).str()
                       << " must be a finite norm >= 0 (0: no clipping)";
      return signalPassFailure();
    }
    if (warmupSteps < 0 || decaySteps < 0) {
      func.emitError() << "warmup-steps (" << warmupSteps.getValue() << ") and decay-steps ("
                       << decaySteps.getValue() << ") must be >= 0";
      return signalPassFailure();
    }
    const std::optional<LrScheduleKind> schedule = lookupLrScheduleKind(lrSchedule);
    const bool scheduled = schedule != LrScheduleKind::Constant || warmupSteps > 0;
    if (!schedule) {
      func.emitError() << "lr-schedule must be constant, cosine or linear, got '"
                       << lrSchedule << "'";
      return signalPassFailure();
    }
    if (schedule == LrScheduleKind::Constant && (minLr != 0.0 || decaySteps != 0)) {
      func.emitError() << "min-lr (" << minLr.getValue() << ") and decay-steps ("
                       << decaySteps.getValue()
                       << ") say where a cosine or linear decay ends: they have no effect with "
                          "lr-schedule=constant";
      return signalPassFailure();
    }
    if (scheduled && (warmupSteps < 0 || minLr < 0.0 || minLr > lr ||
                      (schedule != LrScheduleKind::Constant && decaySteps <= warmupSteps))) {
      func.emitError() << "lr-schedule=" << lrSchedule << " needs 0 <= warmup-steps ("
                       << warmupSteps.getValue() << ") < decay-steps (" << decaySteps.getValue()
                       << ") and 0 <= min-lr (" << minLr.getValue() << ") <= lr ("
                       << lr.getValue() << ")";
      return signalPassFailure();
    }
    const bool counted = adamw || adafactor || muon || scheduled; // the step count is state
    if (counted)
      states.push_back({scalarType, "optimizer.step", {}});
    for (auto [i, e] : llvm::enumerate(entries)) {
      if (muon && orthogonalized[i]) {
        states.push_back(
            {e.param.getType(), e.name.str() + ".momentum_buffer", stateOf(e.name)});
      } else if (adamw || muon) {
        states.push_back({e.param.getType(), e.name.str() + ".exp_avg", stateOf(e.name)});
        states.push_back({e.param.getType(), e.name.str() + ".exp_avg_sq", stateOf(e.name)});
      } else if (adafactor) {
        auto t = cast<RankedTensorType>(e.param.getType());
        if (!t.getElementType().isF32()) {
          func.emitError() << "optimizer=adafactor needs f32 parameters, '" << e.name.getValue()
                           << "' is " << t << " (precision=bf16 keeps f32 master weights)";
          return signalPassFailure();
        }
        if (adafactorBeta1 > 0.0)
          states.push_back({t, e.name.str() + ".exp_avg", stateOf(e.name)});
        for (auto &[stateType, suffix, dropped] : adafactorStates(t))
          states.push_back({stateType, e.name.str() + suffix, stateOf(e.name, dropped)});
      } else {
        states.push_back(
            {e.param.getType(), e.name.str() + ".momentum_buffer", stateOf(e.name)});
      }
    }
    bool inserted = false;
    size_t nextState = 0;
    auto addState = [&](Type type, const Twine &name) -> BlockArgument {
      if (!inserted) {
        SmallVector<unsigned> at(states.size(), insertAt);
        SmallVector<Type> types;
        SmallVector<DictionaryAttr> attrs;
        for (const State &st : states) {
          types.push_back(st.type);
          SmallVector<NamedAttribute> entries{
              b.getNamedAttr(PtcDialect::kStateAttrName, b.getStringAttr(st.name))};
          if (st.of)
            entries.push_back(b.getNamedAttr(PtcDialect::kStateOfAttrName, st.of));
          attrs.push_back(b.getDictionaryAttr(entries));
        }
        SmallVector<Location> locs(states.size(), loc);
        if (failed(func.insertArguments(at, types, attrs, locs)))
          return {};
        inserted = true;
      }
      assert(nextState < states.size() && states[nextState].type == type &&
             states[nextState].name == name.str() && "state arguments in the planned order");
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
    } else if (skipNonfinite && !adafactor) {
      // AdamW and SGD skip in their kernels (Muon's matrices: see
      // muonMomentumStep); the check only reads the gradients (no copy, no memory), a widened one before its widening
      // (exact for inf and NaN; the widening may then fuse into the update).
      // Not for Adafactor yet: its updates are primitive ops blended by the
      // flag, which needs the non-finite entries zeroed (ptc.unscale_grads),
      // a copy that runs on whole gradients (ZeRO would all-reduce them
      // instead of reduce-scattering).
      Location checkLoc = NameLoc::get(b.getStringAttr("optimizer:nonfinite"));
      SmallVector<Value> checked;
      for (Value g : grads) {
        auto widen = g.getDefiningOp<ConvertOp>();
        checked.push_back(widen ? widen.getInput() : g);
      }
      skip = AnyNonfiniteOp::create(b, checkLoc, scalar, checked, ArrayAttr());
    }
    Value gradNorm;
    if (maxGradNorm > 0.0) {
      SmallVector<Type> types;
      for (Value g : grads)
        types.push_back(g.getType());
      types.push_back(RankedTensorType::get({}, b.getF32Type()));
      auto clip = ClipGradNormOp::create(b, loc, types, grads, b.getF64FloatAttr(maxGradNorm),
                                         ArrayAttr(), DenseF64ArrayAttr());
      for (auto [i, c] : llvm::enumerate(clip.getClipped()))
        grads[i] = c;
      gradNorm = clip.getNorm();
    }

    SmallVector<Value> results{ret.getOperand(0)};
    SmallVector<DictionaryAttr> resultAttrs{func.getResultAttrDict(0)};
    for (unsigned r : metrics) {
      results.push_back(ret.getOperand(r));
      resultAttrs.push_back(func.getResultAttrDict(r));
    }
    if (gradNorm) {
      results.push_back(gradNorm);
      resultAttrs.push_back(
          b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kGradNormAttrName, b.getUnitAttr())));
    }
    if (skip) {
      results.push_back(skip);
      resultAttrs.push_back(
          b.getDictionaryAttr(b.getNamedAttr(PtcDialect::kSkippedAttrName, b.getUnitAttr())));
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

    Value step, scheduledLr, nextStep;
    if (counted) {
      BlockArgument stepArg = addState(scalar, "optimizer.step");
      Value one = scalarConstant(b, loc, 1.0);
      // The step this update would be: Adafactor's decay needs it finite
      // (>= 1) even on a skipped step, whose results are then discarded.
      nextStep = AddOp::create(b, loc, stepArg, one);
      // An overflow of dynamic loss scaling does not count; a step skipped
      // for non-finite gradients does (the count stays rank-independent
      // under pipeline stages, where the flag is computed per rank).
      step = dynamicLossScale
                 ? Value(AddOp::create(b, loc, stepArg, SubOp::create(b, loc, one, skip)))
                 : nextStep;
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
    SmallVector<MuonMatrix> muonMatrices;
    for (auto [i, e] : llvm::enumerate(entries)) {
      Type t = e.param.getType();
      double wd = cast<RankedTensorType>(t).getRank() >= 2 ? weightDecay.getValue() : 0.0;
      std::string base = e.name.str();
      Location ploc = NameLoc::get(b.getStringAttr("optimizer:" + base));
      if (muon && orthogonalized[i]) {
        BlockArgument buf = addState(t, base + ".momentum_buffer");
        muonMatrices.push_back(muonMomentumStep(b, ploc, e.param, e.name, grads[i], buf, skip));
      } else if (adafactor) {
        buildAdafactor(b, ploc, e.param, grads[i], base, wd, nextStep, scheduledLr, skip, addState,
                       update);
      } else if (adamw || muon) {
        BlockArgument m = addState(t, base + ".exp_avg");
        BlockArgument v = addState(t, base + ".exp_avg_sq");
        auto op = AdamWUpdateOp::create(b, ploc, t, t, t, /*working_copy=*/Type(), e.param, grads[i], m, v, step, skip,
                                        scheduledLr, b.getF64FloatAttr(lr), b.getF64FloatAttr(beta1),
                                        b.getF64FloatAttr(beta2), b.getF64FloatAttr(eps),
                                        b.getF64FloatAttr(wd));
        update(op.getNewParam(), base);
        update(op.getNewExpAvg(), base + ".exp_avg");
        update(op.getNewExpAvgSq(), base + ".exp_avg_sq");
      } else {
        BlockArgument buf = addState(t, base + ".momentum_buffer");
        auto op = SgdUpdateOp::create(b, ploc, t, t, /*working_copy=*/Type(), e.param, grads[i], buf, skip, scheduledLr,
                                      b.getF64FloatAttr(lr), b.getF64FloatAttr(momentum),
                                      b.getF64FloatAttr(wd));
        update(op.getNewParam(), base);
        update(op.getNewMomentumBuffer(), base + ".momentum_buffer");
      }
    }
    if (!muonMatrices.empty())
      buildMuonUpdates(b, muonMatrices, scheduledLr, skip, update);
    // Auxiliary-loss-free balancing: bias += rate * sign(mean(load) - load),
    // from this step's load metric (summed over micro-batches already).
    for (BlockArgument arg : block.getArguments()) {
      auto spec = func.getArgAttrOfType<DictionaryAttr>(arg.getArgNumber(),
                                                        PtcDialect::kBiasBalancingAttrName);
      if (!spec)
        continue;
      StringRef load = spec.getAs<StringAttr>("load").getValue();
      double rate = spec.getAs<FloatAttr>("rate").getValueAsDouble();
      Value measured;
      for (unsigned r : metrics)
        if (func.getResultAttrOfType<StringAttr>(r, PtcDialect::kMetricAttrName).getValue() == load)
          measured = ret.getOperand(r);
      auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), PtcDialect::kStateAttrName);
      auto lt = measured ? dyn_cast<RankedTensorType>(measured.getType()) : RankedTensorType();
      if (!lt || lt.getRank() != 1 || lt.getShape() != cast<RankedTensorType>(arg.getType()).getShape()) {
        func.emitError() << "the bias '" << name.getValue() << "' balances against the metric '"
                         << load << "', which the step does not return with its shape "
                         << arg.getType();
        return signalPassFailure();
      }
      Location bloc = NameLoc::get(b.getStringAttr("optimizer:" + name.getValue()));
      Value mean = ReduceMeanOp::create(
          b, bloc, *inferReduceType(lt, {0}, false, [&] { return emitError(bloc); }), measured,
          b.getDenseI64ArrayAttr({0}), b.getBoolAttr(false));
      Value nudge = SignOp::create(b, bloc, SubOp::create(b, bloc, lt, mean, measured));
      update(AddOp::create(b, bloc, arg, ScaleOp::create(b, bloc, nudge, b.getF64FloatAttr(rate))),
             name.getValue());
    }
    if (counted)
      update(step, "optimizer.step");
    if (dynamicLossScale) {
      auto next = LossScaleUpdateOp::create(b, loc, scalar, scalar, scaleExp, scaleGood, skip,
                                            b.getI64IntegerAttr(lossScaleWindow));
      update(next.getNewExponent(), "loss_scale.exponent");
      update(next.getNewGoodSteps(), "loss_scale.good_steps");
    }

    replaceReturn(func, results, resultAttrs);
    if (muon) {
      func->setAttr(PtcDialect::kOptimizerAttrName,
                    b.getStringAttr("muon momentum=" + settingText(muonMomentum) + " nesterov=" +
                                    (muonNesterov ? "true" : "false") +
                                    " ns_steps=" + std::to_string(muonNsSteps) + " ns_dtype=" +
                                    muonNsDtype.getValue() + " scale=" + settingText(muonScale)));
    }
  }

  /// Muon's share of the parameters: a matrix (rank >= 2; a leading
  /// dimension batches matrices, as experts' weights do) that the step reads
  /// only as a matmul's lhs or rhs (through conversions, reshapes and
  /// transposes), no embedding table (tied or not) and not the output head
  /// (a product that reaches the cross-entropy through views and scales).
  static bool isHiddenMatrix(BlockArgument param) {
    if (cast<RankedTensorType>(param.getType()).getRank() < 2)
      return false;
    auto reachesLoss = [](Value v) {
      SmallVector<Value> work{v};
      while (!work.empty()) {
        Value x = work.pop_back_val();
        for (Operation *user : x.getUsers()) {
          if (isa<CrossEntropyOp>(user))
            return true;
          if (isa<ConvertOp, ReshapeOp, TransposeOp, ScaleOp>(user))
            work.push_back(user->getResult(0));
        }
      }
      return false;
    };
    bool multiplied = false;
    SmallVector<Value> work{param};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      for (OpOperand &use : v.getUses()) {
        Operation *user = use.getOwner();
        if (isa<ConvertOp, ReshapeOp, TransposeOp>(user)) {
          work.push_back(user->getResult(0));
          continue;
        }
        auto matmul = dyn_cast<MatmulOp>(user);
        if (!matmul || use.getOperandNumber() > 1 || reachesLoss(matmul.getResult()))
          return false;
        multiplied = true;
      }
    }
    return multiplied;
  }

  /// A hidden matrix between its momentum step and its update.
  struct MuonMatrix {
    BlockArgument param, buffer;
    StringAttr name;
    Value newBuffer, direction; // b and the matrix to orthogonalize (u)
    Location loc;
  };

  /// Muon's momentum: b = momentum * b + g, u = g + momentum * b (Nesterov)
  /// or b. Under `skip`, the gradient's non-finite entries are zeroed first
  /// (ptc.unscale_grads by 1), so that the blend of old and new values that
  /// skips the step reads finite values.
  MuonMatrix muonMomentumStep(OpBuilder &b, Location loc, BlockArgument param, StringAttr name,
                              Value g, BlockArgument buffer, Value skip) {
    auto scalar = RankedTensorType::get({}, b.getF32Type());
    Operation *readsGrad = nullptr;
    if (skip && !dynamicLossScale) {
      Value one = scalarConstant(b, loc, 1.0);
      auto finite = UnscaleGradsOp::create(b, loc, TypeRange{g.getType(), scalar}, ValueRange{g},
                                           one, ArrayAttr());
      readsGrad = finite;
      g = finite.getUnscaled()[0];
    }
    auto accumulate = AddOp::create(b, loc, g, ScaleOp::create(b, loc, buffer,
                                                               b.getF64FloatAttr(muonMomentum)));
    if (!readsGrad)
      readsGrad = accumulate;
    readsGrad->setAttr(PtcDialect::kOptimizerGradAttrName, name);
    Value direction = accumulate;
    if (muonNesterov)
      direction = AddOp::create(b, loc, g, ScaleOp::create(b, loc, accumulate,
                                                          b.getF64FloatAttr(muonMomentum)));
    return {param, buffer, name, accumulate, direction, loc};
  }

  /// Orthogonalizes the matrices (Newton-Schulz on stacks of equal shapes,
  /// dealt over `muon-ranks`) and applies each update.
  template <typename Update>
  void buildMuonUpdates(OpBuilder &b, ArrayRef<MuonMatrix> matrices, Value scheduledLr, Value skip,
                        Update &plainUpdate) {
    Location loc = NameLoc::get(b.getStringAttr("optimizer:muon"));
    auto constant = [&](double v) { return scalarConstant(b, loc, v); };
    // Stacks: the matrices of one shape in first-use order; with
    // muon-ranks R > 1 (and more than one matrix) dealt over dp, padded to a
    // multiple of R with repeats of its first matrices (whose results are
    // dropped): each rank then orthogonalizes ceil(k / R) matrices, where a
    // remainder computed whole would cost every rank k mod R more. Batched
    // matrices (rank > 2), and every matrix under muon-ranks=0, alone.
    llvm::MapVector<Type, SmallVector<const MuonMatrix *>> byShape;
    SmallVector<SmallVector<const MuonMatrix *>> alone;
    for (const MuonMatrix &m : matrices) {
      if (muonRanks > 0 && cast<RankedTensorType>(m.param.getType()).getRank() == 2)
        byShape[m.param.getType()].push_back(&m);
      else
        alone.push_back({&m});
    }
    SmallVector<std::pair<SmallVector<const MuonMatrix *>, bool>> stacks; // members, dealt
    for (auto &[type, members] : byShape)
      stacks.push_back({members, muonRanks > 1 && members.size() > 1});
    for (auto &members : alone)
      stacks.push_back({members, false});

    Type nsType = parseOption<FloatDtype>(muonNsDtype) == FloatDtype::Bf16 ? Type(b.getBF16Type())
                                                                           : Type(b.getF32Type());
    const double qa = 3.4445, qb = -4.7750, qc = 2.0315; // the quintic's coefficients
    Value rate = scheduledLr ? scheduledLr : constant(lr);
    for (auto &[members, dealt] : stacks) {
      auto pt = cast<RankedTensorType>(members.front()->param.getType());
      ArrayRef<int64_t> shape = pt.getShape();
      const int64_t rows = shape[shape.size() - 2], cols = shape.back();
      int64_t lead = 1;
      for (int64_t d : shape.drop_back(2))
        lead *= d;
      auto f32 = b.getF32Type();
      auto stackType = [&](int64_t k, Type element) {
        return RankedTensorType::get({k, rows, cols}, element);
      };
      SmallVector<Value> flat;
      for (const MuonMatrix *m : members)
        flat.push_back(ReshapeOp::create(b, loc, stackType(lead, f32), m->direction));
      if (dealt)
        for (size_t i = 0; flat.size() % static_cast<size_t>(muonRanks) != 0; ++i)
          flat.push_back(flat[i]);
      const int64_t k = lead * static_cast<int64_t>(flat.size());
      Value x = flat.size() == 1
                    ? flat.front()
                    : Value(ConcatOp::create(b, loc, stackType(k, f32), flat, b.getI64IntegerAttr(0)));
      SmallVector<Attribute> names;
      for (const MuonMatrix *m : members)
        names.push_back(m->name);
      auto stackAttr = b.getDictionaryAttr(
          {b.getNamedAttr("params", b.getArrayAttr(names)),
           b.getNamedAttr("dealt", b.getBoolAttr(dealt))});
      x.getDefiningOp()->setAttr(PtcDialect::kMuonStackAttrName, stackAttr);
      // X / (|X|_F + 1e-7), per matrix; |X| = s * rsqrt(s) with s = sum of
      // squares (and 1e-30 beside s, so that a zero matrix stays zero).
      RankedTensorType perMatrix = RankedTensorType::get({k, 1, 1}, f32);
      Value squares = ReduceSumOp::create(b, loc, perMatrix, MulOp::create(b, loc, x, x),
                                          b.getDenseI64ArrayAttr({1, 2}), b.getBoolAttr(true));
      Value norm = MulOp::create(b, loc, squares,
                                 RsqrtOp::create(b, loc, AddOp::create(b, loc, squares, constant(1e-30))));
      x = DivOp::create(b, loc, x, AddOp::create(b, loc, norm, constant(1e-7)));
      if (nsType != f32)
        x = ConvertOp::create(b, loc, stackType(k, nsType), x);
      // A tall matrix iterates on X^T X (its transpose's X X^T): the same
      // sequence of products, no transposed copy.
      const bool tall = rows > cols;
      auto matmul = [&](Value lhs, Value rhs, bool transposeLhs, bool transposeRhs) -> Value {
        return MatmulOp::create(b, loc, lhs, rhs, transposeLhs, transposeRhs);
      };
      auto scale = [&](Value v, double by) -> Value {
        return ScaleOp::create(b, loc, v, b.getF64FloatAttr(by));
      };
      for (int64_t step = 0; step < muonNsSteps; ++step) {
        Value gram = matmul(x, x, tall, !tall);
        Value poly = AddOp::create(b, loc, scale(gram, qb), scale(matmul(gram, gram, false, false), qc));
        Value product = tall ? matmul(x, poly, false, false) : matmul(poly, x, false, false);
        x = AddOp::create(b, loc, scale(x, qa), product);
      }
      x.getDefiningOp()->setAttr(PtcDialect::kMuonOrthogonalAttrName, stackAttr);
      if (nsType != f32)
        x = ConvertOp::create(b, loc, stackType(k, f32), x);
      const double factor = muonScale * std::sqrt(static_cast<double>(std::max(rows, cols)));
      for (auto [j, m] : llvm::enumerate(members)) {
        Location ploc = m->loc;
        Value o = ReshapeOp::create(
            b, ploc, pt,
            SliceOp::create(b, ploc, stackType(lead, f32), x,
                            b.getDenseI64ArrayAttr({static_cast<int64_t>(j) * lead, 0, 0})));
        Value p = m->param;
        if (weightDecay != 0.0)
          p = SubOp::create(b, ploc, p, MulOp::create(b, ploc, p, ScaleOp::create(b, ploc, rate, b.getF64FloatAttr(weightDecay))));
        Value newParam = SubOp::create(b, ploc, p, MulOp::create(b, ploc, o, ScaleOp::create(b, ploc, rate, b.getF64FloatAttr(factor))));
        Value newBuffer = m->newBuffer;
        if (skip) {
          // old * skip + (new - new * skip): exactly one of them (both are
          // finite), and every op reads a value of the matrix's pipeline
          // rank beside the flag (ptc-split-stages gives each rank its copy).
          auto blend = [&](Value old, Value fresh) -> Value {
            return AddOp::create(b, ploc, MulOp::create(b, ploc, old, skip),
                                 SubOp::create(b, ploc, fresh, MulOp::create(b, ploc, fresh, skip)));
          };
          newParam = blend(m->param, newParam);
          newBuffer = blend(m->buffer, newBuffer);
        }
        plainUpdate(newParam, m->name.getValue());
        plainUpdate(newBuffer, (m->name.getValue() + ".momentum_buffer").str());
      }
    }
  }

  /// Adafactor's second-moment state of a parameter of type `t`: factored
  /// (a row and a column mean, Hugging Face's exp_avg_sq_row / _col shapes)
  /// for rank >= 2, whole for vectors.
  /// Each: its type, its name's suffix and the parameter dimension it
  /// averages out (-1: none).
  static SmallVector<std::tuple<Type, std::string, int64_t>> adafactorStates(RankedTensorType t) {
    ArrayRef<int64_t> s = t.getShape();
    if (t.getRank() < 2)
      return {{t, ".exp_avg_sq", -1}};
    SmallVector<int64_t> row(s.drop_back()), col(s.drop_back(2));
    col.push_back(s.back());
    return {{RankedTensorType::get(row, t.getElementType()), ".exp_avg_sq_row", t.getRank() - 1},
            {RankedTensorType::get(col, t.getElementType()), ".exp_avg_sq_col", t.getRank() - 2}};
  }

  /// One Adafactor step (Shazeer & Stern 2018, as Hugging Face's Adafactor
  /// with relative_step=False, scale_parameter=False, warmup_init=False):
  /// ```
  /// b2 = 1 - t^-decay_rate;  s = g^2 + eps
  /// rank >= 2: R = b2 R + (1-b2) mean_cols(s);  C = b2 C + (1-b2) mean_rows(s)
  ///            u = rsqrt(R / mean(R)) rsqrt(C) g      (outer product of the factors)
  /// vectors:   V = b2 V + (1-b2) s;  u = rsqrt(V) g
  /// u = lr u / max(1, rms(u) / clip_threshold)
  /// [beta1 > 0: m = beta1 m + (1-beta1) u;  u = m]
  /// p = p - weight_decay lr p - u
  /// ```
  /// `skip` (or null): the overflow flag of dynamic loss scaling. Every
  /// result is then old * skip + new * (1 - skip): exactly the new value on a
  /// good step and the old one on a skipped step (the unscaled gradients are
  /// finite, non-finite entries zeroed, so the discarded values are finite).
  template <typename AddState, typename Update>
  void buildAdafactor(OpBuilder &b, Location loc, BlockArgument param, Value g, StringRef base,
                      double wd, Value step, Value scheduledLr, Value skip, AddState &addState,
                      Update &plainUpdate) {
    auto t = cast<RankedTensorType>(param.getType());
    const int64_t r = t.getRank();
    auto constant = [&](double v) { return scalarConstant(b, loc, v); };
    auto mean = [&](Value x, ArrayRef<int64_t> axes, bool keep) -> Value {
      RankedTensorType type = *inferReduceType(cast<RankedTensorType>(x.getType()), axes, keep,
                                               [&] { return emitError(loc); });
      return ReduceMeanOp::create(b, loc, type, x, b.getDenseI64ArrayAttr(axes),
                                  b.getBoolAttr(keep));
    };
    auto reshape = [&](Value x, ArrayRef<int64_t> shape) -> Value {
      return ReshapeOp::create(b, loc, RankedTensorType::get(shape, t.getElementType()), x);
    };
    Value one = constant(1.0);
    Value go = skip ? Value(SubOp::create(b, loc, one, skip)) : Value();
    auto update = [&](Value old, Value fresh, StringRef name) {
      if (skip)
        fresh = AddOp::create(b, loc, MulOp::create(b, loc, old, skip),
                              MulOp::create(b, loc, fresh, go));
      plainUpdate(fresh, name);
    };
    // The step's decay (CSE merges the parameters' copies of this chain).
    Value decay = ExpOp::create(b, loc, ScaleOp::create(b, loc, LogOp::create(b, loc, step),
                                                       b.getF64FloatAttr(-decayRate)));
    Value beta2 = SubOp::create(b, loc, one, decay);
    Value rest = SubOp::create(b, loc, one, beta2);
    auto average = [&](Value state, Value x) -> Value {
      return AddOp::create(b, loc, MulOp::create(b, loc, state, beta2),
                           MulOp::create(b, loc, x, rest));
    };

    BlockArgument m;
    if (adafactorBeta1 > 0.0)
      m = addState(t, base + ".exp_avg");
    auto square = MulOp::create(b, loc, g, g);
    square->setAttr(PtcDialect::kOptimizerGradAttrName, b.getStringAttr(base));
    Value s = AddOp::create(b, loc, square, constant(adafactorEps));
    Value u;
    SmallVector<std::tuple<Type, std::string, int64_t>> shapes = adafactorStates(t);
    if (r >= 2) {
      BlockArgument row = addState(std::get<0>(shapes[0]), base + ".exp_avg_sq_row");
      BlockArgument col = addState(std::get<0>(shapes[1]), base + ".exp_avg_sq_col");
      Value newRow = average(row, mean(s, {r - 1}, false));
      Value newCol = average(col, mean(s, {r - 2}, false));
      Value rowFactor = RsqrtOp::create(b, loc, DivOp::create(b, loc, newRow,
                                                                mean(newRow, {r - 2}, true)));
      SmallVector<int64_t> rowShape(t.getShape()), colShape(t.getShape());
      rowShape[r - 1] = 1;
      colShape[r - 2] = 1;
      Value colFactor = RsqrtOp::create(b, loc, newCol);
      Value factors = MulOp::create(b, loc, reshape(rowFactor, rowShape),
                                    reshape(colFactor, colShape));
      u = MulOp::create(b, loc, factors, g);
      update(row, newRow, (base + ".exp_avg_sq_row").str());
      update(col, newCol, (base + ".exp_avg_sq_col").str());
    } else {
      BlockArgument v = addState(t, base + ".exp_avg_sq");
      Value newV = average(v, s);
      u = MulOp::create(b, loc, RsqrtOp::create(b, loc, newV), g);
      update(v, newV, (base + ".exp_avg_sq").str());
    }
    // Update clipping: u / max(1, rms(u) / clip) = u * min(1, clip / rms(u)),
    // min(1, a) = 1 - relu(1 - a).
    SmallVector<int64_t> all;
    for (int64_t d = 0; d < r; ++d)
      all.push_back(d);
    Value meanSquare = r == 0 ? Value(MulOp::create(b, loc, u, u))
                              : mean(MulOp::create(b, loc, u, u), all, false);
    Value ratio = ScaleOp::create(b, loc, RsqrtOp::create(b, loc, meanSquare),
                                  b.getF64FloatAttr(clipThreshold));
    Value clip = SubOp::create(b, loc, one,
                               ReluOp::create(b, loc, SubOp::create(b, loc, one, ratio)));
    Value rate = scheduledLr ? scheduledLr : constant(lr);
    u = MulOp::create(b, loc, u, MulOp::create(b, loc, clip, rate));
    if (m) {
      Value newM = AddOp::create(b, loc, ScaleOp::create(b, loc, m, b.getF64FloatAttr(adafactorBeta1)),
                                 ScaleOp::create(b, loc, u, b.getF64FloatAttr(1.0 - adafactorBeta1)));
      update(m, newM, (base + ".exp_avg").str());
      u = newM;
    }
    Value p = param;
    if (wd != 0.0)
      p = SubOp::create(b, loc, p,
                        MulOp::create(b, loc, p, ScaleOp::create(b, loc, rate, b.getF64FloatAttr(wd))));
    update(param, SubOp::create(b, loc, p, u), base);
  }
};
} // namespace
