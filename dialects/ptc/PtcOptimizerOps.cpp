//===- PtcOptimizerOps.cpp - verifiers of the optimizer ops ---------------===//
//
// The ops of PtcOptimizerOps.td: fused updates (AdamW, SGD) with their
// hyperparameters' ranges and mixed precision's gradient types, the learning-
// rate schedule, gradient clipping, loss-scale unscaling.
//
//===----------------------------------------------------------------------===//

#include "dialects/ptc/PtcOps.h"
#include "kernels/common/lr_schedule.h"

#include <cmath>
#include <cstdio>
#include <limits>

using namespace mlir;
using namespace mlir::ptc;

namespace {
/// Shortest form of a number in diagnostics ("0.5", "1e-08", "inf").
std::string num(double v) {
  if (std::isinf(v))
    return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

LogicalResult checkHyperparameter(Operation *op, StringRef name, double value, double low,
                                  bool lowInclusive, double high) {
  bool ok = (lowInclusive ? value >= low : value > low) && value < high;
  if (!ok)
    return op->emitOpError() << name << " = " << num(value) << " must be in "
                             << (lowInclusive ? "[" : "(") << num(low) << ", " << num(high) << ")";
  return success();
}
} // namespace

/// An optimizer update's gradient has the parameter's type, or its shape in
/// bf16 or f16 for an f32 parameter (mixed precision's master weights).
static LogicalResult verifyOptimizerGrad(Operation *op, Value param, Value grad) {
  auto p = cast<RankedTensorType>(param.getType()), g = cast<RankedTensorType>(grad.getType());
  if (g == p)
    return success();
  if (g.getShape() != p.getShape())
    return op->emitOpError() << "gradient shape " << g << " differs from the parameter's " << p;
  if (!p.getElementType().isF32() || !(g.getElementType().isBF16() || g.getElementType().isF16()))
    return op->emitOpError() << "gradient type " << g
                             << " must be the parameter's, or bf16 / f16 for an f32 parameter, "
                                "not for "
                             << p;
  return success();
}

/// A working copy (the optional last result) is the new f32 parameter's shape
/// in bf16 or f16.
static LogicalResult verifyWorkingCopy(Operation *op, Value param, Value copy) {
  if (!copy)
    return success();
  auto p = cast<RankedTensorType>(param.getType()), c = cast<RankedTensorType>(copy.getType());
  if (!p.getElementType().isF32() || c.getShape() != p.getShape() ||
      !(c.getElementType().isBF16() || c.getElementType().isF16()))
    return op->emitOpError() << "working copy " << c
                             << " must be an f32 parameter's shape in bf16 or f16, for " << p;
  return success();
}

StringRef AdamWUpdateOp::getOptimizerName() { return "adamw"; }
StringRef SgdUpdateOp::getOptimizerName() { return "sgd"; }

LogicalResult AdamWUpdateOp::verify() {
  if (failed(verifyOptimizerGrad(*this, getParam(), getGrad())) ||
      failed(verifyWorkingCopy(*this, getParam(), getWorkingCopy())))
    return failure();
  const double inf = std::numeric_limits<double>::infinity();
  if (failed(checkHyperparameter(*this, "lr", getLr().convertToDouble(), 0, true, inf)) ||
      failed(checkHyperparameter(*this, "beta1", getBeta1().convertToDouble(), 0, true, 1)) ||
      failed(checkHyperparameter(*this, "beta2", getBeta2().convertToDouble(), 0, true, 1)) ||
      failed(checkHyperparameter(*this, "eps", getEps().convertToDouble(), 0, false, inf)) ||
      failed(checkHyperparameter(*this, "weight_decay", getWeightDecay().convertToDouble(), 0,
                                 true, inf)))
    return failure();
  return success();
}

LogicalResult LrScheduleOp::verify() {
  StringRef kind = getKind();
  const std::optional<::ptc::kernels::LrScheduleKind> schedule =
      ::ptc::kernels::lookupLrScheduleKind(kind);
  if (!schedule)
    return emitOpError() << "kind must be constant, cosine or linear, got '" << kind << "'";
  double lr = getLr().convertToDouble(), minLr = getMinLr().convertToDouble();
  if (!(lr >= 0.0) || !(minLr >= 0.0) || minLr > lr)
    return emitOpError() << "needs 0 <= min_lr <= lr, got lr " << lr << " and min_lr " << minLr;
  int64_t warmup = getWarmupStepsAttr().getInt(), decay = getDecayStepsAttr().getInt();
  if (warmup < 0)
    return emitOpError() << "warmup_steps must be >= 0, got " << warmup;
  if (*schedule != ::ptc::kernels::LrScheduleKind::Constant && decay <= warmup)
    return emitOpError() << "decay_steps (" << decay << ") must exceed warmup_steps (" << warmup
                         << ")";
  return success();
}

LogicalResult SgdUpdateOp::verify() {
  if (failed(verifyOptimizerGrad(*this, getParam(), getGrad())) ||
      failed(verifyWorkingCopy(*this, getParam(), getWorkingCopy())))
    return failure();
  const double inf = std::numeric_limits<double>::infinity();
  if (failed(checkHyperparameter(*this, "lr", getLr().convertToDouble(), 0, true, inf)) ||
      failed(checkHyperparameter(*this, "momentum", getMomentum().convertToDouble(), 0, true, inf)) ||
      failed(checkHyperparameter(*this, "weight_decay", getWeightDecay().convertToDouble(), 0,
                                 true, inf)))
    return failure();
  return success();
}

/// One result per gradient, of its type (clipping, unscaling).
LogicalResult verifyOnePerGrad(Operation *op, ValueRange grads, ValueRange results,
                               StringRef what) {
  if (results.size() != grads.size())
    return op->emitOpError() << "expected " << grads.size() << " " << what << " results, got "
                             << results.size();
  for (auto [i, pair] : llvm::enumerate(llvm::zip(grads, results)))
    if (std::get<0>(pair).getType() != std::get<1>(pair).getType())
      return op->emitOpError() << what << " result #" << i << " must have the type of grad #" << i
                               << ", " << std::get<0>(pair).getType();
  return success();
}

LogicalResult ClipGradNormOp::verify() {
  if (failed(verifyOnePerGrad(*this, getGrads(), getClipped(), "clipped")))
    return failure();
  if (std::optional<ArrayRef<double>> weights = getWeights()) {
    if (weights->size() != getGrads().size())
      return emitOpError() << "has " << weights->size() << " weights for " << getGrads().size()
                           << " gradients";
    for (auto [i, w] : llvm::enumerate(*weights))
      if (!(w > 0.0 && w <= 1.0)) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", w);
        return emitOpError() << "weight #" << i << " is " << text
                             << ": a gradient counts with 1 / its copies, in (0, 1]";
      }
  }
  const double inf = std::numeric_limits<double>::infinity();
  return checkHyperparameter(*this, "max_norm", getMaxNorm().convertToDouble(), 0, false, inf);
}

LogicalResult UnscaleGradsOp::verify() {
  return verifyOnePerGrad(*this, getGrads(), getUnscaled(), "unscaled");
}

LogicalResult AnyNonfiniteOp::verify() {
  // An empty check joins its axes' reduction only (the flag of a pipeline
  // rank whose stages hold no parameter).
  if (getTensors().empty() && (!getAxes() || getAxes()->empty()))
    return emitOpError() << "needs at least one tensor to check, or mesh axes whose flag it joins";
  return success();
}
