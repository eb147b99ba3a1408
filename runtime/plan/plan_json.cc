// JSON rendering of a verified plan (ptc-run --dump-plan).

#include "runtime/plan/plan_loader.h"

#include <nlohmann/json.hpp>

namespace ptc {

std::string planToJson(const LoadedPlan &loaded) {
  const plan::Plan &p = loaded.plan();
  nlohmann::ordered_json j;
  j["format_version"] = p.format_version();
  j["producer"] = p.producer() ? p.producer()->str() : "";
  j["num_ranks"] = p.num_ranks();
  if (p.model_flops() > 0)
    j["model_flops"] = p.model_flops();
  if (p.offload_path())
    j["offload_path"] = p.offload_path()->str();
  if (!loaded.meshAxes().empty()) {
    nlohmann::ordered_json mesh = nlohmann::ordered_json::object();
    for (size_t i = 0; i < loaded.meshAxes().size(); ++i)
      mesh[loaded.meshAxes()[i]] = loaded.meshSizes()[i];
    j["mesh"] = mesh;
  }
  j["optimizer"] = p.optimizer() ? p.optimizer()->str() : "";
  j["arena_bytes"] = p.arena_bytes();
  j["arena_bytes_unshared"] = p.arena_bytes_unshared();
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (size_t i = 0; i < loaded.tensors().size(); ++i) {
    const TensorInfo &t = loaded.tensors()[i];
    nlohmann::ordered_json tj;
    tj["id"] = i;
    tj["name"] = t.name;
    tj["kind"] = tensorKindName(t.kind);
    tj["dtype"] = dtypeName(t.dtype);
    tj["shape"] = t.shape;
    if (!t.dimAxes.empty()) {
      std::string spec = "[";
      for (size_t d = 0; d < t.dimAxes.size(); ++d)
        spec += (d ? ", " : "") +
                (t.dimAxes[d] < 0 ? std::string("_")
                                  : loaded.meshAxes()[t.dimAxes[d]] +
                                        (t.dimBlocks[d] > 1 ? "/" + std::to_string(t.dimBlocks[d]) : ""));
      tj["sharding"] = spec + "]";
    }
    if (t.host)
      tj["host"] = true;
    if (t.copyOf >= 0)
      tj["copy_of"] = t.copyOf;
    else if (t.kind == plan::TensorKind::Temporary)
      tj["arena_offset"] = t.arenaOffset;
    const plan::Tensor *pt = p.tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (t.kind == plan::TensorKind::Parameter) {
      tj["init"] = plan::EnumNameInitKind(pt->init());
      if (pt->init() == plan::InitKind::Normal)
        tj["init_std"] = pt->init_std();
    }
    tensors.push_back(tj);
  }
  j["tensors"] = tensors;
  nlohmann::ordered_json instructions = nlohmann::ordered_json::array();
  for (const plan::Instruction *inst : *p.instructions()) {
    nlohmann::ordered_json ij;
    ij["op"] = opcodeName(inst->op());
    ij["inputs"] = std::vector<int32_t>(inputsOf(*inst).begin(), inputsOf(*inst).end());
    ij["outputs"] = std::vector<int32_t>(outputsOf(*inst).begin(), outputsOf(*inst).end());
    if (inst->ints() && inst->ints()->size())
      ij["ints"] = std::vector<int64_t>(inst->ints()->begin(), inst->ints()->end());
    if (inst->floats() && inst->floats()->size())
      ij["floats"] = std::vector<double>(inst->floats()->begin(), inst->floats()->end());
    if (inst->function())
      ij["function"] = inst->function()->str();
    if (inst->location())
      ij["location"] = inst->location()->str();
    if (inst->chunk() >= 0 || inst->segment() != plan::Segment::Step) {
      ij["chunk"] = inst->chunk();
      ij["segment"] = plan::EnumNameSegment(inst->segment());
    }
    if (inst->on_host())
      ij["on_host"] = true;
    instructions.push_back(ij);
  }
  j["instructions"] = instructions;
  nlohmann::ordered_json outputs = nlohmann::ordered_json::object();
  if (p.outputs())
    for (const plan::Output *o : *p.outputs())
      outputs[o->name() ? o->name()->str() : ""] = o->tensor();
  j["outputs"] = outputs;
  if (loaded.pipelined()) {
    const schedule::Pipeline &sp = loaded.pipeline();
    j["microbatches"] = sp.microbatches;
    j["pipeline"] = {{"schedule", p.pipeline()->schedule() ? p.pipeline()->schedule()->str() : ""},
                     {"ranks", sp.ranks},
                     {"chunks", sp.chunks},
                     {"split_weight", sp.splitWeight}};
    nlohmann::ordered_json channels = nlohmann::ordered_json::array();
    for (size_t c = 0; c < sp.channels.size(); ++c) {
      const plan::Channel *ch = p.pipeline()->channels()->Get(static_cast<flatbuffers::uoffset_t>(c));
      channels.push_back({{"id", c},
                          {"from", ch->from_chunk()},
                          {"to", ch->to_chunk()},
                          {"segments", ch->per_step()
                                           ? std::string(ch->at_end() ? "after the micro-batches"
                                                                      : "before the micro-batches")
                                           : std::string(plan::EnumNameSegment(ch->from_segment())) +
                                                 " -> " + plan::EnumNameSegment(ch->to_segment())},
                          {"bytes", sp.channels[c].bytes}});
    }
    j["channels"] = channels;
    nlohmann::ordered_json actions = nlohmann::ordered_json::array();
    for (const auto &list : sp.actions) {
      std::string line;
      for (const schedule::Action &a : list)
        line += (line.empty() ? "" : ", ") + schedule::describe(a);
      actions.push_back(line);
    }
    j["actions"] = actions;
  }
  // One line per field, tensor and instruction: readable, and easy to grep.
  std::string text = "{\n";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    text += first ? "" : ",\n";
    first = false;
    text += " \"" + it.key() + "\": ";
    if (it.value().is_array()) {
      text += "[";
      for (size_t i = 0; i < it.value().size(); ++i)
        text += (i ? ",\n  " : "\n  ") + it.value()[i].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      text += it.value().empty() ? "]" : "\n ]";
    } else {
      text += it.value().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
  }
  return text + "\n}";
}

} // namespace ptc
