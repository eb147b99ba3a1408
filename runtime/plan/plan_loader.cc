// Plan loading and verification. A plan is untrusted input: every index,
// shape and offset is checked here once, so that kernels can trust them.

#include "runtime/plan/plan_loader.h"

#include "runtime/base/checked_math.h"
#include "runtime/base/read_file.h"
#include "runtime/base/text.h"

#include "runtime/plan/arena_liveness.h"
#include "runtime/plan/instruction_checks.h"
#include "runtime/plan/plan_format.h"
#include "runtime/plan/plan_ops.h"

#include "kernels/common/elementwise.h"
#include "kernels/common/kernel_call.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>

namespace ptc {

using plan::DType;
using plan::OpCode;
using plan::ShapeRule;
using plan::TensorKind;

int64_t dtypeSize(DType dtype) {
  switch (dtype) {
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::BF16:
  case DType::F16:
    return 2;
  }
  return 0;
}

/// Whether a (signed) schema enum holds one of its values: a corrupt plan can
/// store any byte, negative ones included.
template <typename E> bool enumInRange(E value) {
  auto v = static_cast<int64_t>(value);
  return v >= static_cast<int64_t>(E::MIN) && v <= static_cast<int64_t>(E::MAX);
}

const char *dtypeName(DType dtype) {
  const char *name = plan::EnumNameDType(dtype);
  return name && *name ? name : "unknown";
}

const char *opcodeName(OpCode op) {
  const plan::OpInfo *info = plan::lookupOp(op);
  return info ? info->name : "unknown";
}

const char *tensorKindName(TensorKind kind) {
  const char *name = plan::EnumNameTensorKind(kind);
  return name && *name ? name : "unknown";
}

StatusOr<std::shared_ptr<const LoadedPlan>> LoadedPlan::loadFile(const std::string &path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return invalidArgument("plan '", path, "' is a directory, not a plan file");
  StatusOr<std::vector<uint8_t>> bytes = readRegularFile(path, "plan");
  if (!bytes.isOk())
    return bytes.status();
  return loadBytes(std::move(*bytes), path);
}

StatusOr<std::shared_ptr<const LoadedPlan>> LoadedPlan::loadBytes(std::vector<uint8_t> bytes,
                                                                  const std::string &origin) {
  auto loaded = std::shared_ptr<LoadedPlan>(new LoadedPlan());
  loaded->bytes_ = std::move(bytes);
  loaded->origin_ = origin;
  Status status = loaded->verify();
  if (!status.isOk())
    return Status(status.code(), "plan '" + origin + "': " + status.message());
  return std::shared_ptr<const LoadedPlan>(std::move(loaded));
}

bool LoadedPlan::hasInstruction(plan::OpCode code) const {
  for (const plan::Instruction *inst : *plan_->instructions())
    if (inst->op() == code)
      return true;
  return false;
}

int32_t LoadedPlan::findTensor(const std::string &name, TensorKind kind) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].kind == kind && tensors_[i].name == name)
      return static_cast<int32_t>(i);
  return -1;
}

int32_t LoadedPlan::findOutput(const std::string &name) const {
  if (!plan_->outputs())
    return -1;
  for (const plan::Output *out : *plan_->outputs())
    if (out->name() && out->name()->str() == name)
      return out->tensor();
  return -1;
}

using Shape = std::vector<int64_t>;

std::string describeInstruction(const plan::Instruction &inst, size_t n) {
  std::string loc = inst.location() ? inst.location()->str() : "";
  return "instruction #" + std::to_string(n) + " (" + opcodeName(inst.op()) +
         (loc.empty() ? "" : " at " + loc) + ")";
}

std::vector<bool> LoadedPlan::tensorsOnPipelineRank(int rank) const {
  std::vector<bool> here(tensors_.size(), !pipelined());
  if (!pipelined())
    return here;
  for (const plan::Instruction *inst : *plan_->instructions()) {
    if (!runsOnPipelineRank(*inst, rank))
      continue;
    for (int32_t id : inputsOf(*inst))
      here[static_cast<size_t>(id)] = true;
    for (int32_t id : outputsOf(*inst))
      here[static_cast<size_t>(id)] = true;
  }
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (plan_->tensors()->Get(static_cast<flatbuffers::uoffset_t>(i))->pp_rank() == rank ||
        tensors_[i].kind == TensorKind::Constant)
      here[i] = true;
  return here;
}

Status LoadedPlan::verify() {
  if (bytes_.size() < 8 || !plan::PlanBufferHasIdentifier(bytes_.data()))
    return error(StatusCode::kDataLoss, "not a ptc plan (missing file identifier \"",
                 plan::PlanIdentifier(), "\")");
  flatbuffers::Verifier verifier(bytes_.data(), bytes_.size());
  if (!plan::VerifyPlanBuffer(verifier))
    return error(StatusCode::kDataLoss, "corrupt or truncated plan (FlatBuffers verification failed)");
  plan_ = plan::GetPlan(bytes_.data());
  if (plan_->format_version() > plan::kFormatVersion)
    return invalidArgument("plan format version ", plan_->format_version(),
                           " is newer than this ptc-run supports (", plan::kFormatVersion,
                           "); rebuild the plan with a matching ptc-opt or update ptc-run");
  if (plan_->format_version() == 0)
    return invalidArgument("plan has no format version");
  if (plan_->format_version() < plan::kOldestFormatVersion)
    return invalidArgument("plan format version ", plan_->format_version(),
                           " is older than this ptc-run reads (", plan::kOldestFormatVersion, " to ",
                           plan::kFormatVersion,
                           "): its opcodes mean other things now; recompile it with ptc-opt");
  if (!plan_->tensors() || !plan_->instructions())
    return invalidArgument("plan has no tensor or instruction table");
  // Version 6 changed how MoE dispatch and combine fill expert capacity
  // (choice-major, per routing group): an older plan using them would route
  // differently than it was compiled to.
  if (plan_->format_version() < 6)
    for (const plan::Instruction *inst : *plan_->instructions())
      if (inst && (inst->op() == plan::OpCode::MoeDispatch || inst->op() == plan::OpCode::MoeCombine))
        return invalidArgument("plan format version ", plan_->format_version(),
                               " routes mixture-of-experts tokens in the old slot order "
                               "(version 6 fills capacity choice-major per routing group); "
                               "recompile it with ptc-opt");
  if (plan_->offload_path() &&
      (plan_->offload_path()->size() == 0 || !isPrintableUtf8(plan_->offload_path()->string_view())))
    return error(StatusCode::kDataLoss, "the plan's offload directory is empty or not printable text");
  if (!std::isfinite(plan_->model_flops()) || plan_->model_flops() < 0)
    return error(StatusCode::kDataLoss, "the plan's model FLOPs (", plan_->model_flops(),
                 ") is not a finite number >= 0");
  // FlatBuffers' verifier checks a vector's length word, not the alignment of
  // 8-byte elements; a builder always aligns them, a corrupt file may not.
  auto aligned = [](const auto *v) {
    return !v || v->size() == 0 || reinterpret_cast<uintptr_t>(v->data()) % alignof(int64_t) == 0;
  };
  for (size_t i = 0; i < plan_->tensors()->size(); ++i)
    if (!aligned(plan_->tensors()->Get(static_cast<flatbuffers::uoffset_t>(i))->shape()))
      return error(StatusCode::kDataLoss, "corrupt plan: tensor #", i, "'s shape is misaligned");
  for (size_t n = 0; n < plan_->instructions()->size(); ++n) {
    const plan::Instruction *inst = plan_->instructions()->Get(static_cast<flatbuffers::uoffset_t>(n));
    if (!aligned(inst->ints()) || !aligned(inst->floats()))
      return error(StatusCode::kDataLoss, "corrupt plan: instruction #", n,
                   "'s attributes are misaligned");
  }
  if (plan_->pipeline() && !aligned(plan_->pipeline()->arena_bytes()))
    return error(StatusCode::kDataLoss, "corrupt plan: the pipeline's arena sizes are misaligned");
  if (plan_->num_ranks() < 1)
    return invalidArgument("plan needs ", plan_->num_ranks(), " ranks");
  int64_t meshRanks = 1;
  if (plan_->mesh())
    for (const plan::MeshAxis *axis : *plan_->mesh()) {
      std::string name = axis->name() ? axis->name()->str() : "";
      if (!isPrintableUtf8(name))
        return invalidArgument("mesh axis '", escapedForMessage(name),
                               "' has a name that is not printable UTF-8");
      if (name.empty() || axis->size() < 1 || axis->size() > kMaxMeshAxisSize)
        return invalidArgument("mesh axis '", name, "' has size ", axis->size(), " (1 to ",
                               kMaxMeshAxisSize, ")");
      if (std::find(meshAxes_.begin(), meshAxes_.end(), name) != meshAxes_.end())
        return invalidArgument("mesh axis '", name, "' appears twice");
      std::optional<int64_t> product = checkedMul(meshRanks, axis->size());
      if (!product || *product > kMaxMeshDevices)
        return invalidArgument("mesh of ", meshAxes_.size() + 1, " axes (up to '", name,
                               "') has more than ", kMaxMeshDevices, " devices");
      meshAxes_.push_back(name);
      meshSizes_.push_back(axis->size());
      meshRanks = *product;
    }
  if (meshRanks != plan_->num_ranks())
    return invalidArgument("plan needs ", plan_->num_ranks(), " ranks but its mesh has ",
                           meshRanks, " devices");

  const int64_t arena = plan_->arena_bytes();
  if (arena < 0 || arena > kMaxDeviceBytes)
    return invalidArgument("arena of ", arena, " bytes (0 to ", kMaxDeviceBytes, ")");
  int64_t totalBytes = arena; // of every tensor and the arena: bounds the sums made of them
  std::set<std::pair<int, std::string>> names;
  for (size_t i = 0; i < plan_->tensors()->size(); ++i) {
    const plan::Tensor *t = plan_->tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
    TensorInfo info;
    info.name = t->name() ? t->name()->str() : "";
    info.kind = t->kind();
    info.dtype = t->dtype();
    auto where = [&] { return "tensor #" + std::to_string(i) + " ('" + info.name + "')"; };
    if (!isPrintableUtf8(info.name))
      return invalidArgument("tensor #", i, "'s name '", escapedForMessage(info.name),
                             "' is not printable UTF-8 (control characters or invalid bytes)");
    if (!enumInRange(info.kind) || !enumInRange(info.dtype) || !enumInRange(t->init()))
      return invalidArgument(where(), " has an unknown kind, dtype or initializer (",
                             static_cast<int>(info.kind), ", ", static_cast<int>(info.dtype), ", ",
                             static_cast<int>(t->init()), ")");
    if (t->shape())
      info.shape.assign(t->shape()->begin(), t->shape()->end());
    for (int64_t d : info.shape)
      if (d < 1)
        return invalidArgument(where(), " of shape ", shapeStr(info.shape),
                               d == 0 ? " has a zero-size dimension (tensors are never empty)"
                                      : " has a negative dimension");
    std::optional<int64_t> elements = checkedProduct(info.shape, kMaxTensorElements);
    if (!elements)
      return invalidArgument(where(), " of shape ", shapeStr(info.shape), " has more than ",
                             kMaxTensorElements, " elements");
    info.numElements = *elements;
    info.bytes = info.numElements * dtypeSize(info.dtype);
    std::optional<int64_t> total = checkedAdd(totalBytes, info.bytes);
    if (!total || *total > kMaxDeviceBytes)
      return invalidArgument(where(), ": the plan's tensors and arena exceed ", kMaxDeviceBytes,
                             " bytes per device");
    totalBytes = *total;
    if (t->dim_axes()) {
      info.dimAxes.assign(t->dim_axes()->begin(), t->dim_axes()->end());
      if (info.dimAxes.size() != info.shape.size())
        return invalidArgument(where(), " has ", info.dimAxes.size(), " mesh axes for rank ",
                               info.shape.size());
      for (int a : info.dimAxes)
        if (a < -1 || a >= static_cast<int>(meshSizes_.size()))
          return invalidArgument(where(), " names mesh axis ", a, ", which the plan's mesh lacks");
      if (t->dim_blocks())
        info.dimBlocks.assign(t->dim_blocks()->begin(), t->dim_blocks()->end());
      else
        info.dimBlocks.assign(info.dimAxes.size(), 1);
      if (info.dimBlocks.size() != info.dimAxes.size())
        return invalidArgument(where(), " has ", info.dimBlocks.size(), " block counts for rank ",
                               info.dimAxes.size());
      for (size_t d = 0; d < info.dimAxes.size(); ++d)
        if (info.dimBlocks[d] < 1 || info.shape[d] % info.dimBlocks[d] != 0)
          return invalidArgument(where(), " has an invalid block count in dimension ", d);
    }
    info.globalShape = info.shape;
    for (size_t d = 0; d < info.dimAxes.size(); ++d)
      if (info.dimAxes[d] >= 0)
        info.globalShape[d] *= meshSizes_[static_cast<size_t>(info.dimAxes[d])];
    if (!checkedProduct(info.globalShape, kMaxGlobalElements))
      return invalidArgument(where(), "'s global shape ", shapeStr(info.globalShape), " is too large");
    bool persistent = info.kind == TensorKind::Parameter || info.kind == TensorKind::OptimizerState ||
                      info.kind == TensorKind::Input || info.kind == TensorKind::WorkingCopy;
    if (persistent && info.name.empty())
      return invalidArgument(where(), " needs a name");
    if (persistent && !names.insert({static_cast<int>(info.kind), info.name}).second)
      return invalidArgument("two ", tensorKindName(info.kind), " tensors are named '",
                             info.name, "'");
    info.host = t->host();
    if (info.host && plan_->format_version() < 7)
      return invalidArgument(where(), " is a host tensor, which needs plan format version 7");
    if (info.kind == TensorKind::Temporary && info.host) {
      // Host temporaries are allocated outside the device arena.
      if (t->arena_offset() != -1)
        return invalidArgument(where(), " is a host temporary with arena offset ",
                               t->arena_offset(), " (expected none)");
    } else if (info.kind == TensorKind::Temporary) {
      info.arenaOffset = t->arena_offset();
      if (info.arenaOffset % 4 != 0)
        return invalidArgument(where(), " has arena offset ", info.arenaOffset,
                               ", which is not a multiple of 4 bytes");
      if (info.arenaOffset < 0 || info.arenaOffset > arena || info.bytes > arena - info.arenaOffset)
        return invalidArgument(where(), " at arena offset ", info.arenaOffset, " (", info.bytes,
                               " bytes) lies outside the ", arena, "-byte arena");
    }
    if (info.kind == TensorKind::Constant) {
      int64_t size = t->data() ? static_cast<int64_t>(t->data()->size()) : 0;
      if (size != info.bytes && size != dtypeSize(info.dtype))
        return invalidArgument(where(), " has ", size, " bytes of data, expected ", info.bytes,
                               " or one splat element");
    }
    if (info.kind == TensorKind::Parameter && t->init() == plan::InitKind::Normal &&
        !(t->init_std() > 0))
      return invalidArgument(where(), " has a normal initializer with std ", t->init_std());
    if ((info.kind == TensorKind::WorkingCopy) != (t->copy_of() >= 0))
      return invalidArgument(where(), info.kind == TensorKind::WorkingCopy
                                          ? " is a working copy of no parameter"
                                          : " names a parameter it copies but is no working copy");
    if (info.kind == TensorKind::WorkingCopy) {
      // Rounds an earlier f32 parameter to bf16 / f16, with its local shape,
      // split and pipeline rank, on the device.
      const int32_t of = t->copy_of();
      const TensorInfo *param =
          of < static_cast<int32_t>(tensors_.size()) ? &tensors_[static_cast<size_t>(of)] : nullptr;
      if (!param || param->kind != TensorKind::Parameter)
        return invalidArgument(where(), " is a working copy of tensor #", of,
                               ", which is no parameter before it");
      if (param->workingCopy >= 0)
        return invalidArgument(where(), " is a second working copy of parameter '", param->name,
                               "' (tensor #", param->workingCopy,
                               " is one): its update writes one only");
      const plan::Tensor *pt = plan_->tensors()->Get(static_cast<flatbuffers::uoffset_t>(of));
      if (param->dtype != DType::F32 || (info.dtype != DType::BF16 && info.dtype != DType::F16))
        return invalidArgument(where(), " is ", dtypeName(info.dtype), ", a working copy of ",
                               dtypeName(param->dtype), " parameter '", param->name,
                               "': expected bf16 or f16 of f32");
      if (param->shape != info.shape || param->dimAxes != info.dimAxes ||
          param->dimBlocks != info.dimBlocks || pt->pp_rank() != t->pp_rank() || info.host ||
          param->host)
        return invalidArgument(where(), " of shape ", shapeStr(info.shape),
                               " does not lie like its parameter '", param->name, "' (",
                               shapeStr(param->shape),
                               "): the same local shape, split and pipeline rank, on the device");
      info.copyOf = of;
      tensors_[static_cast<size_t>(of)].workingCopy = static_cast<int32_t>(tensors_.size());
    }
    tensors_.push_back(std::move(info));
  }

  // Instructions: operand checks and def-before-use of temporaries.
  std::vector<bool> written(tensors_.size(), false);
  for (size_t i = 0; i < tensors_.size(); ++i)
    written[i] = tensors_[i].kind != TensorKind::Temporary;
  for (size_t n = 0; n < plan_->instructions()->size(); ++n) {
    const plan::Instruction *inst = plan_->instructions()->Get(static_cast<flatbuffers::uoffset_t>(n));
    Status status = checkInstruction(*inst, tensors_, meshSizes_);
    auto where = [&] { return describeInstruction(*inst, n); };
    if (!status.isOk())
      return Status(status.code(), where() + ": " + status.message());
    status = checkPlacement(*inst, tensors_);
    if (!status.isOk())
      return Status(status.code(), where() + ": " + status.message());
    for (int32_t id : inputsOf(*inst))
      if (!written[static_cast<size_t>(id)])
        return invalidArgument(where(), " reads temporary '", tensors_[id].name,
                               "' before any instruction writes it");
    for (int32_t id : outputsOf(*inst))
      written[static_cast<size_t>(id)] = true;
  }
  PTC_RETURN_IF_ERROR(verifyPipeline());
  if (plan_->outputs())
    for (const plan::Output *out : *plan_->outputs())
      if (out->name() && !isPrintableUtf8(out->name()->string_view()))
        return invalidArgument("output '", escapedForMessage(out->name()->string_view()),
                               "' has a name that is not printable UTF-8");
  if (plan_->outputs())
    for (const plan::Output *out : *plan_->outputs())
      if (out->tensor() < 0 || static_cast<size_t>(out->tensor()) >= tensors_.size() ||
          !written[out->tensor()])
        return invalidArgument("output '", out->name() ? out->name()->str() : "", "' refers to ",
                               "an invalid or unwritten tensor");
  return verifyArenaLiveness(*this);
}

Status LoadedPlan::verifyPipeline() {
  const plan::Pipeline *pl = plan_->pipeline();
  microbatches_ = plan_->microbatches();
  if (microbatches_ < 1 || microbatches_ > kMaxMicrobatches)
    return invalidArgument("micro-batch count ", microbatches_, " must be 1 to ", kMaxMicrobatches);
  const auto &insts = *plan_->instructions();
  if (!pl) {
    if (microbatches_ != 1)
      return invalidArgument(microbatches_, " micro-batches but no pipeline schedule");
    for (const plan::Instruction *inst : insts)
      if (inst->op() == OpCode::Send || inst->op() == OpCode::Recv ||
          inst->op() == OpCode::MicrobatchSum)
        return invalidArgument(opcodeName(inst->op()), " instruction in a plan without a pipeline");
    return Status::ok();
  }
  schedule::Pipeline &p = pipeline_;
  p.ranks = pl->ranks();
  p.chunks = pl->chunks();
  p.microbatches = microbatches_;
  p.splitWeight = pl->split_weight();
  ppAxis_ = pl->axis();
  if (ppAxis_ >= static_cast<int>(meshSizes_.size()) ||
      (ppAxis_ < 0 ? p.ranks != 1 : meshSizes_[static_cast<size_t>(ppAxis_)] != p.ranks))
    return invalidArgument("pipeline of ", p.ranks, " ranks does not match mesh axis ", ppAxis_);
  if (p.chunks < p.ranks || p.chunks % p.ranks != 0)
    return invalidArgument("pipeline of ", p.ranks, " ranks cannot hold ", p.chunks, " chunks");
  if (!pl->arena_bytes() || pl->arena_bytes()->size() != static_cast<size_t>(p.ranks))
    return invalidArgument("pipeline needs one arena size per rank");
  for (int64_t a : *pl->arena_bytes())
    if (a < 0 || a > plan_->arena_bytes())
      return invalidArgument("pipeline rank arena of ", a, " bytes exceeds the plan's arena");
  auto segmentOk = [](plan::Segment s) { return enumInRange(s) && s <= plan::Segment::Weight; };
  if (pl->channels())
    for (size_t c = 0; c < pl->channels()->size(); ++c) {
      const plan::Channel *ch = pl->channels()->Get(static_cast<flatbuffers::uoffset_t>(c));
      if (!segmentOk(ch->from_segment()) || !segmentOk(ch->to_segment()) || ch->send_tensor() < 0 ||
          static_cast<size_t>(ch->send_tensor()) >= tensors_.size() || ch->recv_tensor() < 0 ||
          static_cast<size_t>(ch->recv_tensor()) >= tensors_.size() ||
          tensors_[ch->send_tensor()].bytes != tensors_[ch->recv_tensor()].bytes)
        return invalidArgument("channel ", c, " is malformed (segments ",
                               static_cast<int>(ch->from_segment()), " -> ",
                               static_cast<int>(ch->to_segment()), ", tensors ", ch->send_tensor(),
                               " -> ", ch->recv_tensor(), ")");
      if (ch->at_end() && !ch->per_step())
        return invalidArgument("channel ", c, " is sent at the end but not once per step");
      p.channels.push_back({ch->from_chunk(), ch->to_chunk(),
                            static_cast<schedule::Segment>(ch->from_segment()),
                            static_cast<schedule::Segment>(ch->to_segment()), ch->per_step(),
                            ch->at_end(), tensors_[ch->send_tensor()].bytes});
    }
  // Send / recv instructions and their channels, one each.
  std::vector<int> sends(p.channels.size(), 0), recvs(p.channels.size(), 0);
  for (size_t n = 0; n < insts.size(); ++n) {
    const plan::Instruction *inst = insts.Get(static_cast<flatbuffers::uoffset_t>(n));
    if (inst->chunk() < -1 || inst->chunk() >= p.chunks || !enumInRange(inst->segment()))
      return invalidArgument("instruction #", n, " has chunk ", inst->chunk(), " of ", p.chunks);
    if (inst->op() != OpCode::Send && inst->op() != OpCode::Recv)
      continue;
    const int64_t c = plan::attrOf(*inst, kernels::attr::Channel::channel);
    if (c < 0 || static_cast<size_t>(c) >= p.channels.size())
      return invalidArgument("instruction #", n, " (", opcodeName(inst->op()), ") uses channel ", c,
                             ", the plan has ", p.channels.size());
    const plan::Channel *ch = pl->channels()->Get(static_cast<flatbuffers::uoffset_t>(c));
    bool isSend = inst->op() == OpCode::Send;
    int32_t tensor = isSend ? (inputsOf(*inst))[0] : (outputsOf(*inst))[0];
    if (tensor != (isSend ? ch->send_tensor() : ch->recv_tensor()) ||
        inst->chunk() != (isSend ? ch->from_chunk() : ch->to_chunk()))
      return invalidArgument("instruction #", n, " (", opcodeName(inst->op()),
                             ") does not match channel ", c);
    ++(isSend ? sends : recvs)[static_cast<size_t>(c)];
  }
  for (size_t c = 0; c < p.channels.size(); ++c)
    if (sends[c] != 1 || recvs[c] != 1)
      return invalidArgument("channel ", c, " (chunk ", p.channels[c].from, " -> ",
                             p.channels[c].to, ") has ", sends[c], " send and ", recvs[c],
                             " recv instructions, expected one each");
  // Each pipeline rank runs the instructions of its chunks (and of chunk -1):
  // a temporary one of them reads must be written on that rank (by one of
  // them, a receive included). An instruction moved to another chunk passes
  // the plan-wide check but would read memory its rank never wrote.
  for (int r = 0; r < p.ranks; ++r) {
    std::vector<bool> written(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i)
      written[i] = tensors_[i].kind != TensorKind::Temporary;
    for (size_t n = 0; n < insts.size(); ++n) {
      const plan::Instruction *inst = insts.Get(static_cast<flatbuffers::uoffset_t>(n));
      if (inst->chunk() >= 0 && inst->chunk() % p.ranks != r)
        continue;
      for (int32_t id : inputsOf(*inst))
        if (!written[static_cast<size_t>(id)]) {
          std::string loc = inst->location() ? inst->location()->str() : "";
          return invalidArgument("instruction #", n, " (", opcodeName(inst->op()),
                                 loc.empty() ? "" : " at " + loc, ", chunk ", inst->chunk(),
                                 ") reads temporary '", tensors_[static_cast<size_t>(id)].name,
                                 "', which no instruction of pipeline rank ", r, " writes");
        }
      for (int32_t id : outputsOf(*inst))
        written[static_cast<size_t>(id)] = true;
    }
  }
  if (!pl->actions())
    return invalidArgument("pipeline has no schedule");
  for (const plan::RankActions *list : *pl->actions()) {
    p.actions.emplace_back();
    if (list->actions())
      for (const plan::Action *a : *list->actions()) {
        if (!enumInRange(a->kind()))
          return invalidArgument("pipeline rank ", p.actions.size() - 1, "'s action #",
                                 p.actions.back().size(), " has unknown kind ",
                                 static_cast<int>(a->kind()));
        p.actions.back().push_back({static_cast<schedule::ActionKind>(a->kind()), a->chunk(),
                                    a->mb(), a->channel()});
      }
  }
  Status s = schedule::verify(p);
  if (!s.isOk())
    return invalidArgument("schedule '", pl->schedule() ? pl->schedule()->str() : "", "': ",
                           s.message());
  return Status::ok();
}

} // namespace ptc
