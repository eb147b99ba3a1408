// Test utility: writes a copy of a plan with one deliberate defect in its
// pipeline schedule, to check that ptc-run rejects it at load.
//   ptc-plan-mutate IN OUT drop-send    remove rank 0's first per-micro-batch SEND
//   ptc-plan-mutate IN OUT swap-recvs   swap the first two per-micro-batch RECVs of
//                                       the last pipeline rank
//   ptc-plan-mutate IN OUT drop-send-instruction   remove the first Send instruction

#include "runtime/plan/plan_generated.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <utility>

using namespace ptc::plan;

int main(int argc, char **argv) {
  if (argc != 4) {
    std::cerr << "usage: ptc-plan-mutate IN OUT drop-send|swap-recvs|drop-send-instruction\n";
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
  if (!plan->pipeline || plan->pipeline->actions.empty()) {
    std::cerr << "ptc-plan-mutate: the plan has no pipeline schedule\n";
    return 1;
  }
  std::string what = argv[3];
  bool done = false;
  if (what == "drop-send") {
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
