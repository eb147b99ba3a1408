// Distributed checkpoints of a TrainingSession: save (dedup, shards, metadata,
// atomic publish, pruning) and resume in any layout.

#include "runtime/session/checkpointing.h"

#include "runtime/plan/plan_ops.h"

#include "runtime/base/parse_number.h"

#include "kernels/cpu/kernels.h"
#include "runtime/io/dist_checkpoint.h"
#include "runtime/io/durable_file.h"
#include "runtime/io/safetensors.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <fcntl.h>
#include <unistd.h>

namespace ptc {

namespace fs = std::filesystem;

namespace {
bool checkpointed(const TensorInfo &t) {
  return t.kind == plan::TensorKind::Parameter || t.kind == plan::TensorKind::OptimizerState;
}

std::string joinInts(const std::vector<int64_t> &v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::vector<int64_t> splitInts(const std::string &s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ','))
    if (!part.empty())
      out.push_back(std::stoll(part));
  return out;
}

/// Fields of `s` between `sep`s, empty ones included ("a\t\t" -> a, "", "").
std::vector<std::string> splitFields(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(begin, i - begin));
      begin = i + 1;
    }
  return out;
}

/// Lines of `s` (without a last empty one).
std::vector<std::string> splitLines(const std::string &s) {
  std::vector<std::string> out = splitFields(s, '\n');
  if (!out.empty() && out.back().empty())
    out.pop_back();
  return out;
}

/// Every rank's string, in rank order (one process: just this one).
StatusOr<std::vector<std::string>> gatherFromRanks(TrainingSession &s, const std::string &mine) {
  if (!s.communicator())
    return std::vector<std::string>{mine};
  return s.communicator()->allGatherStrings(mine);
}

/// The first error any rank reported (entries starting with "error:"), as a status.
Status firstError(const std::vector<std::string> &statuses) {
  for (size_t r = 0; r < statuses.size(); ++r)
    if (statuses[r].rfind("error:", 0) == 0)
      return invalidArgument("checkpoint failed on rank ", r, ": ", statuses[r].substr(6));
  return Status::ok();
}

Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return error(StatusCode::kInternal, "cannot open directory '", dir, "' to sync it");
  ::fsync(fd);
  ::close(fd);
  return Status::ok();
}

/// The optimizer's hyperparameters and learning-rate schedule as the plan holds
/// them (the first update's and schedule's attributes), for the resume check:
/// "AdamWUpdate: lr=0.0006, beta1=0.9, ...; LrSchedule: kind=cosine, warmup_steps=20, ..."
/// (named by the plan's op table). `legacy`: the unlabelled text of checkpoints
/// written before ("update 1 0.0006 0.9 ...; lr schedule 1 20 200 ..."), so that
/// resuming one does not warn of a change that is only the format's.
std::string optimizerSettings(const LoadedPlan &plan, bool legacy = false) {
  std::string text;
  bool update = false, schedule = false;
  auto number = [](double v) {
    char num[32];
    std::snprintf(num, sizeof num, "%.9g", v);
    return std::string(num);
  };
  for (const plan::Instruction *inst : *plan.plan().instructions()) {
    bool isUpdate = inst->op() == plan::OpCode::AdamWUpdate || inst->op() == plan::OpCode::SgdUpdate;
    bool isSchedule = inst->op() == plan::OpCode::LrSchedule;
    if ((isUpdate && update) || (isSchedule && schedule) || !(isUpdate || isSchedule))
      continue;
    (isUpdate ? update : schedule) = true;
    if (legacy) {
      text += std::string(text.empty() ? "" : "; ") + (isUpdate ? "update" : "lr schedule");
      if (inst->ints())
        for (int64_t v : *inst->ints())
          text += " " + std::to_string(v);
      if (inst->floats())
        for (double v : *inst->floats())
          text += " " + number(v);
      continue;
    }
    // The hyperparameters: the schedule's attributes, the update's floats
    // (its integer only says where the scheduled rate comes from).
    const plan::OpInfo *info = plan::lookupOp(inst->op());
    std::vector<std::string> items;
    for (const kernels::AttrInfo &a : kernels::kAttrTable) {
      if (a.set != info->attrs)
        continue;
      if (a.kind == kernels::AttrKind::Int && isSchedule) {
        const int64_t v = plan::attrOf(*inst, kernels::slotOf<kernels::AttrKind::Int>(a));
        std::string value = std::to_string(v);
        if (a.index == kernels::attr::LrSchedule::kind.index) // the schedule's kind, by name
          value = v == 0 ? "constant" : v == 1 ? "cosine" : v == 2 ? "linear" : value;
        items.push_back(std::string(a.name) + "=" + value);
      } else if (a.kind == kernels::AttrKind::Float) {
        items.push_back(std::string(a.name) + "=" +
                        number(plan::attrOf(*inst, kernels::slotOf<kernels::AttrKind::Float>(a))));
      }
    }
    text += std::string(text.empty() ? "" : "; ") + info->name + ":";
    for (size_t i = 0; i < items.size(); ++i)
      text += (i ? ", " : " ") + items[i];
  }
  return text;
}

std::map<std::string, std::vector<int64_t>> planParameters(const LoadedPlan &plan) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const TensorInfo &t : plan.tensors())
    if (t.kind == plan::TensorKind::Parameter)
      out[t.name] = t.globalShape;
  return out;
}

} // namespace

/// The host copy of the boxes this rank owns, and the lines describing them.
struct ShardSnapshot {
  std::vector<std::vector<float>> buffers;
  std::vector<NamedTensor> entries; // data pointers into buffers
  std::string lines;                // "tensor\tkey\toffset\tshape" per box
};

PendingCheckpoint::~PendingCheckpoint() = default;

namespace {
StatusOr<std::unique_ptr<ShardSnapshot>> snapshotShard(TrainingSession &s,
                                                       const std::set<std::string> &owned) {
  const LoadedPlan &plan = s.plan();
  Executor &ex = s.executor();
  auto snap = std::make_unique<ShardSnapshot>();
  for (size_t i = 0; i < plan.tensors().size(); ++i) {
    const TensorInfo &t = plan.tensors()[i];
    auto id = static_cast<int32_t>(i);
    if (!checkpointed(t) || !ex.holds(id))
      continue;
    auto boxes = ex.localBoxes(id);
    std::vector<float> local;
    for (size_t k = 0; k < boxes.size(); ++k) {
      const auto &b = boxes[k];
      std::string key = t.name + "|" + joinInts(b.wholeOffset);
      if (!owned.count(key))
        continue;
      if (t.dtype != plan::DType::F32)
        return invalidArgument("tensor '", t.name, "' is not f32; checkpoints hold f32 master state");
      if (local.empty()) {
        local.resize(static_cast<size_t>(t.numElements));
        PTC_RETURN_IF_ERROR(ex.readLocal(id, local.data()));
      }
      int64_t n = 1;
      for (int64_t d : b.shape)
        n *= d;
      snap->buffers.emplace_back(static_cast<size_t>(n));
      kernels::cpu::copyBox(local.data(), t.shape, b.localOffset, snap->buffers.back().data(),
                            b.shape, std::vector<int64_t>(b.shape.size(), 0), b.shape,
                            sizeof(float));
      std::string entry = boxes.size() == 1 ? t.name : t.name + "#" + std::to_string(k);
      snap->entries.push_back({entry, b.shape, nullptr});
      snap->lines += t.name + "\t" + entry + "\t" + joinInts(b.wholeOffset) + "\t" +
                     joinInts(b.shape) + "\n";
    }
  }
  for (size_t i = 0; i < snap->entries.size(); ++i)
    snap->entries[i].data = snap->buffers[i].data();
  return snap;
}

/// Writes the snapshot as rank-R.safetensors in `tmpDir`. Returns "file\tdigest"
/// plus the box lines, or "" when the rank owns nothing (touches no MPI: it may
/// run on a background thread).
StatusOr<std::string> writeShard(const ShardSnapshot &snap, int rank, const std::string &tmpDir) {
  if (snap.entries.empty())
    return std::string();
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  std::string path = (fs::path(tmpDir) / name).string();
  uint64_t digest = 0; // computed as the shard is written: no second read
  PTC_RETURN_IF_ERROR(writeSafetensors(path, snap.entries, {{"producer", "ptc-run"}}, &digest));
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return std::string(name) + "\t" + hex + "\n" + snap.lines;
}
} // namespace

/// Phase 1 (collective): the leader prepares an empty temporary directory, and
/// each box is given to the lowest rank holding it. Phase 2 (local): those
/// boxes are copied to host memory.
Status prepareCheckpoint(TrainingSession &s, const std::string &dir, int64_t steps,
                         PendingCheckpoint &pending) {
  const LoadedPlan &plan = s.plan();
  pending.dir = dir;
  pending.steps = steps;
  pending.tmp = (fs::path(dir) / ("." + checkpointStepName(steps) + ".tmp")).string();
  std::string status = "ok";
  if (s.leader()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove_all(pending.tmp, ec); // a crashed earlier attempt
    if (!fs::create_directory(pending.tmp, ec))
      status = "error:cannot create '" + pending.tmp + "': " + ec.message();
  }
  auto st = gatherFromRanks(s, status);
  if (!st.isOk())
    return st.status();
  PTC_RETURN_IF_ERROR(firstError(*st));
  std::string mine;
  for (size_t i = 0; i < plan.tensors().size(); ++i) {
    const TensorInfo &t = plan.tensors()[i];
    if (checkpointed(t))
      for (const auto &b : s.executor().localBoxes(static_cast<int32_t>(i)))
        mine += t.name + "|" + joinInts(b.wholeOffset) + "\n";
  }
  auto held = gatherFromRanks(s, mine);
  if (!held.isOk())
    return held.status();
  std::set<std::string> taken, owned;
  for (size_t r = 0; r < held->size(); ++r)
    for (const std::string &key : splitLines((*held)[r]))
      if (!key.empty() && taken.insert(key).second && static_cast<int>(r) == s.rank())
        owned.insert(key);
  auto snap = snapshotShard(s, owned);
  if (!snap.isOk())
    return snap.status();
  pending.snapshot = std::move(*snap);
  return Status::ok();
}

/// Phase 4 (collective): every rank's shard description to the leader, which
/// writes the metadata and publishes the checkpoint.
Status publishCheckpoint(TrainingSession &s, PendingCheckpoint &pending, int keepLast) {
  const LoadedPlan &plan = s.plan();
  const std::string name = checkpointStepName(pending.steps);
  const std::string &dir = pending.dir, &tmp = pending.tmp;
  const std::string final = (fs::path(dir) / name).string();
  auto shards = gatherFromRanks(s, pending.shard);
  pending.snapshot.reset();
  if (!shards.isOk())
    return shards.status();
  Status failed = firstError(*shards);
  if (const char *kill = std::getenv("PTC_FAULT_CHECKPOINT_KILL");
      kill && parseInteger(kill, 0) == pending.steps && s.leader()) {
    std::fprintf(stderr, "ptc-run: fault injection: rank 0 killed while writing checkpoint %s\n",
                 name.c_str());
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  std::string status = "ok";
  if (s.leader() && failed.isOk()) {
    CheckpointMetadata meta;
    meta.step = pending.steps;
    for (const TensorInfo &t : plan.tensors())
      if (checkpointed(t))
        meta.tensors[t.name] = {t.kind == plan::TensorKind::Parameter ? "parameter" : "state",
                                t.globalShape};
    for (const std::string &text : *shards) {
      auto lines = splitLines(text);
      if (lines.empty() || lines[0].empty())
        continue;
      auto head = splitFields(lines[0], '\t');
      meta.files[head[0]] = head.size() > 1 ? head[1] : "";
      for (size_t l = 1; l < lines.size(); ++l) {
        auto f = splitFields(lines[l], '\t');
        if (f.size() == 4)
          meta.boxes.push_back({f[0], head[0], f[1], splitInts(f[2]), splitInts(f[3])});
      }
    }
    const char *opt = plan.plan().optimizer() ? plan.plan().optimizer()->c_str() : "";
    meta.info["optimizer"] = opt;
    meta.info["optimizer_settings"] = optimizerSettings(plan);
    meta.info["shuffle"] = s.options().shuffleSeed ? std::to_string(*s.options().shuffleSeed) : "none";
    meta.info["seed"] = std::to_string(s.options().seed); // keys dropout's masks
    if (std::string info = plan.modelInfo(); !info.empty())
      meta.info["model_info"] = info; // what an export of the weights adds (tied names, config.json)
    meta.info["model_fingerprint"] = modelFingerprint(planParameters(plan));
    meta.info["producer"] = "ptc-run";
    std::string mesh;
    for (size_t a = 0; a < plan.meshAxes().size(); ++a)
      mesh += (a ? "," : "") + plan.meshAxes()[a] + ":" + std::to_string(plan.meshSizes()[a]);
    meta.info["mesh"] = mesh;
    meta.info["microbatches"] = std::to_string(plan.microbatches());
    std::string json = checkpointMetadataJson(meta);
    std::string metaPath = (fs::path(tmp) / "metadata.json").string();
    Status w = writeFileDurably(metaPath, [&](int fd) {
      return writeAll(fd, json.data(), json.size(), metaPath);
    });
    std::error_code ec;
    if (w.isOk())
      w = syncDirectory(tmp);
    if (w.isOk() && fs::exists(final, ec)) {
      // The same step again (a rerun): the old copy goes only after the new one is in place.
      std::string old = (fs::path(dir) / ("." + name + ".old")).string();
      fs::remove_all(old, ec);
      fs::rename(final, old, ec);
      fs::rename(tmp, final, ec);
      if (!ec)
        fs::remove_all(old, ec);
    } else if (w.isOk()) {
      fs::rename(tmp, final, ec);
    }
    if (w.isOk() && ec)
      w = error(StatusCode::kInternal, "cannot publish checkpoint '", final, "': ", ec.message());
    if (w.isOk())
      w = syncDirectory(dir);
    if (w.isOk()) {
      std::string latest = (fs::path(dir) / "latest").string();
      std::string text = name + "\n";
      w = writeFileDurably(latest, [&](int fd) { return writeAll(fd, text.data(), text.size(), latest); });
    }
    if (w.isOk() && keepLast > 0) {
      auto all = listCheckpoints(dir);
      for (size_t i = 0; i + static_cast<size_t>(keepLast) < all.size(); ++i)
        fs::remove_all(all[i].second, ec);
    }
    if (!w.isOk()) {
      fs::remove_all(tmp, ec);
      status = "error:" + w.message();
    }
  } else if (s.leader()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  PTC_RETURN_IF_ERROR(failed);
  auto published = gatherFromRanks(s, status);
  if (!published.isOk())
    return published.status();
  return firstError(*published);
}

Status saveCheckpoint(TrainingSession &s, const std::string &dir, int64_t steps, int keepLast) {
  PendingCheckpoint pending;
  PTC_RETURN_IF_ERROR(prepareCheckpoint(s, dir, steps, pending));
  auto shard = writeShard(*pending.snapshot, s.rank(), pending.tmp);
  pending.shard = shard.isOk() ? *shard : "error:" + shard.status().message();
  return publishCheckpoint(s, pending, keepLast);
}

StatusOr<int64_t> resumeFromCheckpoint(TrainingSession &s, const std::string &dir,
                                       std::vector<std::string> *warnings) {
  std::vector<std::string> incomplete;
  auto path = findCheckpoint(dir, &incomplete);
  if (!path.isOk())
    return path.status();
  for (const std::string &p : incomplete)
    warnings->push_back("ignoring the incomplete checkpoint '" + p + "'");
  auto reader = CheckpointReader::open(*path);
  if (!reader.isOk())
    return reader.status();
  const CheckpointMetadata &meta = reader->metadata();
  const LoadedPlan &plan = s.plan();
  auto shapeStr = [](const std::vector<int64_t> &v) { return "[" + joinInts(v) + "]"; };
  // The model must be the same: every parameter, by name and global shape.
  for (const auto &[name, shape] : planParameters(plan)) {
    auto it = meta.tensors.find(name);
    if (it == meta.tensors.end() || it->second.kind != "parameter")
      return invalidArgument("checkpoint '", *path, "' is of another model: it has no parameter '",
                             name, "' ", shapeStr(shape), " of this plan");
    if (it->second.shape != shape)
      return invalidArgument("checkpoint '", *path, "' is of another model: parameter '", name,
                             "' is ", shapeStr(it->second.shape), " there, ", shapeStr(shape),
                             " in this plan");
  }
  auto params = planParameters(plan);
  for (const auto &[name, t] : meta.tensors)
    if (t.kind == "parameter" && !params.count(name))
      return invalidArgument("checkpoint '", *path, "' is of another model: its parameter '", name,
                             "' ", shapeStr(t.shape), " is not in this plan");
  const char *opt = plan.plan().optimizer() ? plan.plan().optimizer()->c_str() : "";
  if (auto it = meta.info.find("optimizer"); it != meta.info.end() && it->second != opt)
    warnings->push_back("the checkpoint was written with optimizer '" + it->second +
                        "', this plan uses '" + opt + "'");
  else if (auto it = meta.info.find("optimizer_settings");
           it != meta.info.end() && it->second != optimizerSettings(plan) &&
           it->second != optimizerSettings(plan, /*legacy=*/true))
    warnings->push_back("the optimizer settings changed: the checkpoint's are '" + it->second +
                        "', this plan's '" + optimizerSettings(plan) + "'");
  std::string shuffle = s.options().shuffleSeed ? std::to_string(*s.options().shuffleSeed) : "none";
  if (auto it = meta.info.find("shuffle"); it != meta.info.end() && it->second != shuffle)
    warnings->push_back("the data order changed: the checkpoint's run used --shuffle " +
                        it->second + ", this run " + shuffle);
  if (auto it = meta.info.find("seed");
      it != meta.info.end() && it->second != std::to_string(s.options().seed) &&
      plan.hasInstruction(plan::OpCode::Dropout))
    warnings->push_back("dropout's masks changed: the checkpoint's run used --seed " + it->second +
                        ", this run " + std::to_string(s.options().seed));
  std::set<std::string> planStates;
  for (size_t i = 0; i < plan.tensors().size(); ++i) {
    const TensorInfo &t = plan.tensors()[i];
    if (!checkpointed(t))
      continue;
    bool state = t.kind == plan::TensorKind::OptimizerState;
    if (state)
      planStates.insert(t.name);
    auto it = meta.tensors.find(t.name);
    if (state && (it == meta.tensors.end() || it->second.shape != t.globalShape)) {
      if (s.leader())
        warnings->push_back("optimizer state '" + t.name +
                            "' is not in the checkpoint (or has another shape): it starts from zero");
      continue;
    }
    if (!s.executor().holds(static_cast<int32_t>(i)))
      continue;
    // Only this rank's boxes, from the shards that overlap them.
    std::vector<CheckpointReader::Box> boxes;
    for (const auto &b : s.executor().localBoxes(static_cast<int32_t>(i)))
      boxes.push_back({b.wholeOffset, b.localOffset, b.shape});
    std::vector<float> local(static_cast<size_t>(t.numElements));
    PTC_RETURN_IF_ERROR(reader->readLocal(t.name, boxes, t.shape, local.data()));
    PTC_RETURN_IF_ERROR(s.executor().loadLocal(static_cast<int32_t>(i), local.data()));
  }
  for (const auto &[name, t] : meta.tensors)
    if (t.kind == "state" && !planStates.count(name) && s.leader())
      warnings->push_back("the checkpoint's optimizer state '" + name + "' has no use in this plan");
  return meta.step;
}

Status CheckpointHook::finishPending(TrainingSession &session) {
  if (!pending_)
    return Status::ok();
  if (writer_.joinable())
    writer_.join();
  Status s = publishCheckpoint(session, *pending_, keepLast_);
  lastSaved_ = pending_->steps;
  pending_.reset();
  return s;
}

Status CheckpointHook::save(TrainingSession &session, int64_t steps) {
  if (!async_) {
    PTC_RETURN_IF_ERROR(saveCheckpoint(session, dir_, steps, keepLast_));
    lastSaved_ = steps;
    return Status::ok();
  }
  // The step boundary copies the shards to host memory; a thread writes them;
  // the next boundary (or the end of the run) publishes the checkpoint.
  PTC_RETURN_IF_ERROR(finishPending(session));
  pending_ = std::make_unique<PendingCheckpoint>();
  PTC_RETURN_IF_ERROR(prepareCheckpoint(session, dir_, steps, *pending_));
  PendingCheckpoint *p = pending_.get();
  int rank = session.rank();
  writer_ = std::thread([p, rank] {
    auto shard = writeShard(*p->snapshot, rank, p->tmp);
    p->shard = shard.isOk() ? *shard : "error:" + shard.status().message();
  });
  return Status::ok();
}

Status CheckpointHook::afterStep(TrainingSession &session, const StepResult &r) {
  // An asynchronous checkpoint is published at the boundary after its write.
  PTC_RETURN_IF_ERROR(finishPending(session));
  if (every_ <= 0 || (r.step + 1) % every_ != 0)
    return Status::ok();
  auto t0 = std::chrono::steady_clock::now();
  PTC_RETURN_IF_ERROR(save(session, r.step + 1));
  blockedSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++saves_;
  return Status::ok();
}

CheckpointHook::~CheckpointHook() {
  if (writer_.joinable())
    writer_.join();
}

} // namespace ptc
