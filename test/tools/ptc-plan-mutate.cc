// Test utility: writes a copy of a plan with one deliberate defect in its
// pipeline schedule, to check that ptc-run rejects it at load.
//   ptc-plan-mutate IN OUT drop-send    remove rank 0's first per-micro-batch SEND
//   ptc-plan-mutate IN OUT swap-recvs   swap the first two per-micro-batch RECVs of
//                                       the last pipeline rank
//   ptc-plan-mutate IN OUT drop-send-instruction   remove the first Send instruction
//   ptc-plan-mutate IN OUT negative-action-kind     rank 0's first action gets kind -1
//   ptc-plan-mutate IN OUT negative-channel-segment channel 0's producer segment is -1
//   ptc-plan-mutate IN OUT negative-tensor-kind     tensor 0 gets kind -1
//   ptc-plan-mutate IN OUT unknown-init             the first parameter's initializer is 9
//   ptc-plan-mutate IN OUT drop-inputs              the first instruction loses its input list
//   ptc-plan-mutate IN OUT non-utf8-name            tensor 0 is named with invalid UTF-8 bytes
//   ptc-plan-mutate IN OUT nul-name                 tensor 0's name holds a NUL and an escape
//   ptc-plan-mutate IN OUT device-update   the first host instruction (offload) runs on
//                                          the device, its tensors staying on the host
//   ptc-plan-mutate IN OUT host-all-reduce the first AllReduce is marked to run on the host
//   ptc-plan-mutate IN OUT mesh:dp=65536,tp=65536       the mesh becomes these axes (names and
//                                                   sizes; the rank count is kept)
//   ptc-plan-mutate IN OUT arena-max                the arena is INT64_MAX bytes
//   ptc-plan-mutate IN OUT arena-offset-overflow    the first arena temporary sits at offset
//                                                   INT64_MAX - 3 (offset + size overflows)
//   ptc-plan-mutate IN OUT zero-dim                 the first temporary's dimension 0 becomes 0
//   ptc-plan-mutate IN OUT slice-offset-overflow    the first Slice's last offset becomes
//                                                   INT64_MAX - 7 (offset + size overflows)
//   ptc-plan-mutate IN OUT overlap-live             the output of the first instruction that
//                                                   maps a temporary to one of its shape (not a
//                                                   Reshape) takes that input's arena offset
//   ptc-plan-mutate IN OUT move-to-chunk-0          the first chunk-1 instruction that reads a
//                                                   temporary moves to chunk 0
//   ptc-plan-mutate IN OUT copy-of-state            the first working copy names an optimizer
//                                                   state tensor as its parameter
//   ptc-plan-mutate IN OUT swap-copies              the first two updates that write working
//                                                   copies write each other's
//   ptc-plan-mutate IN OUT second-copy              the second working copy rounds the first
//                                                   one's parameter

#include "runtime/plan/plan_generated.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>

using namespace ptc::plan;

int main(int argc, char **argv) {
  if (argc != 4) {
    std::cerr << "usage: ptc-plan-mutate IN OUT MUTATION (see the file's header)\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!VerifyPlanBuffer(verifier)) {
    std::cerr << "ptc-plan-mutate: '" << argv[1] << "' is not a plan\n";
    return 1;
  }
  std::unique_ptr<PlanT> plan(GetPlan(bytes.data())->UnPack());
  std::string what = argv[3];
  bool pipelineMutation = what == "drop-send" || what == "swap-recvs" ||
                          what == "negative-action-kind" || what == "negative-channel-segment" ||
                          what == "move-to-chunk-0";
  if (pipelineMutation && (!plan->pipeline || plan->pipeline->actions.empty())) {
    std::cerr << "ptc-plan-mutate: the plan has no pipeline schedule\n";
    return 1;
  }
  bool done = false;
  if (what == "negative-action-kind") {
    auto &list = plan->pipeline->actions.front()->actions;
    if (!list.empty()) {
      const Action &a = list.front();
      list.front() = Action(static_cast<ActionKind>(-1), a.chunk(), a.mb(), a.channel());
      done = true;
    }
  } else if (what == "negative-channel-segment") {
    if (!plan->pipeline->channels.empty()) {
      plan->pipeline->channels.front()->from_segment = static_cast<Segment>(-1);
      done = true;
    }
  } else if (what == "negative-tensor-kind") {
    if (!plan->tensors.empty()) {
      plan->tensors.front()->kind = static_cast<TensorKind>(-1);
      done = true;
    }
  } else if (what == "copy-of-state") {
    int32_t state = -1;
    for (size_t i = 0; i < plan->tensors.size(); ++i)
      if (state < 0 && plan->tensors[i]->kind == TensorKind::OptimizerState)
        state = static_cast<int32_t>(i);
    for (auto &t : plan->tensors)
      if (!done && t->kind == TensorKind::WorkingCopy && state >= 0) {
        t->copy_of = state;
        done = true;
      }
  } else if (what == "second-copy") {
    int32_t first = -1;
    for (auto &t : plan->tensors)
      if (!done && t->kind == TensorKind::WorkingCopy) {
        if (first < 0) {
          first = t->copy_of;
        } else {
          t->copy_of = first;
          done = true;
        }
      }
  } else if (what == "swap-copies") {
    InstructionT *first = nullptr;
    for (auto &inst : plan->instructions)
      if (!done && inst->op == OpCode::AdamWUpdate && inst->outputs.size() == 4) {
        if (!first) {
          first = inst.get();
        } else {
          std::swap(first->outputs[3], inst->outputs[3]);
          done = true;
        }
      }
  } else if (what == "unknown-init") {
    for (auto &t : plan->tensors)
      if (!done && t->kind == TensorKind::Parameter) {
        t->init = static_cast<InitKind>(9);
        done = true;
      }
  } else if (what == "drop-inputs") {
    for (auto &inst : plan->instructions)
      if (!done && !inst->inputs.empty()) {
        inst->inputs.clear(); // Pack writes no list at all for an empty vector
        done = true;
      }
  } else if (what == "move-to-chunk-0") {
    for (auto &inst : plan->instructions) {
      if (done || inst->chunk != 1 || inst->op == OpCode::Recv)
        continue;
      for (int32_t id : inst->inputs)
        if (!done && plan->tensors[static_cast<size_t>(id)]->kind == TensorKind::Temporary) {
          inst->chunk = 0;
          done = true;
        }
    }
  } else if (what == "device-update") {
    for (auto &inst : plan->instructions)
      if (!done && inst->on_host) {
        inst->on_host = false;
        done = true;
      }
  } else if (what == "host-all-reduce") {
    for (auto &inst : plan->instructions)
      if (!done && inst->op == OpCode::AllReduce) {
        inst->on_host = true;
        done = true;
      }
  } else if (what == "nul-name") {
    if (!plan->tensors.empty()) {
      plan->tensors.front()->name = std::string("bad\0name\x1b[31m", 13);
      done = true;
    }
  } else if (what == "non-utf8-name") {
    if (!plan->tensors.empty()) {
      plan->tensors.front()->name = "bad\xff\xfename";
      done = true;
    }
  } else if (what.rfind("mesh:", 0) == 0) {
    plan->mesh.clear();
    std::stringstream axes(what.substr(5));
    std::string axis;
    while (std::getline(axes, axis, ',')) {
      size_t eq = axis.find('=');
      if (eq == std::string::npos) {
        std::cerr << "ptc-plan-mutate: mesh axis '" << axis << "' is not NAME=SIZE\n";
        return 2;
      }
      auto a = std::make_unique<MeshAxisT>();
      a->name = axis.substr(0, eq);
      a->size = std::stoi(axis.substr(eq + 1));
      plan->mesh.push_back(std::move(a));
    }
    done = !plan->mesh.empty();
  } else if (what == "arena-max") {
    plan->arena_bytes = std::numeric_limits<int64_t>::max();
    done = true;
  } else if (what == "arena-offset-overflow") {
    for (auto &t : plan->tensors)
      if (!done && t->kind == TensorKind::Temporary && t->arena_offset >= 0) {
        t->arena_offset = std::numeric_limits<int64_t>::max() - 3;
        done = true;
      }
  } else if (what == "zero-dim") {
    for (auto &t : plan->tensors)
      if (!done && t->kind == TensorKind::Temporary && !t->shape.empty()) {
        t->shape[0] = 0;
        done = true;
      }
  } else if (what == "overlap-live") {
    auto arenaTemporary = [&](int32_t id) -> TensorT * {
      TensorT *t = plan->tensors[static_cast<size_t>(id)].get();
      return t->kind == TensorKind::Temporary && t->arena_offset >= 0 ? t : nullptr;
    };
    for (auto &inst : plan->instructions) {
      if (done || inst->op == OpCode::Reshape || inst->op == OpCode::AllReduce ||
          inst->outputs.empty())
        continue;
      TensorT *out = arenaTemporary(inst->outputs.front());
      for (int32_t id : inst->inputs) {
        TensorT *in = arenaTemporary(id);
        if (!done && out && in && in != out && in->shape == out->shape && in->dtype == out->dtype &&
            in->arena_offset != out->arena_offset) {
          out->arena_offset = in->arena_offset;
          done = true;
        }
      }
    }
  } else if (what == "slice-offset-overflow") {
    for (auto &inst : plan->instructions)
      if (!done && inst->op == OpCode::Slice && !inst->ints.empty()) {
        inst->ints.back() = std::numeric_limits<int64_t>::max() - 7;
        done = true;
      }
  } else if (what == "drop-send") {
    auto &list = plan->pipeline->actions.front()->actions;
    for (auto it = list.begin(); it != list.end() && !done; ++it)
      if (it->kind() == ActionKind::Send && it->mb() >= 0) {
        list.erase(it);
        done = true;
      }
  } else if (what == "swap-recvs") {
    auto &list = plan->pipeline->actions.back()->actions;
    int first = -1;
    for (size_t i = 0; i < list.size() && !done; ++i)
      if (list[i].kind() == ActionKind::Recv && list[i].mb() >= 0) {
        if (first < 0) {
          first = static_cast<int>(i);
        } else {
          std::swap(list[static_cast<size_t>(first)], list[i]);
          done = true;
        }
      }
  } else if (what == "drop-send-instruction") {
    auto &insts = plan->instructions;
    for (auto it = insts.begin(); it != insts.end() && !done; ++it)
      if ((*it)->op == OpCode::Send) {
        insts.erase(it);
        done = true;
      }
  } else {
    std::cerr << "ptc-plan-mutate: unknown mutation '" << what << "'\n";
    return 2;
  }
  if (!done) {
    std::cerr << "ptc-plan-mutate: nothing to mutate for '" << what << "'\n";
    return 1;
  }
  flatbuffers::FlatBufferBuilder fbb;
  FinishPlanBuffer(fbb, Plan::Pack(fbb, plan.get()));
  std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(fbb.GetBufferPointer()), static_cast<std::streamsize>(fbb.GetSize()));
  return out ? 0 : 1;
}
