#include "runtime/session/step_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace ptc {
namespace {
/// Min, max and mean of a vector metric.
struct Summary {
  double min, max, mean;
};
Summary summarize(const std::vector<float> &v) {
  double sum = 0.0;
  for (float x : v)
    sum += x;
  return {*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
          sum / static_cast<double>(v.size())};
}

/// The plan's model FLOPs per device per second, in TFLOP/s (nullopt: unknown).
std::optional<double> tflopsPerDevice(const ThroughputBasis &basis, double seconds) {
  if (basis.modelFlops <= 0.0 || seconds <= 0.0)
    return std::nullopt;
  return basis.modelFlops / basis.ranks / seconds / 1e12;
}

std::string formatSeconds(double s) {
  char buf[32];
  if (s < 600)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else if (s < 36000)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

/// The most unbalanced MoE layer: max over experts of the tokens routed to
/// them over their mean, from the plan's "<layer>.tokens_per_expert" metrics.
std::optional<std::pair<double, std::string>> worstMoeLoad(const StepResult &r) {
  std::optional<std::pair<double, std::string>> worst;
  const std::string suffix = "tokens_per_expert";
  for (const auto &[name, v] : r.metrics) {
    if (v.size() < 2 || name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    Summary m = summarize(v);
    if (m.mean <= 0.0)
      continue;
    double ratio = m.max / m.mean;
    if (!worst || ratio > worst->first)
      worst = {ratio, name.substr(0, name.size() - suffix.size() - (name.size() > suffix.size()))};
  }
  return worst;
}
} // namespace

Status EvalHook::afterStep(TrainingSession &session, const StepResult &r) {
  if (!data_ || every_ <= 0 || ((r.step + 1) % every_ != 0 && r.step != finalStep_))
    return Status::ok();
  auto loss = session.evaluate(*data_, batches_);
  if (!loss.isOk())
    return loss.status();
  lastStep_ = r.step;
  lastLoss_ = *loss;
  return Status::ok();
}

ScalarRow stepScalars(const StepResult &r, const ThroughputBasis &basis,
                      std::optional<float> evalLoss) {
  auto opt = [](const std::optional<float> &v) {
    return v && std::isfinite(*v) ? std::optional<double>(*v) : std::nullopt;
  };
  std::optional<double> tflops = tflopsPerDevice(basis, r.seconds), mfu;
  if (tflops && basis.peakTflops > 0.0)
    mfu = *tflops / basis.peakTflops;
  ScalarRow row{{"step", static_cast<double>(r.step + 1)},
                {"loss", static_cast<double>(r.loss)},
                {"lr", opt(r.lr)},
                {"grad_norm", opt(r.gradNorm)},
                {"loss_scale", opt(r.lossScale)},
                {basis.tokens ? "tokens_per_s" : "examples_per_s",
                 static_cast<double>(r.tokens) / r.seconds},
                {"tflops_per_device", tflops},
                {"mfu", mfu},
                {"elapsed_s", r.elapsedSeconds},
                {"eval_loss", opt(evalLoss)}};
  return row;
}

ScalarRow metricScalars(const StepResult &r) {
  ScalarRow row;
  for (const auto &[name, v] : r.metrics) {
    if (v.size() == 1) {
      row.push_back({name, static_cast<double>(v[0])});
    } else if (!v.empty()) {
      Summary m = summarize(v);
      row.push_back({name + "_min", m.min});
      row.push_back({name + "_max", m.max});
      row.push_back({name + "_mean", m.mean});
    }
  }
  return row;
}

Status MetricsWriter::openJsonLines(const std::string &path, bool append) {
  jsonl_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!jsonl_)
    return invalidArgument("cannot write metrics file '", path, "'");
  return Status::ok();
}

void MetricsWriter::writeJsonLine(const StepResult &r, const ScalarRow &fixed) {
  std::string line = "{";
  char buf[96];
  // The step's own scalars: a grad norm that is not finite (a step skipped by
  // loss scaling) is null, other missing values are left out.
  for (const auto &[name, value] : fixed) {
    bool nullGradNorm = name == "grad_norm" && r.gradNorm && !value;
    if (!value && !nullGradNorm)
      continue;
    if (nullGradNorm)
      std::snprintf(buf, sizeof buf, "\"grad_norm\":null");
    else if (name == "step")
      std::snprintf(buf, sizeof buf, "\"step\":%lld", static_cast<long long>(*value));
    else
      std::snprintf(buf, sizeof buf, "\"%s\":%.9g", name.c_str(), *value);
    line += (line.size() > 1 ? "," : "") + std::string(buf);
  }
  // The plan's metrics in order: a scalar as it is, a vector (an MoE layer's
  // tokens per expert) as its min, max and mean.
  for (const auto &[name, v] : r.metrics) {
    if (v.empty())
      continue;
    line += ",\"" + name + "\":";
    if (v.size() == 1) {
      std::snprintf(buf, sizeof buf, "%.9g", v[0]);
    } else {
      Summary m = summarize(v);
      std::snprintf(buf, sizeof buf, "{\"min\":%.9g,\"max\":%.9g,\"mean\":%.9g}", m.min,
                    m.max, m.mean);
    }
    line += buf;
  }
  jsonl_ << line << "}\n";
  jsonl_.flush(); // a killed job keeps its metrics up to the last step
}

Status MetricsWriter::afterStep(TrainingSession &, const StepResult &r) {
  if (!jsonl_.is_open() && !csvOpen_ && !tbOpen_)
    return Status::ok();
  ScalarRow fixed = stepScalars(r, basis_, eval_ ? eval_->at(r.step) : std::nullopt);
  if (jsonl_.is_open())
    writeJsonLine(r, fixed);
  ScalarRow row = fixed, metrics = metricScalars(r);
  row.insert(row.end(), metrics.begin(), metrics.end());
  if (csvOpen_)
    if (Status s = csv_.write(row); !s.isOk())
      return s;
  if (tbOpen_) {
    // TensorBoard's own groups: train/..., eval/loss, the plan's metrics by name.
    ScalarRow train, eval;
    for (const auto &entry : row) {
      if (entry.first == "step")
        continue;
      if (entry.first == "eval_loss")
        eval.push_back({"eval/loss", entry.second});
      else
        train.push_back({"train/" + entry.first, entry.second});
    }
    train.insert(train.end(), eval.begin(), eval.end());
    if (Status s = tb_.write(r.step + 1, train); !s.isOk())
      return s;
  }
  return Status::ok();
}

Status ProgressPrinter::afterStep(TrainingSession &session, const StepResult &r) {
  int64_t step = r.step;
  if (auto e = eval_ && every_ > 0 ? eval_->at(step) : std::nullopt)
    std::cout << "eval after step " << step + 1 << " | eval_loss " << *e << "\n" << std::flush;
  if (every_ <= 0 || !((step + 1) % every_ == 0 || step == 0 || step + 1 == steps_))
    return Status::ok();
  if (step > 0 && step == lastStep_)
    lastElapsed_ = r.elapsedSeconds - r.seconds;
  double window = r.elapsedSeconds - lastElapsed_;
  int64_t stepsInWindow = step + 1 - lastStep_;
  double secondsPerStep = step == lastStep_ ? r.seconds : window / std::max<int64_t>(stepsInWindow, 1);
  double rate = static_cast<double>(r.tokens) / std::max(secondsPerStep, 1e-9);
  // Token data counts tokens; array data (any model's inputs) examples.
  std::string line;
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %6lld/%lld | loss %.4f | %9.0f %s",
                static_cast<long long>(step + 1), static_cast<long long>(steps_), r.loss, rate,
                session.data() ? "tok/s" : " ex/s");
  line += buf;
  if (auto tflops = tflopsPerDevice(basis_, secondsPerStep)) {
    std::snprintf(buf, sizeof buf, " | %.3g TFLOP/s", *tflops);
    line += buf;
    if (basis_.peakTflops > 0.0) {
      std::snprintf(buf, sizeof buf, ", MFU %.1f%%", 100.0 * *tflops / basis_.peakTflops);
      line += buf;
    }
  }
  std::snprintf(buf, sizeof buf, " | %7.1f s", r.elapsedSeconds);
  line += buf;
  if (step + 1 < steps_)
    line += ", ETA " + formatSeconds(secondsPerStep * static_cast<double>(steps_ - step - 1));
  if (r.lr) {
    std::snprintf(buf, sizeof buf, " | lr %.3e", *r.lr);
    line += buf;
  }
  if (r.gradNorm) {
    std::snprintf(buf, sizeof buf, " | grad norm %.4g", *r.gradNorm);
    line += buf;
  }
  if (r.skipped)
    line += " | update skipped";
  if (auto moe = worstMoeLoad(r)) {
    std::snprintf(buf, sizeof buf, " | MoE load max/mean %.2f (%s)", moe->first, moe->second.c_str());
    line += buf;
  }
  std::cout << line << "\n" << std::flush;
  lastElapsed_ = r.elapsedSeconds;
  lastStep_ = step + 1;
  return Status::ok();
}

Status LossScaleTracker::afterStep(TrainingSession &, const StepResult &r) {
  if (!r.lossScale)
    return Status::ok();
  if (active_ && *r.lossScale < last_)
    ++skipped_;
  active_ = true;
  last_ = *r.lossScale;
  return Status::ok();
}

} // namespace ptc
