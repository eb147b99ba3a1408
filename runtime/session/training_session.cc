#include "runtime/session/training_session.h"

#include "runtime/io/model_info.h"

#include "runtime/session/throughput.h"

#include "runtime/base/parse_number.h"

#include "runtime/io/array_data.h"
#include "runtime/io/hf_checkpoint.h"
#include "runtime/io/model_info.h"
#include "runtime/io/safetensors.h"
#include "runtime/session/fault_injection.h"
#include "runtime/session/step_watchdog.h"
#include "runtime/plan/plan_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <filesystem>

namespace ptc {
namespace {

/// Kind, group and size of every collective, in order: must be the same on
/// every rank, or some rank would wait forever.
std::string collectiveSignature(const LoadedPlan &plan) {
  std::string sig;
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    plan::OpCode op = inst->op();
    if (op != plan::OpCode::AllReduce && op != plan::OpCode::AllGather &&
        op != plan::OpCode::ReduceScatter && op != plan::OpCode::VocabParallelCrossEntropy &&
        op != plan::OpCode::VocabParallelCrossEntropyGrad && op != plan::OpCode::AllToAll)
      continue;
    int64_t count = 0;
    for (int32_t id : inputsOf(*inst))
      count += plan.tensor(id).numElements;
    sig += std::string(opcodeName(op)) + "(axes";
    for (int64_t a : plan::meshAxesOf(*inst))
      sig += " " + std::to_string(a);
    namespace attr = kernels::attr;
    if (op == plan::OpCode::AllToAll)
      sig += ", split dim " + std::to_string(plan::attrOf(*inst, attr::AllToAll::split_dim)) +
             ", concat dim " + std::to_string(plan::attrOf(*inst, attr::AllToAll::concat_dim));
    sig += ", f32 x " + std::to_string(count) + ");";
    if (op == plan::OpCode::AllGather || op == plan::OpCode::ReduceScatter)
      sig.insert(sig.size() - 2,
                 ", dim " + std::to_string(op == plan::OpCode::AllGather
                                               ? plan::attrOf(*inst, attr::BlockedAxis::dim)
                                               : plan::attrOf(*inst, attr::ReduceScatter::dim)));
  }
  return sig;
}

/// The first collective where `a` and `b` differ.
std::string firstDifference(const std::string &a, const std::string &b) {
  size_t i = 0, n = 0;
  while (true) {
    size_t ea = a.find(';', i), eb = b.find(';', i);
    std::string ca = ea == std::string::npos ? "(none)" : a.substr(i, ea - i);
    std::string cb = eb == std::string::npos ? "(none)" : b.substr(i, eb - i);
    if (ca != cb)
      return "collective #" + std::to_string(n) + ": " + ca + " vs " + cb;
    if (ea == std::string::npos)
      return "";
    i = ea + 1;
    ++n;
  }
}

void setScope(FailureScope *scope, FailureScope value) {
  if (scope)
    *scope = value;
}

} // namespace

namespace {
std::string secondsText(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}
} // namespace

int localRank() {
  for (const char *name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char *v = std::getenv(name))
      return static_cast<int>(parseInteger(v, 0, INT32_MAX).value_or(0));
  return 0;
}

double defaultCollectiveTimeout(const LoadedPlan &plan, int pipelineRank) {
  return 60.0 + static_cast<double>(largestCollectiveBytes(plan, pipelineRank)) / 10e6;
}

double stepCollectiveTimeout(const LoadedPlan &plan, double requested) {
  if (requested > 0)
    return requested;
  double timeout = 0; // every rank the same: the largest over the pipeline ranks
  for (int r = 0; r < (plan.pipelined() ? plan.pipeline().ranks : 1); ++r)
    timeout = std::max(timeout, defaultCollectiveTimeout(plan, r));
  return timeout;
}

StatusOr<std::unique_ptr<Communicator>> createCommunicator(const LoadedPlan &plan,
                                                           const std::string &planName,
                                                           Device &device,
                                                           CommBackend backend,
                                                           double collectiveTimeout,
                                                           FailureScope *scope) {
  setScope(scope, FailureScope::ThisRank);
  Mesh mesh{plan.meshAxes(), plan.meshSizes()};
  const int needRanks = plan.plan().num_ranks();
  const bool onGpu = device.kind() == DeviceKind::Cuda;
  if (backend == CommBackend::Nccl && !onGpu)
    return invalidArgument("--comm nccl needs the CUDA device (this rank runs on ",
                           device.describe(), ")");
  std::unique_ptr<Communicator> comm;
  if (needRanks <= 1 && !launchedByMpi())
    return comm;
  if (!launchedByMpi())
    return invalidArgument("plan '", planName, "' needs ", needRanks, " ranks (mesh ", mesh.describe(),
                           "); launch it with mpirun -np ", needRanks,
                           " ptc-run ... or ptc-run --np ", needRanks, " ...");
  // The timeout for the step's collectives and the one for coordination (see
  // SessionOptions::collectiveTimeout).
  const double controlTimeout = collectiveTimeout > 0 ? collectiveTimeout : kControlTimeout;
  collectiveTimeout = stepCollectiveTimeout(plan, collectiveTimeout);
  auto created = createMpiCommunicator(mesh, collectiveTimeout, controlTimeout);
  if (!created.isOk()) {
    setScope(scope, FailureScope::EachRank); // every rank sees the mismatch (its rank in it)
    return created.status();
  }
  comm = std::move(*created);
  // All ranks must issue the same collectives in the same order.
  auto sigs = comm->allGatherStrings(collectiveSignature(plan));
  if (!sigs.isOk())
    return sigs.status();
  for (int r = 1; r < comm->worldSize(); ++r)
    if ((*sigs)[static_cast<size_t>(r)] != (*sigs)[0]) {
      setScope(scope, FailureScope::AllRanks);
      return invalidArgument("rank ", r,
                             "'s plan does not issue the same collectives as rank 0's; first "
                             "difference at ",
                             firstDifference((*sigs)[0], (*sigs)[static_cast<size_t>(r)]),
                             " (rank 0 vs rank ", r, ")");
    }
  if (onGpu && backend != CommBackend::Mpi && (ncclCompiledIn() || backend == CommBackend::Nccl)) {
    auto nccl = createNcclCommunicator(std::move(comm), device, Executor::collectiveGroups(plan),
                                       collectiveTimeout);
    if (!nccl.isOk())
      return nccl.status();
    comm = std::move(*nccl);
  }
  return comm;
}

StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::create(const SessionOptions &options,
                                                                   FailureScope *scope) {
  std::unique_ptr<TrainingSession> session(new TrainingSession());
  FailureScope failureScope = FailureScope::ThisRank;
  Status s = session->setUp(options, failureScope);
  setScope(scope, failureScope);
  if (!s.isOk())
    return s;
  return session;
}

Status TrainingSession::setUp(const SessionOptions &options, FailureScope &scope) {
  options_ = options;
  auto loaded = LoadedPlan::loadFile(options.planPath);
  if (!loaded.isOk())
    return loaded.status();
  plan_ = *loaded;
  const LoadedPlan &plan = *plan_;
  lossId_ = plan.findOutput("loss");
  if (options.inference) {
    if (plan.findOutput("logits") < 0)
      return invalidArgument("plan '", options.planPath,
                             "' has no 'logits' output: compile the model with "
                             "--ptc-compile-decode for generation");
  } else if (lossId_ < 0) {
    return invalidArgument("plan '", options.planPath, "' has no 'loss' output",
                           plan.findOutput("logits") >= 0
                               ? " (it is a decode plan: ptc-generate runs it)"
                               : "");
  }
  gradNormId_ = plan.findOutput("grad_norm");
  lossScaleId_ = plan.findOutput("loss_scale");
  lrId_ = plan.findOutput("lr");
  skippedId_ = plan.findOutput("skipped");
  if (plan.plan().outputs())
    for (const plan::Output *o : *plan.plan().outputs())
      if (o->name() && o->name()->string_view().substr(0, 7) == "metric:")
        metricIds_.push_back({o->name()->str().substr(7), o->tensor()});

  const bool arrays = options.dataPath.size() >= 12 &&
                      options.dataPath.compare(options.dataPath.size() - 12, 12, ".safetensors") == 0;
  if (options.needsData && !options.inference && arrays) {
    // Any model: one named array per input, examples along the first dimension.
    std::vector<ArrayData::Input> specs;
    for (size_t i = 0; i < plan.tensors().size(); ++i) {
      const TensorInfo &t = plan.tensors()[i];
      if (t.kind != plan::TensorKind::Input)
        continue;
      if (t.globalShape.empty())
        return invalidArgument("plan input '", t.name, "' is a scalar: --data arrays feed inputs "
                               "whose first dimension is the batch");
      ArrayData::Input in;
      in.name = t.name;
      in.exampleShape.assign(t.globalShape.begin() + 1, t.globalShape.end());
      in.ids = t.dtype == plan::DType::I32;
      in.idBound = in.ids ? idUpperBound(plan, static_cast<int32_t>(i)) : -1;
      in.floatBytes = t.dtype == plan::DType::F32 ? 4 : 2;
      in.bf16 = t.dtype == plan::DType::BF16;
      int64_t rows = t.globalShape[0] * plan.microbatches();
      if (batch_ > 0 && rows != batch_)
        return invalidArgument("plan inputs disagree on the batch: '", t.name, "' has ", rows,
                               " rows, others ", batch_);
      batch_ = rows;
      specs.push_back(in);
      arrayIds_.push_back(static_cast<int32_t>(i));
    }
    if (specs.empty())
      return invalidArgument("plan '", options.planPath, "' has no inputs for --data to feed");
    auto data = ArrayData::load(options.dataPath, specs, batch_);
    if (!data.isOk())
      return data.status();
    arrays_ = std::move(*data);
    for (int32_t id : arrayIds_) {
      const TensorInfo &t = plan.tensor(id);
      int64_t bytes = t.bytes;
      for (size_t d = 0; d < t.shape.size(); ++d)
        bytes = bytes / t.shape[d] * t.globalShape[d];
      arrayBatches_.emplace_back(static_cast<size_t>(bytes * plan.microbatches()));
    }
    seq_ = 1;
  } else if (options.needsData && !options.inference) {
    // The standard model reads 'tokens' and 'targets' [batch, seq] from the data.
    tokensId_ = plan.findTensor("tokens", plan::TensorKind::Input);
    targetsId_ = plan.findTensor("targets", plan::TensorKind::Input);
    // Packed documents: 'positions' restart after each end-of-document token
    // the model names (ptc-model --document-end).
    auto info = ModelInfo::parse(plan.modelInfo(), "plan '" + options.planPath + "'");
    if (!info.isOk())
      return info.status();
    documentEnd_ = info->documentEnd;
    positionsId_ = plan.findTensor("positions", plan::TensorKind::Input);
    if (positionsId_ >= 0 && documentEnd_ < 0)
      return invalidArgument("plan input 'positions' has no data source: the model names no "
                             "end-of-document token (ptc-model --document-end ID builds a model "
                             "of packed documents)");
    if (positionsId_ < 0 && documentEnd_ >= 0)
      return invalidArgument("plan '", options.planPath, "' names the end-of-document token ",
                             documentEnd_, " but has no 'positions' input");
    for (const TensorInfo &t : plan.tensors())
      if (t.kind == plan::TensorKind::Input && t.name != "tokens" && t.name != "targets" &&
          !(t.name == "positions" && positionsId_ >= 0))
        return invalidArgument("plan input '", t.name,
                               "' has no data source: a token file feeds 'tokens' and 'targets' "
                               "(and, for packed documents, 'positions'); other models read "
                               "named arrays from --data FILE.safetensors");
    if (tokensId_ < 0 || targetsId_ < 0)
      return invalidArgument("plan '", options.planPath,
                             "' lacks the 'tokens' and 'targets' inputs");
    const TensorInfo &tokens = plan.tensor(tokensId_);
    if (tokens.shape.size() != 2 || plan.tensor(targetsId_).shape != tokens.shape ||
        tokens.dtype != plan::DType::I32)
      return invalidArgument("inputs 'tokens' and 'targets' must both be [batch, seq] i32");
    if (positionsId_ >= 0 && (plan.tensor(positionsId_).globalShape != tokens.globalShape ||
                              plan.tensor(positionsId_).dtype != plan::DType::I32))
      return invalidArgument("input 'positions' must be [batch, seq] i32 as 'tokens'");
    // Inputs may be split (rows over dp, the sequence over tp): each rank
    // builds the global batch and keeps its part. A micro-batched plan's
    // inputs hold one micro-batch.
    batch_ = tokens.globalShape[0] * plan.microbatches();
    seq_ = tokens.globalShape[1];
    int64_t vocab = idUpperBound(plan, tokensId_);
    int64_t classes = idUpperBound(plan, targetsId_);
    if (classes >= 0 && (vocab < 0 || classes < vocab))
      vocab = classes;
    if (vocab < 0)
      vocab = 65536;
    vocab_ = vocab;
    if (options.dataPath.empty() && options.dataBlend.empty())
      return invalidArgument("--data FILE is required (a token file; see ptc-tokenize)");
    StatusOr<TokenData> data = invalidArgument("no data");
    if (!options.dataBlend.empty()) {
      auto blend = TokenData::parseBlend(options.dataBlend);
      if (!blend.isOk())
        return blend.status();
      data = TokenData::loadBlend(*blend, seq_, vocab, options.shuffleSeed);
    } else {
      // Several token files (comma-separated) are one stream, in order.
      std::vector<std::string> paths;
      for (size_t begin = 0; begin <= options.dataPath.size();) {
        size_t comma = options.dataPath.find(',', begin);
        if (comma == std::string::npos)
          comma = options.dataPath.size();
        if (comma > begin)
          paths.push_back(options.dataPath.substr(begin, comma - begin));
        begin = comma + 1;
      }
      data = TokenData::load(paths, seq_, vocab, options.shuffleSeed);
    }
    if (!data.isOk())
      return data.status();
    data_ = std::move(*data);
    wholeTokens_.assign(static_cast<size_t>(batch_ * seq_), 0);
    wholeTargets_.assign(static_cast<size_t>(batch_ * seq_), 0);
    if (positionsId_ >= 0)
      wholePositions_.assign(static_cast<size_t>(batch_ * seq_), 0);
  }

  auto device = createDevice(options.device, localRank());
  if (!device.isOk())
    return device.status();
  auto comm = createCommunicator(plan, options.planPath, **device, options.comm, options.collectiveTimeout, &scope);
  if (!comm.isOk())
    return comm.status();
  scope = FailureScope::ThisRank;
  comm_ = std::move(*comm);
  collectiveTimeout_ = options.collectiveTimeout;
  deviceText_ = (*device)->describe();
  if (comm_)
    deviceText_ += comm_->deviceResident() ? ", collectives: NCCL" : ", collectives: MPI";
  // A mixed-precision plan's matmuls: native (f32 accumulation) or widened to f32 kernels.
  if (std::optional<FloatType> type = planMatmulLowPrecision(plan)) {
    std::string native = (*device)->lowPrecisionMatmul(*type);
    deviceText_ += std::string(", ") + (*type == FloatType::BF16 ? "bf16" : "f16") + " matmul: " +
                   (native.empty() ? "widened to f32 (no native kernel on this device)" : native);
  }
  pipelineRank_ = comm_ && plan.pipelineAxis() >= 0
                      ? comm_->coords()[static_cast<size_t>(plan.pipelineAxis())]
                      : 0;
  // NVMe offload: the run's --offload-dir, else the directory the plan names.
  std::string offloadDir = options.offloadDir;
  if (offloadDir.empty() && plan.plan().offload_path())
    offloadDir = plan.plan().offload_path()->str();
  auto created = Executor::create(plan_, pipelineRank_, std::move(*device), offloadDir,
                                  comm_ ? comm_->rank() : 0);
  if (!created.isOk())
    return created.status();
  executor_ = std::move(*created);
  executor_->setCommunicator(comm_.get());
  executor_->setProgress(options.instructionProgress);
  executor_->setInference(options.inference);
  if (Status s = executor_->initialize(options.seed); !s.isOk())
    return s;
  if (!options.initPath.empty())
    return loadParameters(options.initPath, &unusedInitTensors_);
  return Status::ok();
}

Status TrainingSession::loadParameters(const std::string &path,
                                       std::vector<std::string> *unused) {
  // Every rank reads the whole tensors and keeps its part.
  auto file = WeightSource::open(path);
  if (!file.isOk())
    return file.status();
  std::set<std::string> used;
  for (size_t i = 0; i < plan_->tensors().size(); ++i) {
    const TensorInfo &t = plan_->tensors()[i];
    if (t.kind != plan::TensorKind::Parameter)
      continue;
    int64_t count = 1;
    for (int64_t d : t.globalShape)
      count *= d;
    std::vector<float> whole(static_cast<size_t>(count));
    std::vector<std::string> read;
    PTC_RETURN_IF_ERROR(file->copyTo(t.name, t.globalShape, whole.data(), &read));
    // A NaN or Inf weight would surface steps later as a "diverged" loss.
    for (int64_t e = 0; e < count; ++e)
      if (!std::isfinite(whole[static_cast<size_t>(e)]))
        return invalidArgument("safetensors file '", file->fileOf(t.name), "': tensor '", t.name,
                               "' holds ", whole[static_cast<size_t>(e)], " at element ", e);
    PTC_RETURN_IF_ERROR(executor_->loadFromWholeF32(static_cast<int32_t>(i), whole.data()));
    used.insert(read.begin(), read.end());
  }
  // A tensor no parameter reads, in a file or a model directory alike:
  // - a buffer that models save beside their parameters (rotary inverse
  //   frequencies, GPT-2's causal-mask buffers) is skipped with a warning;
  // - a copy of a tied parameter (nanoGPT saves lm_head.weight beside the
  //   token embedding it shares) is skipped with a warning when it holds
  //   exactly that parameter's values;
  // - anything else means another model (an untied head for a tied one, a
  //   renamed parameter): an error naming it.
  auto isBuffer = [](const std::string &name) {
    for (const char *suffix : {"rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"})
      if (name.size() >= std::strlen(suffix) &&
          name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        return true;
    return false;
  };
  auto sameAsParameter = [&](const std::string &name) -> std::string {
    for (const TensorInfo &t : plan_->tensors()) {
      if (t.kind != plan::TensorKind::Parameter)
        continue;
      int64_t count = 1;
      for (int64_t d : t.globalShape)
        count *= d;
      std::vector<float> extra(static_cast<size_t>(count)), param(static_cast<size_t>(count));
      if (!file->copyTo(name, t.globalShape, extra.data()).isOk() ||
          !file->copyTo(t.name, t.globalShape, param.data()).isOk())
        continue; // another shape (or the parameter came from elsewhere)
      if (std::memcmp(extra.data(), param.data(), extra.size() * sizeof(float)) == 0)
        return t.name;
    }
    return "";
  };
  // What the model declares (ptc.model_info): its buffers, and names tied to
  // a parameter (what ptc-run --save writes besides the parameters) are
  // expected, so skipped without a word.
  auto info = ModelInfo::parse(plan_->modelInfo(), "plan '" + plan_->origin() + "'");
  if (!info.isOk())
    return info.status();
  for (const std::string &name : file->names()) {
    if (used.count(name))
      continue;
    if (std::find(info->buffers.begin(), info->buffers.end(), name) != info->buffers.end())
      continue;
    if (auto tied = info->tied.find(name);
        tied != info->tied.end() && sameAsParameter(name) == tied->second)
      continue;
    if (isBuffer(name)) {
      if (unused)
        unused->push_back("'" + name + "' (a buffer, not a parameter)");
      continue;
    }
    if (std::string tied = sameAsParameter(name); !tied.empty()) {
      if (unused)
        unused->push_back("'" + name + "' (the same values as the tied parameter '" + tied + "')");
      continue;
    }
    return invalidArgument(file->isDirectory() ? "weights directory '" : "weights file '", path,
                           "': tensor '", name, "'",
                           file->isDirectory() ? " (in '" + file->fileOf(name) + "')" : std::string(),
                           " is not a parameter of the plan (another model? a tied model reads "
                           "one tensor where this file has two different ones)");
  }
  return Status::ok();
}

bool isDirectoryTarget(const std::string &path) {
  std::error_code ec;
  return (!path.empty() && path.back() == '/') || std::filesystem::is_directory(path, ec);
}

Status TrainingSession::saveParameters(const std::string &path,
                                       const std::map<std::string, std::string> &metadata,
                                       int64_t maxShardBytes) {
  // Sharded parameters are gathered whole on every rank; the leader writes.
  std::vector<int32_t> params;
  std::vector<std::vector<float>> wholes;
  for (size_t i = 0; i < plan_->tensors().size(); ++i) {
    if (plan_->tensors()[i].kind != plan::TensorKind::Parameter)
      continue;
    auto whole = executor_->gatherWhole(static_cast<int32_t>(i));
    if (!whole.isOk())
      return whole.status();
    params.push_back(static_cast<int32_t>(i));
    wholes.push_back(std::move(*whole));
  }
  if (!leader())
    return Status::ok();
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back({plan_->tensor(params[i]).name, plan_->tensor(params[i]).globalShape,
                   wholes[i].data()});
  auto info = ModelInfo::parse(plan_->modelInfo(), "plan '" + plan_->origin() + "'");
  if (!info.isOk())
    return info.status();
  return writeModelWeights(path, isDirectoryTarget(path), out, metadata, maxShardBytes, *info);
}

Status TrainingSession::setDocumentPositions(const int32_t *tokens) {
  if (positionsId_ < 0)
    return Status::ok();
  // Each sequence starts a document; one starts after every end-of-document
  // token (which ends the one before: its own position continues it).
  const int32_t end = static_cast<int32_t>(documentEnd_);
  for (int64_t b = 0; b < batch_; ++b) {
    const int32_t *row = tokens + b * seq_;
    int32_t *pos = wholePositions_.data() + b * seq_;
    for (int64_t i = 0; i < seq_; ++i)
      pos[i] = i == 0 || row[i - 1] == end ? 0 : pos[i - 1] + 1;
  }
  return executor_->setInput(positionsId_, wholePositions_.data());
}

StatusOr<float> TrainingSession::evaluate(const TokenData &data, int64_t batches) {
  if (!data_)
    return invalidArgument("evaluation needs a language model fed by token files");
  std::vector<int32_t> tokens(wholeTokens_.size()), targets(wholeTargets_.size());
  double sum = 0.0;
  executor_->setEvaluating(true);
  Status s = Status::ok();
  for (int64_t e = 0; e < batches && s.isOk(); ++e) {
    s = data.fillBatch(e, batch_, seq_, 0, batch_, tokens.data(), targets.data());
    if (s.isOk())
      s = executor_->setInput(tokensId_, tokens.data());
    if (s.isOk())
      s = executor_->setInput(targetsId_, targets.data());
    if (s.isOk())
      s = setDocumentPositions(tokens.data());
    if (s.isOk())
      s = executor_->step(nullptr);
    if (s.isOk()) {
      auto loss = executor_->scalar(lossId_);
      if (!loss.isOk())
        s = loss.status();
      else
        sum += *loss;
    }
  }
  executor_->setEvaluating(false);
  if (!s.isOk())
    return Status(s.code(), "evaluation: " + s.message());
  return static_cast<float>(sum / static_cast<double>(std::max<int64_t>(batches, 1)));
}

StatusOr<StepResult> TrainingSession::runStep(int64_t step) {
  using Clock = std::chrono::steady_clock;
  if (arrays_) {
    for (size_t i = 0; i < arrayIds_.size(); ++i) {
      arrays_->fillBatch(i, step, batch_, arrayBatches_[i].data());
      PTC_RETURN_IF_ERROR(executor_->setInput(arrayIds_[i], arrayBatches_[i].data()));
    }
  }
  if (data_) {
    PTC_RETURN_IF_ERROR(
        data_->fillBatch(step, batch_, seq_, 0, batch_, wholeTokens_.data(), wholeTargets_.data()));
    PTC_RETURN_IF_ERROR(executor_->setInput(tokensId_, wholeTokens_.data()));
    PTC_RETURN_IF_ERROR(executor_->setInput(targetsId_, wholeTargets_.data()));
    PTC_RETURN_IF_ERROR(setDocumentPositions(wholeTokens_.data()));
  }
  executor_->setTracing(traceFrom_ >= 0 && step >= traceFrom_);
  executor_->setRandomKey(options_.seed, step); // dropout's masks
  auto t0 = Clock::now();
  PTC_RETURN_IF_ERROR(executor_->step(stepsRun_++ >= profileSkip_ ? profile_ : nullptr));
  auto readScalar = [&](int32_t id) {
    auto v = executor_->scalar(id);
    return v.isOk() ? *v : std::nanf("");
  };
  StepResult r;
  r.step = step;
  r.loss = readScalar(lossId_); // waits for the step on a GPU
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.tokens = batch_ * seq_;
  if (gradNormId_ >= 0)
    r.gradNorm = readScalar(gradNormId_);
  if (lossScaleId_ >= 0)
    r.lossScale = readScalar(lossScaleId_);
  if (lrId_ >= 0)
    r.lr = readScalar(lrId_);
  // Outputs made on another pipeline rank are read on pipeline rank 0.
  if (skippedId_ >= 0 && pipelineRank_ == 0)
    r.skipped = readScalar(skippedId_) != 0.0f;
  for (const auto &[name, id] : metricIds_) {
    auto whole = executor_->gatherWhole(id); // every rank takes part
    if (!whole.isOk())
      return whole.status();
    r.metrics.push_back({name, std::move(*whole)});
  }
  PTC_RETURN_IF_ERROR(checkFinite(r));
  return r;
}

Status TrainingSession::checkFinite(const StepResult &r) {
  if (pipelineRank_ != 0)
    return Status::ok(); // rank 0 of the pipeline reads the step's outputs and decides
  const bool lossFinite = std::isfinite(r.loss);
  const bool normFinite = !r.gradNorm || std::isfinite(*r.gradNorm);
  // With dynamic loss scaling a skipped step is an overflow, the scaling's
  // own business; without it, non-finite gradients.
  const bool nonfinite = !lossFinite || !normFinite || (r.skipped && lossScaleId_ < 0);
  if (!nonfinite) {
    skippedInARow_ = 0;
    return Status::ok();
  }
  char what[96];
  std::snprintf(what, sizeof what, "the loss is %g%s", static_cast<double>(r.loss),
                lossFinite ? " and the gradients are not finite" : "");
  if (skippedId_ >= 0 && !r.skipped)
    return invalidArgument(what, " while the gradients are finite; stopping: this step's update "
                           "was applied");
  if (skippedId_ < 0)
    return invalidArgument(what, "; stopping: this step's update was applied (the plan has "
                           "no non-finite check: skip-nonfinite=false, or Adafactor), so the parameters may no longer "
                           "be finite and are not saved; lower the learning rate, enable "
                           "max-grad-norm, or compile with skip-nonfinite=true (AdamW, SGD)");
  if (options_.stopOnNonfinite)
    return invalidArgument(what, "; stopping (--on-nonfinite=stop): the update was skipped, the "
                           "parameters and optimizer state are those before this step");
  if (++skippedInARow_ >= options_.maxSkippedSteps && options_.maxSkippedSteps > 0)
    return invalidArgument(what, "; stopping: ", skippedInARow_,
                           " steps in a row had non-finite gradients and were skipped "
                           "(--max-skipped-steps ", options_.maxSkippedSteps,
                           "): the data or the model is broken, not one batch");
  if (leader()) {
    std::fprintf(stderr,
                 "ptc-run: warning: step %lld: %s: the update was skipped (parameters and "
                 "optimizer state unchanged)\n",
                 static_cast<long long>(r.step + 1), what);
    std::fflush(stderr);
  }
  return Status::ok();
}

Status TrainingSession::run(int64_t first, int64_t steps, const std::vector<SessionHook *> &hooks) {
  StepWatchdog watchdog(options_.stepTimeout, comm_ ? comm_->rank() : 0, options_.onStepTimeout);
  const FaultInjection faults = FaultInjection::fromEnvironment();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = first; step < first + steps; ++step) {
    faults.atStepStart(step, rank(), comm_ ? comm_->worldSize() : 1);
    for (SessionHook *h : hooks)
      PTC_RETURN_IF_ERROR(h->beforeStep(*this, step));
    watchdog.begin(step);
    faults.inStep(step, rank());
    auto result = runStep(step);
    watchdog.end();
    if (!result.isOk())
      return invalidArgument("step ", step + 1, ": ", result.status().message());
    result->elapsedSeconds =
        elapsedBase_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (SessionHook *h : hooks)
      PTC_RETURN_IF_ERROR(h->afterStep(*this, *result));
    if (std::any_of(hooks.begin(), hooks.end(), [](SessionHook *h) { return h->endsRun(); })) {
      elapsedBase_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return Status::ok();
    }
  }
  elapsedBase_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (SessionHook *h : hooks)
    PTC_RETURN_IF_ERROR(h->afterRun(*this));
  return Status::ok();
}

std::string TrainingSession::describe() const {
  // What this rank holds (a pipeline stage holds its chunks' parameters only).
  int64_t numParams = 0, paramBytes = 0, stateBytes = 0;
  for (size_t i = 0; i < plan_->tensors().size(); ++i) {
    const TensorInfo &t = plan_->tensors()[i];
    if (!executor_->holds(static_cast<int32_t>(i)))
      continue;
    // Offloaded parameters and state live in host memory (counted there,
    // as the compiler's report counts them).
    if (t.kind == plan::TensorKind::Parameter) {
      numParams += t.numElements;
      if (!t.host)
        paramBytes += t.bytes;
    } else if (t.kind == plan::TensorKind::WorkingCopy) {
      paramBytes += t.bytes; // the parameters' bf16 / f16 copies kept between steps
    } else if (t.kind == plan::TensorKind::OptimizerState && !t.host) {
      stateBytes += t.bytes;
    }
  }
  Mesh mesh{plan_->meshAxes(), plan_->meshSizes()};
  std::string text = std::to_string(numParams) + " parameters" + (comm_ ? " per rank" : "") +
                     ", batch " + std::to_string(batch_) +
                     (arrays_ ? std::string(" examples") : " x seq " + std::to_string(seq_)) +
                     ", " + std::to_string(plan_->plan().instructions()->size()) +
                     " instructions, memory per rank: parameters " +
                     std::to_string(paramBytes / 1024) + " KiB, optimizer state " +
                     std::to_string(stateBytes / 1024) + " KiB, arena " +
                     std::to_string(executor_->arenaBytes() / 1024) + " KiB";
  if (executor_->fileBytes() > 0)
    text += " (offloaded: " + std::to_string(executor_->fileBytes() / 1024) +
            " KiB of master weights and optimizer state in a file under the offload directory, " +
            std::to_string((executor_->hostBytes() - executor_->fileBytes()) / 1024) +
            " KiB of update temporaries in host memory)";
  else if (executor_->hostBytes() > 0)
    text += " (offloaded to host memory: " + std::to_string(executor_->hostBytes() / 1024) +
            " KiB of master weights, optimizer state and update temporaries)";
  if (data_)
    text += "; data " + std::to_string(data_->size()) + " tokens" +
            (data_->datasets() > 1 ? " in a blend of " + std::to_string(data_->datasets()) + " datasets"
                                   : std::string()) +
            (positionsId_ >= 0 ? ", packed documents (token " + std::to_string(documentEnd_) +
                                     " ends one: attention stops and positions restart there)"
                               : std::string());
  if (arrays_)
    text += "; data " + std::to_string(arrays_->examples()) + " examples";
  text += "; device " + deviceText_;
  if (comm_)
    text += ", " + std::to_string(comm_->worldSize()) + " ranks (mesh " + mesh.describe() +
            "), collective timeout " + secondsText(stepCollectiveTimeout(*plan_, collectiveTimeout_));
  return text;
}

} // namespace ptc
