// ptc-gradcheck: checks the gradients of a forward+backward plan (compiled
// with optimizer=none) against central finite differences of its loss, on a
// TrainingSession whose inputs it draws itself.
// Parameters start from the plan's initializers; float inputs are N(0, 1);
// id inputs are uniform below the bound the plan's instructions give them.
//   ptc-gradcheck grad.plan [--seed S] [--eps E] [--rtol R] [--atol A] [--samples N]

#include "runtime/base/parse_number.h"
#include "runtime/session/training_session.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

using namespace ptc;

namespace {
const char kUsage[] =
    "usage: ptc-gradcheck PLAN [--seed S] [--eps E] [--rtol R] [--atol A] [--samples N]\n"
    "Checks the gradients of a forward+backward plan (ptc-compile optimizer=none) against\n"
    "central finite differences of its loss, on inputs it draws itself.\n"
    "  --seed S     seed of the inputs and the parameter noise (integer >= 0, default 7)\n"
    "  --eps E      finite-difference step (> 0, default 1e-2)\n"
    "  --rtol R     relative tolerance (>= 0, default 2e-2)\n"
    "  --atol A     absolute tolerance (>= 0, default 1e-4)\n"
    "  --samples N  elements checked per parameter, evenly spaced (>= 1, default 24)\n"
    "Exit status: 0 passed, 1 a mismatch or an error, 2 a usage error.\n";

[[noreturn]] void usageError(const std::string &message) {
  std::cerr << "ptc-gradcheck: error: " << message << " (see --help)\n";
  std::exit(2);
}

double parseRealFlag(const std::string &flag, const std::string &value, bool zeroAllowed) {
  std::optional<double> v = parseReal(value);
  if (!v || (zeroAllowed ? *v < 0 : *v <= 0))
    usageError(flag + " expects a finite number " + (zeroAllowed ? ">= 0" : "> 0") + ", got '" +
               value + "'");
  return *v;
}

int64_t parseIntegerFlag(const std::string &flag, const std::string &value, int64_t min) {
  std::optional<int64_t> v = parseInteger(value, min);
  if (!v)
    usageError(flag + " expects an integer >= " + std::to_string(min) + ", got '" + value + "'");
  return *v;
}
} // namespace

int main(int argc, char **argv) {
  std::string planPath;
  uint64_t seed = 7;
  double eps = 1e-2, rtol = 2e-2, atol = 1e-4;
  int64_t samples = 24;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        usageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--seed")
      seed = static_cast<uint64_t>(parseIntegerFlag(a, next(), 0));
    else if (a == "--eps")
      eps = parseRealFlag(a, next(), /*zeroAllowed=*/false);
    else if (a == "--rtol")
      rtol = parseRealFlag(a, next(), /*zeroAllowed=*/true);
    else if (a == "--atol")
      atol = parseRealFlag(a, next(), /*zeroAllowed=*/true);
    else if (a == "--samples")
      samples = parseIntegerFlag(a, next(), 1);
    else if (a.size() > 1 && a[0] == '-')
      usageError("unknown option '" + a + "'");
    else if (planPath.empty())
      planPath = a;
    else
      usageError("unexpected argument '" + a + "'");
  }
  if (planPath.empty())
    usageError("no plan given");
  SessionOptions options;
  options.planPath = planPath;
  options.device = "cpu"; // the host evaluates the loss between perturbations
  options.seed = seed;
  options.needsData = false; // inputs are drawn below
  options.stepTimeout = 0;
  auto created = TrainingSession::create(options);
  if (!created.isOk()) {
    std::cerr << "ptc-gradcheck: error: " << created.status().message() << "\n";
    return 1;
  }
  TrainingSession &session = **created;
  std::shared_ptr<const LoadedPlan> plan = session.sharedPlan();
  Executor &ex = session.executor();
  int32_t lossId = plan->findOutput("loss");
  if (lossId < 0 || (plan->plan().optimizer() && plan->plan().optimizer()->size())) {
    std::cerr << "ptc-gradcheck: error: needs a forward+backward plan (ptc-compile "
                 "optimizer=none) with a 'loss' output\n";
    return 1;
  }
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < plan->tensors().size(); ++i) {
    const TensorInfo &t = plan->tensors()[i];
    if (t.kind != plan::TensorKind::Input)
      continue;
    if (t.dtype == plan::DType::I32) {
      int64_t bound = idUpperBound(*plan, static_cast<int32_t>(i));
      if (bound < 1) {
        std::cerr << "ptc-gradcheck: error: no instruction bounds the ids of input '" << t.name
                  << "'\n";
        return 1;
      }
      std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(bound - 1));
      for (int64_t e = 0; e < t.numElements; ++e)
        ex.i32(static_cast<int32_t>(i))[e] = dist(rng);
    } else {
      fillNormal(ex.f32(static_cast<int32_t>(i)), t.numElements, 1.0, seed, t.name);
    }
  }
  // Parameters initialized to constants (zeros/ones) would hide bugs that
  // depend on their values: perturb every parameter a little, relative to its
  // initializer's scale (half its std; 0.05 around a constant) so that a real
  // model stays in the regime it trains in, and by N(0, 0.5) where the plan
  // gives no initializer (the op-level checks, whose values are the noise).
  for (size_t i = 0; i < plan->tensors().size(); ++i) {
    const TensorInfo &t = plan->tensors()[i];
    if (t.kind != plan::TensorKind::Parameter)
      continue;
    const plan::Tensor *pt = plan->plan().tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
    double noiseStd = 0.5;
    if (pt->init() == plan::InitKind::Normal)
      noiseStd = 0.5 * pt->init_std();
    else if (pt->init() != plan::InitKind::None)
      noiseStd = 0.05;
    std::vector<float> noise(static_cast<size_t>(t.numElements));
    fillNormal(noise.data(), t.numElements, noiseStd, seed + 1, t.name);
    for (int64_t e = 0; e < t.numElements; ++e)
      ex.f32(static_cast<int32_t>(i))[e] += noise[static_cast<size_t>(e)];
  }

  auto lossAt = [&]() -> double {
    auto r = session.runStep(0);
    if (!r.isOk()) {
      std::cerr << "ptc-gradcheck: error: " << r.status().message() << "\n";
      std::exit(1);
    }
    return r->loss;
  };
  const double base = lossAt();
  // Copy the analytic gradients before perturbing.
  struct Check {
    int32_t param;
    std::vector<float> grad;
  };
  std::vector<Check> checks;
  for (size_t i = 0; i < plan->tensors().size(); ++i) {
    const TensorInfo &t = plan->tensors()[i];
    if (t.kind != plan::TensorKind::Parameter)
      continue;
    int32_t g = plan->findOutput("grad:" + t.name);
    if (g < 0) {
      std::cerr << "ptc-gradcheck: error: no gradient output for parameter '" << t.name << "'\n";
      return 1;
    }
    float *gp = ex.f32(g);
    checks.push_back({static_cast<int32_t>(i), std::vector<float>(gp, gp + t.numElements)});
  }

  bool passed = true;
  for (Check &c : checks) {
    const TensorInfo &t = plan->tensor(c.param);
    float *p = ex.f32(c.param);
    int64_t stride = std::max<int64_t>(1, t.numElements / samples);
    // The relative error only where it means something (the gradient large
    // enough that rtol, not atol, bounds it), and the worst error as a share
    // of its own tolerance (atol + rtol * |gradient|): what passing means.
    double maxAbs = 0, maxRel = 0, worst = 0;
    const double relativeFrom = rtol > 0 ? atol / rtol : 0;
    int64_t checked = 0, bad = 0, kinks = 0;
    for (int64_t e = 0; e < t.numElements; e += stride) {
      float saved = p[e];
      p[e] = saved + static_cast<float>(eps);
      double up = lossAt();
      p[e] = saved - static_cast<float>(eps);
      double down = lossAt();
      p[e] = saved;
      // Where the one-sided slopes disagree, the loss is not smooth within eps
      // (a ReLU or max switching): finite differences say nothing there.
      double right = (up - base) / eps, left = (base - down) / eps;
      if (std::fabs(right - left) > 0.25 * std::max(std::fabs(right), std::fabs(left)) + 10 * atol) {
        ++kinks;
        continue;
      }
      double fd = (up - down) / (2 * eps), g = c.grad[static_cast<size_t>(e)];
      double err = std::fabs(fd - g), scale = std::max(std::fabs(fd), std::fabs(g));
      maxAbs = std::max(maxAbs, err);
      if (scale > 0 && scale >= relativeFrom)
        maxRel = std::max(maxRel, err / scale);
      if (atol + rtol * scale > 0)
        worst = std::max(worst, err / (atol + rtol * scale));
      if (err > atol + rtol * scale) {
        if (bad++ < 3)
          std::printf("gradcheck: %s[%lld]: analytic %.6g, finite difference %.6g\n",
                      t.name.c_str(), static_cast<long long>(e), g, fd);
        passed = false;
      }
      ++checked;
    }
    std::printf("gradcheck: %s: %lld elements, max abs err %.3g, max rel err %.3g (where "
                "|gradient| >= atol/rtol), worst error %.0f%% of its tolerance%s%s\n",
                t.name.c_str(), static_cast<long long>(checked), maxAbs, maxRel, 100 * worst,
                kinks ? (" (" + std::to_string(kinks) + " non-smooth points skipped)").c_str() : "",
                bad ? " MISMATCH" : "");
    if (checked == 0) {
      std::printf("gradcheck: %s: no smooth point to check\n", t.name.c_str());
      passed = false;
    }
  }
  std::printf("gradcheck: %s\n", passed ? "passed" : "FAILED");
  return passed ? 0 : 1;
}
