// ptc-generate: samples text from a trained model. The training model
// (MODEL.mlir, as ptc-model or an importer wrote it) is compiled by ptc-opt's
// ptc-compile-decode into two forward-only plans sharing one key/value cache:
// a prefill plan that runs the whole prompt at once and a decode plan that
// runs one new token per call. Weights come from a safetensors file, a
// Hugging Face directory or a ptc-run checkpoint directory. With --np N --mesh tp:N the
// plans are tensor-parallel (heads and caches split over the ranks) and run
// under mpirun; every rank samples the same token from the same (gathered)
// logits with the same seeded generator.
//   ptc-generate model.mlir --init weights.safetensors --prompt "Once upon" \
//       --max-new-tokens 64 --temperature 0.8 --top-k 40 --seed 1
#include "kernels/common/types.h"
#include "runtime/base/parse_number.h"
#include "runtime/base/self_path.h"
#include "runtime/base/subprocess.h"
#include "runtime/base/temp_dir.h"
#include "runtime/comm/communicator.h"
#include "runtime/session/checkpointing.h"
#include "runtime/session/training_session.h"

#ifdef PTC_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace fs = std::filesystem;
using namespace ptc;

namespace {
const char *kUsage =
    R"(usage: ptc-generate MODEL.mlir --init WEIGHTS (--prompt TEXT | --prompt-tokens IDS) [options]
Generates text with a model trained by ptc: MODEL.mlir is the training model as ptc-model wrote it,
WEIGHTS its parameters: a safetensors file (ptc-run --save), a Hugging Face directory, or a
ptc-run --checkpoint-dir (its newest complete checkpoint, from any layout).
  --prompt TEXT            the prompt, tokenized by the tokenizer (default: bytes, vocabulary 256)
  --prompt-tokens IDS      the prompt as token ids, comma- or space-separated
  --sentencepiece MODEL    tokenize and detokenize with a SentencePiece model (ptc-tokenize's)
  --max-new-tokens N       tokens to generate (default 32)
  --temperature T          0: greedy (the most likely token); default 1
  --top-k K                sample among the K most likely tokens only (0: all)
  --top-p P                sample among the most likely tokens whose probabilities sum to P (1: all)
  --seed S                 the sampler's seed (default 1337)
  --context C              positions of the key/value cache (default: the model's sequence length)
  --print-tokens           end the output with one line of the new token ids
  --no-cache               recompute the whole prefix for every token (no key/value cache; the
                           reference the cache is measured against)
  --np N --mesh tp:N       N ranks, tensor-parallel (under mpirun)
  --device D               cpu, cpu-discrete, cuda or auto (default auto)
)";

struct Options {
  std::string model, init, prompt, sentencepiece, mesh, device = "auto", compiled;
  std::vector<int32_t> promptTokens;
  bool hasPrompt = false, hasPromptTokens = false, printTokens = false, noCache = false;
  int64_t maxNew = 32, topK = 0, context = 0, np = 1;
  double temperature = 1.0, topP = 1.0;
  uint64_t seed = 1337;
};

int fail(const std::string &message) {
  std::cerr << "ptc-generate: error: " << message << "\n";
  return 1;
}

std::optional<std::string> parseArgs(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string &out) -> bool {
      if (i + 1 >= argc)
        return false;
      out = argv[++i];
      return true;
    };
    std::string v;
    auto integer = [&](auto &out) -> std::optional<std::string> {
      if (!value(v))
        return a + " needs a value";
      std::optional<int64_t> x = parseInteger(v, 0);
      if (!x)
        return a + ": '" + v + "' is not a non-negative integer";
      out = static_cast<std::remove_reference_t<decltype(out)>>(*x);
      return std::nullopt;
    };
    auto real = [&](double &out) -> std::optional<std::string> {
      if (!value(v))
        return a + " needs a value";
      std::optional<double> x = parseReal(v);
      if (!x)
        return a + ": '" + v + "' is not a number";
      out = *x;
      return std::nullopt;
    };
    std::optional<std::string> err;
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--init") {
      if (!value(o.init))
        return "--init needs a path";
    } else if (a == "--prompt") {
      if (!value(o.prompt))
        return "--prompt needs a text";
      o.hasPrompt = true;
    } else if (a == "--prompt-tokens") {
      if (!value(v))
        return "--prompt-tokens needs ids";
      std::replace(v.begin(), v.end(), ',', ' ');
      std::istringstream in(v);
      std::string id;
      while (in >> id) {
        std::optional<int64_t> x = parseInteger(id, 0, 2147483647);
        if (!x)
          return "--prompt-tokens: '" + id + "' is not a token id";
        o.promptTokens.push_back(static_cast<int32_t>(*x));
      }
      o.hasPromptTokens = true;
    } else if (a == "--sentencepiece") {
      if (!value(o.sentencepiece))
        return "--sentencepiece needs a model file";
    } else if (a == "--max-new-tokens") {
      err = integer(o.maxNew);
    } else if (a == "--temperature") {
      err = real(o.temperature);
    } else if (a == "--top-k") {
      err = integer(o.topK);
    } else if (a == "--top-p") {
      err = real(o.topP);
    } else if (a == "--seed") {
      err = integer(o.seed);
    } else if (a == "--context") {
      err = integer(o.context);
    } else if (a == "--np") {
      err = integer(o.np);
    } else if (a == "--mesh") {
      if (!value(o.mesh))
        return "--mesh needs a mesh (tp:N)";
    } else if (a == "--device") {
      if (!value(o.device))
        return "--device needs a device";
    } else if (a == "--compiled") { // the launcher's ranks: plans compiled by it
      if (!value(o.compiled))
        return "--compiled needs a directory";
    } else if (a == "--print-tokens") {
      o.printTokens = true;
    } else if (a == "--no-cache") {
      o.noCache = true;
    } else if (!a.empty() && a[0] == '-') {
      return "unknown option '" + a + "' (see --help)";
    } else if (o.model.empty()) {
      o.model = a;
    } else {
      return "more than one model file ('" + o.model + "', '" + a + "')";
    }
    if (err)
      return err;
  }
  if (o.model.empty())
    return "no MODEL.mlir given (see --help)";
  if (o.init.empty())
    return "--init WEIGHTS is required: the trained parameters to generate with";
  if (o.hasPrompt == o.hasPromptTokens)
    return "give the prompt as exactly one of --prompt TEXT and --prompt-tokens IDS";
  if (o.maxNew < 1)
    return "--max-new-tokens must be at least 1";
  if (o.temperature < 0.0)
    return "--temperature must be >= 0";
  if (!(o.topP > 0.0 && o.topP <= 1.0))
    return "--top-p must be in (0, 1]";
  if (o.np < 1 || o.np > 4096)
    return "--np must be between 1 and 4096";
  if (o.np > 1 && o.mesh.empty())
    return "--np " + std::to_string(o.np) + " needs --mesh tp:" + std::to_string(o.np);
  return std::nullopt;
}

/// The prompt's ids: --prompt-tokens, or --prompt through the tokenizer.
StatusOr<std::vector<int32_t>> promptIds(const Options &o) {
  if (o.hasPromptTokens) {
    if (o.promptTokens.empty())
      return invalidArgument("--prompt-tokens holds no ids");
    return o.promptTokens;
  }
  std::vector<int32_t> ids;
  if (!o.sentencepiece.empty()) {
#ifdef PTC_HAVE_SENTENCEPIECE
    sentencepiece::SentencePieceProcessor sp;
    if (auto s = sp.Load(o.sentencepiece); !s.ok())
      return invalidArgument("SentencePiece model '", o.sentencepiece, "': ", s.ToString());
    std::vector<int> pieces;
    if (auto s = sp.Encode(o.prompt, &pieces); !s.ok())
      return invalidArgument("SentencePiece: ", s.ToString());
    ids.assign(pieces.begin(), pieces.end());
#else
    return invalidArgument("this build has no SentencePiece (install libsentencepiece-dev)");
#endif
  } else {
    for (unsigned char c : o.prompt)
      ids.push_back(c);
  }
  if (ids.empty())
    return invalidArgument("the prompt is empty: generation needs at least one token");
  return ids;
}

/// Text of `ids` by the tokenizer (bytes: as they are).
std::string detokenize(const Options &o, const std::vector<int32_t> &ids) {
#ifdef PTC_HAVE_SENTENCEPIECE
  if (!o.sentencepiece.empty()) {
    sentencepiece::SentencePieceProcessor sp;
    std::string text;
    if (sp.Load(o.sentencepiece).ok() && sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text).ok())
      return text;
  }
#endif
  std::string text;
  for (int32_t id : ids)
    text.push_back(static_cast<char>(id & 0xff));
  return text;
}

/// Runs argv (argv[0] in this tool's directory, else on PATH); its exit status.
int runProgram(std::vector<std::string> args, bool inToolDir) {
  ChildOptions options;
  options.place = inToolDir ? ProgramPlace::SiblingTool : ProgramPlace::OnPath;
  options.who = "ptc-generate";
  return ::ptc::runChild(std::move(args), options).status;
}

/// ptc-opt MODEL --ptc-compile-decode=... -o PLAN.
Status compilePlan(const Options &o, int64_t tokens, int64_t context, const fs::path &plan) {
  std::string pipeline = "tokens=" + std::to_string(tokens);
  if (context > 0)
    pipeline += " context=" + std::to_string(context);
  if (!o.mesh.empty())
    pipeline += " mesh=" + o.mesh;
  int rc = runProgram({"ptc-opt", o.model, "--ptc-compile-decode=" + pipeline, "-o", plan.string()},
                    true);
  if (rc != 0)
    return invalidArgument("compiling the ", tokens == 1 ? "decode" : "prefill", " plan of '",
                           o.model, "' failed (ptc-opt exit ", rc, ", diagnostics above)");
  return Status::ok();
}

struct Shapes {
  int64_t context = 0, vocab = 0;
};

/// The cache length and vocabulary of a decode plan.
StatusOr<Shapes> planShapes(const fs::path &path) {
  auto plan = LoadedPlan::loadFile(path.string());
  if (!plan.isOk())
    return plan.status();
  Shapes s;
  int32_t logits = (*plan)->findOutput("logits");
  if (logits < 0)
    return invalidArgument("plan '", path.string(), "' has no 'logits' output");
  s.vocab = (*plan)->tensor(logits).globalShape.back();
  for (const TensorInfo &t : (*plan)->tensors())
    if (t.kind == plan::TensorKind::OptimizerState && t.globalShape.size() == 4)
      s.context = t.globalShape[2];
  if (s.context == 0)
    return invalidArgument("plan '", path.string(), "' has no key/value cache");
  return s;
}

/// One forward-only plan on this rank.
struct Runner {
  std::unique_ptr<TrainingSession> session;
  int32_t tokens = -1, positions = -1, logits = -1;
  int64_t width = 0; // new tokens per call

  static StatusOr<Runner> open(const std::string &plan, const Options &o) {
    // --init: a safetensors file or Hugging Face directory (loaded by the
    // session), or a ptc-run checkpoint directory (its newest complete
    // checkpoint's parameters, in any layout).
    std::error_code ec;
    const fs::path init(o.init);
    const bool checkpoint = fs::is_directory(init, ec) &&
                            !fs::exists(init / "model.safetensors", ec) &&
                            !fs::exists(init / "model.safetensors.index.json", ec);
    SessionOptions so;
    so.planPath = plan;
    so.initPath = checkpoint ? "" : o.init;
    so.device = o.device;
    so.needsData = false;
    so.inference = true;
    auto session = TrainingSession::create(so);
    if (!session.isOk())
      return session.status();
    Runner r;
    r.session = std::move(*session);
    if (checkpoint) {
      std::vector<std::string> warnings; // the caches are state no checkpoint holds
      auto step = resumeFromCheckpoint(*r.session, o.init, &warnings);
      if (!step.isOk())
        return step.status();
    }
    const LoadedPlan &p = r.session->plan();
    r.tokens = p.findTensor("tokens", plan::TensorKind::Input);
    r.positions = p.findTensor("positions", plan::TensorKind::Input);
    r.logits = p.findOutput("logits");
    if (r.tokens < 0 || r.positions < 0)
      return invalidArgument("plan '", plan, "' lacks the 'tokens' and 'positions' inputs");
    r.width = p.tensor(r.tokens).globalShape[1];
    return r;
  }

  /// Runs `ids` at positions first.. and returns the logits of row `row`.
  StatusOr<std::vector<float>> run(const std::vector<int32_t> &ids, int32_t first, int64_t row) {
    Executor &ex = session->executor();
    std::vector<int32_t> pos(ids.size());
    std::iota(pos.begin(), pos.end(), first);
    PTC_RETURN_IF_ERROR(ex.setInput(tokens, ids.data()));
    PTC_RETURN_IF_ERROR(ex.setInput(positions, pos.data()));
    PTC_RETURN_IF_ERROR(ex.step());
    // Whole on every rank: a function's results are gathered (ptc-partition).
    const TensorInfo &t = session->plan().tensor(logits);
    std::vector<uint8_t> bytes(static_cast<size_t>(t.bytes));
    PTC_RETURN_IF_ERROR(ex.readLocal(logits, bytes.data()));
    const int64_t vocab = t.shape.back();
    std::vector<float> out(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) {
      int64_t at = row * vocab + i;
      if (t.dtype == plan::DType::F32)
        std::memcpy(&out[i], bytes.data() + at * 4, 4);
      else {
        uint16_t h;
        std::memcpy(&h, bytes.data() + at * 2, 2);
        _Float16 half;
        std::memcpy(&half, &h, 2);
        out[i] = t.dtype == plan::DType::BF16 ? kernels::bf16ToF32(h) : static_cast<float>(half);
      }
    }
    return out;
  }
};

/// The next token: greedy at temperature 0, else sampled (top-k, top-p).
int32_t sample(std::vector<float> logits, const Options &o, std::mt19937_64 &rng) {
  const size_t n = logits.size();
  if (o.temperature == 0.0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  size_t keep = o.topK > 0 ? std::min(n, static_cast<size_t>(o.topK)) : n;
  std::vector<double> p(keep);
  double mx = logits[order[0]], sum = 0.0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp((logits[order[i]] - mx) / o.temperature);
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] /= sum;
    cumulative += p[i];
    if (cumulative >= o.topP) {
      keep = i + 1;
      break;
    }
  }
  double total = std::accumulate(p.begin(), p.begin() + static_cast<long>(keep), 0.0);
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (size_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u < 0.0)
      return static_cast<int32_t>(order[i]);
  }
  return static_cast<int32_t>(order[keep - 1]);
}

/// Prefill, then one decode call per new token (or, with --no-cache, the
/// whole prefix every time). Prints on rank 0.
Status generate(const Options &o, const fs::path &dir, const std::vector<int32_t> &prompt) {
  const int64_t p = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> all = prompt, generated;
  std::mt19937_64 rng(o.seed);
  double prefillSeconds = 0.0, decodeSeconds = 0.0;
  using Clock = std::chrono::steady_clock;
  bool leader = true;
  if (o.noCache) {
    auto full = Runner::open((dir / "full.plan").string(), o);
    if (!full.isOk())
      return full.status();
    leader = full->session->leader();
    const int64_t width = full->width;
    for (int64_t n = 0; n < o.maxNew; ++n) {
      std::vector<int32_t> window(static_cast<size_t>(width), 0);
      std::copy(all.begin(), all.end(), window.begin());
      auto t0 = Clock::now();
      auto logits = full->run(window, 0, static_cast<int64_t>(all.size()) - 1);
      if (!logits.isOk())
        return logits.status();
      (n == 0 ? prefillSeconds : decodeSeconds) +=
          std::chrono::duration<double>(Clock::now() - t0).count();
      int32_t next = sample(std::move(*logits), o, rng);
      all.push_back(next);
      generated.push_back(next);
    }
  } else {
    // The prefill plan runs the prompt; its caches move to the decode plan
    // through host memory, so that one plan's weights are loaded at a time.
    std::vector<std::pair<std::string, std::vector<uint8_t>>> caches;
    StatusOr<std::vector<float>> logits = invalidArgument("no prefill");
    {
      auto prefill = Runner::open((dir / "prefill.plan").string(), o);
      if (!prefill.isOk())
        return prefill.status();
      auto t0 = Clock::now();
      logits = prefill->run(prompt, 0, p - 1);
      if (!logits.isOk())
        return logits.status();
      prefillSeconds = std::chrono::duration<double>(Clock::now() - t0).count();
      const LoadedPlan &from = prefill->session->plan();
      for (size_t i = 0; i < from.tensors().size(); ++i) {
        const TensorInfo &t = from.tensors()[i];
        if (t.kind != plan::TensorKind::OptimizerState)
          continue;
        caches.push_back({t.name, std::vector<uint8_t>(static_cast<size_t>(t.bytes))});
        PTC_RETURN_IF_ERROR(prefill->session->executor().readLocal(static_cast<int32_t>(i),
                                                                   caches.back().second.data()));
      }
    }
    auto decode = Runner::open((dir / "decode.plan").string(), o);
    if (!decode.isOk())
      return decode.status();
    leader = decode->session->leader();
    const LoadedPlan &to = decode->session->plan();
    for (auto &[name, bytes] : caches) {
      int32_t id = to.findTensor(name, plan::TensorKind::OptimizerState);
      if (id < 0 || static_cast<size_t>(to.tensor(id).bytes) != bytes.size())
        return invalidArgument("the decode plan has no cache '", name, "' of the prefill's size");
      PTC_RETURN_IF_ERROR(decode->session->executor().loadLocal(id, bytes.data()));
    }
    int32_t next = sample(std::move(*logits), o, rng);
    all.push_back(next);
    generated.push_back(next);
    auto t1 = Clock::now();
    for (int64_t n = 1; n < o.maxNew; ++n) {
      auto step = decode->run({next}, static_cast<int32_t>(all.size()) - 1, 0);
      if (!step.isOk())
        return step.status();
      next = sample(std::move(*step), o, rng);
      all.push_back(next);
      generated.push_back(next);
    }
    decodeSeconds = std::chrono::duration<double>(Clock::now() - t1).count();
  }
  if (!leader)
    return Status::ok();
  std::cout << detokenize(o, all) << "\n";
  if (o.printTokens) {
    for (size_t i = 0; i < generated.size(); ++i)
      std::cout << (i ? " " : "") << generated[i];
    std::cout << "\n";
  }
  std::cout.flush();
  const int64_t decoded = o.maxNew - 1;
  std::fprintf(stderr,
               "ptc-generate: %lld prompt tokens, %lld new (%s): first token %.1f ms, then %.1f "
               "tokens/s\n",
               static_cast<long long>(p), static_cast<long long>(o.maxNew),
               o.noCache ? "no cache: the whole prefix each token" : "key/value cache",
               prefillSeconds * 1e3,
               decoded > 0 && decodeSeconds > 0 ? static_cast<double>(decoded) / decodeSeconds : 0.0);
  return Status::ok();
}
} // namespace

int main(int argc, char **argv) {
  Options o;
  if (auto err = parseArgs(argc, argv, o))
    return fail(*err);
  auto prompt = promptIds(o);
  if (!prompt.isOk())
    return fail(prompt.status().message());
  const int64_t p = static_cast<int64_t>(prompt->size());

  // Compile the plans (once, before any rank starts), unless the launcher did.
  std::string dir = o.compiled;
  bool ownDir = false;
  if (dir.empty()) {
    auto tmp = makeTempDirectory("ptc-generate-");
    if (!tmp.isOk())
      return fail(tmp.status().message());
    dir = *tmp;
    ownDir = true;
  }
  auto cleanup = [&] {
    if (ownDir) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  };
  auto finish = [&](int rc) {
    cleanup();
    return rc;
  };
  if (o.compiled.empty()) {
    fs::path d(dir);
    if (Status s = compilePlan(o, 1, o.context, d / "decode.plan"); !s.isOk())
      return finish(fail(s.message()));
    auto shapes = planShapes(d / "decode.plan");
    if (!shapes.isOk())
      return finish(fail(shapes.status().message()));
    if (o.maxNew > shapes->context - p) // p <= context here: no overflow
      return finish(fail("the prompt's " + std::to_string(p) + " tokens and " +
                         std::to_string(o.maxNew) + " new ones exceed the model's context of " +
                         std::to_string(shapes->context) +
                         " positions (shorten them, or give --context)"));
    for (int32_t id : *prompt)
      if (id >= shapes->vocab)
        return finish(fail("prompt token " + std::to_string(id) +
                           " is outside the model's vocabulary of " +
                           std::to_string(shapes->vocab) +
                           (o.hasPrompt ? " (a tokenizer for another vocabulary?)" : "")));
    if (o.noCache) {
      if (Status s = compilePlan(o, shapes->context, shapes->context, d / "full.plan"); !s.isOk())
        return finish(fail(s.message()));
    } else if (Status s = compilePlan(o, p, shapes->context, d / "prefill.plan"); !s.isOk()) {
      return finish(fail(s.message()));
    }
  }

  if (o.np > 1 && !launchedByMpi()) {
    // The ranks: this tool again under mpirun, with the compiled plans.
    std::vector<std::string> args{"mpirun", "-np", std::to_string(o.np)};
    args.push_back((toolDirectory() / "ptc-generate").string());
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--np") {
        ++i;
        continue;
      }
      args.push_back(a);
    }
    args.insert(args.end(), {"--compiled", dir});
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    setenv("OMPI_MCA_orte_execute_quiet", "1", 0);
    return finish(runProgram(args, false));
  }

  Status s = generate(o, dir, *prompt);
  cleanup();
  if (!s.isOk()) {
    std::cerr << "ptc-generate: error: " << s.message() << "\n";
    if (launchedByMpi())
      abortMpi(1);
    return 1;
  }
  finalizeMpi();
  return 0;
}
