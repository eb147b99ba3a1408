//===- ptc-plan.cpp - the layout planner ----------------------------------===//
//
//   ptc-plan --preset llama3-70b --seq 8192 --global-batch 1024 --gpus 512 --cluster h100-ib
//   ptc-plan gpt.mlir --gpus 2 --calibrated calib.json
//   ptc-plan --calibrate -o calib.json
//
// Prints the ranked layouts (predicted step time, tokens/s, TFLOP/s per
// device, MFU, memory, bubble, exposed communication by axis, what limits
// it) and the best one as ptc-compile options; --explain says why each
// runner-up loses. See docs/planner.md.
//
//===----------------------------------------------------------------------===//

#include <thread>
#include "planner/Calibrate.h"
#include "planner/Planner.h"

#include "models/ModelFlags.h"
#include "models/Models.h"

#include "dialects/ptc/PtcOps.h"
#include "passes/Passes.h"
#include "passes/memory/Passes.h"
#include "runtime/schedule/schedule.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

using namespace llvm;
using namespace ptc::planner;
using ptc::CpAttention;
using ptc::optionChoices;
using ptc::optionName;
using ptc::parseOption;
using ptc::Precision;
using ptc::Recompute;

namespace {
cl::OptionCategory category("ptc-plan options");
cl::opt<std::string> input(cl::Positional, cl::desc("[model.mlir]"), cl::init(""), cl::cat(category));
cl::opt<std::string> modelKind("model", cl::desc("gpt or llama (default: the preset's, else gpt); its shapes are the "
                                                 "model flags (ptc-model's)"),
                               cl::cat(category));
cl::opt<int64_t> globalBatch("global-batch", cl::desc("Sequences per step (builder models)"), cl::init(0),
                             cl::cat(category));
cl::opt<int64_t> gpus("gpus", cl::desc("Devices (GPUs, or CPU ranks)"), cl::init(0), cl::cat(category));
cl::opt<int64_t> gpusPerNode("gpus-per-node", cl::desc("Devices per node (default: the cluster's)"), cl::init(0),
                             cl::cat(category));
cl::opt<std::string> clusterName("cluster", cl::desc("A preset (dgx-a100-ib, h100-ib, h200-ib) or a JSON file"),
                                 cl::cat(category));
cl::opt<std::string> calibrated("calibrated", cl::desc("A JSON file written by --calibrate (same as --cluster FILE)"),
                                cl::cat(category));
cl::opt<bool> doCalibrate("calibrate", cl::desc("Measure this machine's kernels and MPI links; write -o FILE"),
                          cl::cat(category));
cl::opt<std::string> output("o", cl::desc("Output of --calibrate"), cl::init(""), cl::cat(category));
cl::opt<std::string> measureLinksTo("measure-links", cl::desc("(internal, under mpirun) time the MPI links"),
                                    cl::Hidden, cl::cat(category));
cl::opt<std::string> deviceMemory("device-memory", cl::desc("Device memory, e.g. 80GB (default: the cluster's)"),
                                  cl::cat(category));
cl::opt<std::string> compileOptions(
    "compile-options",
    cl::desc("The job's other ptc-compile options, e.g. \"optimizer=adamw max-grad-norm=1.0\": every probe "
             "and plan is compiled with them (what they add, such as gradient clipping, is priced)"),
    cl::cat(category));
cl::opt<std::string> precision("precision", cl::desc("fp32, bf16 or f16 (default: bf16 on GPUs, fp32 on CPUs)"),
                               cl::cat(category));
cl::list<int64_t> tpList("tp", cl::desc("Allowed tp sizes (default: all)"), cl::CommaSeparated, cl::cat(category));
cl::list<int64_t> ppList("pp", cl::desc("Allowed pp sizes"), cl::CommaSeparated, cl::cat(category));
cl::list<int64_t> dpList("dp", cl::desc("Allowed dp sizes"), cl::CommaSeparated, cl::cat(category));
cl::list<int64_t> epList("ep", cl::desc("Allowed ep sizes (MoE models; default: every divisor of the experts)"),
                         cl::CommaSeparated, cl::cat(category));
cl::list<int64_t> cpList("cp", cl::desc("Allowed cp sizes (context parallelism; default: 1 and every divisor "
                                         "leaving each rank 4096 tokens or more)"),
                         cl::CommaSeparated, cl::cat(category));
cl::list<std::string> cpAttentionList("cp-attention", cl::desc("ring, ulysses (default both)"), cl::CommaSeparated,
                                      cl::cat(category));
cl::list<int64_t> mbsList("micro-batch-sizes", cl::desc("Micro-batch sizes (default 1,2,4)"), cl::CommaSeparated,
                          cl::cat(category));
cl::list<int64_t> vList("virtual-stages", cl::desc("Virtual stages (default 1,2)"), cl::CommaSeparated,
                        cl::cat(category));
cl::list<int> zeroList("zero", cl::desc("ZeRO stages (default 0,1,2,3)"), cl::CommaSeparated, cl::cat(category));
cl::list<std::string> recomputeList("recompute", cl::desc("none, selective, full (default: all)"),
                                    cl::CommaSeparated, cl::cat(category));
cl::list<std::string> scheduleList("schedules", cl::desc("1f1b, interleaved-1f1b, zb-h1 (default: all)"),
                                   cl::CommaSeparated, cl::cat(category));
cl::opt<std::string> spChoice("sp", cl::desc("Sequence parallelism: on (true), off (false) or both (default both)"),
                              cl::init("both"), cl::cat(category));
cl::opt<bool> tpAcrossNodes("tp-across-nodes", cl::desc("Allow tp groups that span nodes"), cl::cat(category));
cl::opt<std::string> layoutText("layout",
                                cl::desc("Evaluate one layout: dp=,ep=,cp=,tp=,pp=,v=,mbs=,m=,sp=,zero=,recompute=,"
                                         "schedule=,cp-attention="),
                                cl::cat(category));
cl::opt<unsigned> top("top", cl::desc("Rows of the table (default 10)"), cl::init(10), cl::cat(category));
cl::opt<bool> explain("explain", cl::desc("Say why each runner-up loses to the best"), cl::cat(category));
cl::opt<std::string> jsonOut("json", cl::desc("Also write the rows as JSON to FILE"), cl::cat(category));

int fail(const Twine &message) {
  errs() << "ptc-plan: error: " << message << "\n";
  return 1;
}


std::string seconds(double s) {
  std::string out;
  raw_string_ostream os(out);
  if (s >= 1)
    os << format("%.2f s", s);
  else if (s >= 1e-3)
    os << format("%.1f ms", s * 1e3);
  else
    os << format("%.0f us", s * 1e6);
  return out;
}

/// Each of `texts` as an enum value, into `out`; false (with the message
/// naming the flag, the value and the choices) at the first that is none of them.
template <typename E>
bool parseList(const cl::list<std::string> &texts, const char *flag, std::vector<E> &out) {
  out.clear();
  for (const std::string &text : texts) {
    std::optional<E> value = parseOption<E>(text);
    if (!value) {
      fail(std::string(flag) + " '" + text + "' is not " + optionChoices<E>());
      return false;
    }
    out.push_back(*value);
  }
  return true;
}

Expected<Layout> parseLayout(StringRef text) {
  Layout l;
  const std::pair<const char *, int64_t *> counts[] = {{"dp", &l.dp},         {"tp", &l.tp},
                                                       {"pp", &l.pp},         {"ep", &l.ep},
                                                       {"cp", &l.cp},
                                                       {"v", &l.virtualStages}, {"mbs", &l.microBatch},
                                                       {"m", &l.microbatches}};
  SmallVector<StringRef> parts;
  text.split(parts, ',', -1, false);
  for (StringRef part : parts) {
    auto [key, value] = part.trim().split('=');
    int64_t n = 0;
    bool isInt = !value.getAsInteger(10, n);
    StringRef name = key;
    auto count = llvm::find_if(counts, [&](const auto &c) { return name == c.first; });
    if (count != std::end(counts) && isInt && n >= 1)
      *count->second = n;
    else if (key == "zero" && isInt && n >= 0 && n <= 3)
      l.zero = static_cast<int>(n);
    else if (key == "sp" && (value == "true" || value == "false" || value == "on" || value == "off"))
      l.sequenceParallel = value == "true" || value == "on"; // --sp's words too
    else if (auto rc = parseOption<Recompute>(value); key == "recompute" && rc)
      l.recompute = *rc;
    else if (auto s = parseOption<ptc::schedule::ScheduleKind>(value); key == "schedule" && s)
      l.schedule = *s;
    else if (auto a = parseOption<CpAttention>(value); key == "cp-attention" && a)
      l.cpAttention = *a;
    else
      return createStringError("--layout: cannot read '" + part.str() +
                               "' (expected dp=, ep=, cp=, tp=, pp=, v=, mbs=, m= at least 1, zero=0-3, "
                               "sp=true|false (or on|off), recompute=" +
                               llvm::join(ptc::optionSpellings<Recompute>(), "|") +
                               ", cp-attention=" + llvm::join(ptc::optionSpellings<CpAttention>(), "|") +
                               ", schedule=" + llvm::join(ptc::schedule::scheduleNames(), "|") + ")");
  }
  return l;
}

void printTable(const std::vector<Estimate> &rows, raw_ostream &os) {
  os << format("  %-3s %-38s %10s %11s %8s %6s %10s %7s %9s %9s %9s %9s %9s  %s\n", "#", "layout", "step",
               "tokens/s", "TFLOP/s", "MFU", "memory", "bubble", "tp comm", "dp comm", "pp comm", "ep comm",
               "cp comm", "limit");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Estimate &e = rows[i];
    os << format("  %-3zu %-38s %10s %11.0f %8.2f %5.1f%% %10s %6.1f%% %9s %9s %9s %9s %9s  %s%s\n", i + 1,
                 e.layout.describe().c_str(), seconds(e.step).c_str(), e.tokensPerSecond, e.tflopsPerDevice,
                 100 * e.mfu, mlir::ptc::formatByteSize(e.memory).c_str(), 100 * e.bubble, seconds(e.tpComm).c_str(),
                 seconds(e.dpComm).c_str(), seconds(e.ppComm).c_str(), seconds(e.epComm).c_str(),
                 seconds(e.cpComm).c_str(), e.limit.c_str(), e.fits ? "" : " (does not fit)");
  }
}

/// Why `e` is slower than `best`, biggest difference first.
std::string whyLoses(const Estimate &e, const Estimate &best) {
  std::vector<std::pair<double, std::string>> d = {
      {e.compute - best.compute, "compute"},
      {e.tpComm - best.tpComm, "tp communication"},
      {e.dpComm - best.dpComm, "exposed dp communication"},
      {e.epComm - best.epComm, "ep communication"},
      {e.cpComm - best.cpComm, "cp communication"},
      {e.bubble * (e.step - e.optimizer) - best.bubble * (best.step - best.optimizer), "pipeline bubble"},
      {e.ppComm - best.ppComm, "pipeline transfers"},
      {e.optimizer - best.optimizer, "optimizer step"}};
  std::sort(d.begin(), d.end(), [](auto &a, auto &b) { return std::abs(a.first) > std::abs(b.first); });
  std::string out;
  raw_string_ostream os(out);
  int shown = 0;
  for (auto &[delta, what] : d) {
    if (std::abs(delta) < 0.01 * best.step || shown == 3)
      continue;
    os << (shown++ ? ", " : "") << (delta > 0 ? "+" : "-") << seconds(std::abs(delta)) << " " << what;
  }
  return shown ? out : "differences under 1% each";
}

nlohmann::json toJson(const Estimate &e, Precision precision) {
  const Layout &l = e.layout;
  return {{"layout", l.describe()},
          {"options", l.compileOptions(precision)},
          {"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"ep", l.ep},
          {"cp", l.cp},
          {"cp_attention", optionName(l.cpAttention)},
          {"virtual_stages", l.virtualStages},
          {"micro_batch", l.microBatch},
          {"microbatches", l.microbatches},
          {"sequence_parallel", l.sequenceParallel},
          {"zero", l.zero},
          {"recompute", optionName(l.recompute)},
          {"schedule", optionName(l.schedule)},
          {"step_seconds", e.step},
          {"tokens_per_second", e.tokensPerSecond},
          {"tflops_per_device", e.tflopsPerDevice},
          {"mfu", e.mfu},
          {"memory_bytes", e.memory},
          {"memory_exact", e.memoryExact},
          {"model_state_bytes", e.modelStateMemory},
          {"fits", e.fits},
          {"bubble", e.bubble},
          {"compute_seconds", e.compute},
          {"tp_seconds", e.tpComm},
          {"dp_seconds", e.dpComm},
          {"pp_seconds", e.ppComm},
          {"ep_seconds", e.epComm},
          {"cp_seconds", e.cpComm},
          {"optimizer_seconds", e.optimizer},
          {"limit", e.limit}};
}
} // namespace

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  // The model keys ptc-plan's builder path prices, as ptc-model's flags
  // (models/ModelKeys.h; the batch is --global-batch here).
  ::ptc::models::ModelFlags::Config flagConfig;
  flagConfig.select = [](const ::ptc::models::ModelKey &key) {
    return key.planner == ::ptc::models::PlannerUse::Flag;
  };
  ::ptc::models::ModelFlags modelFlags(category, flagConfig);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(argc, argv,
                              "ptc-plan: ranks parallel layouts (dp, tp, pp, ep, cp, virtual stages, micro-batches, sp, ZeRO, "
                              "recomputation, schedule) by predicted step time\n");
  Expected<::ptc::models::ModelArgs> modelArgs = modelFlags.given();
  if (!modelArgs)
    return fail(toString(modelArgs.takeError()));
  // The other sizes' 0 defaults mean "not given": a given value must be a
  // size.
  for (const cl::opt<int64_t> *option : {&globalBatch, &gpus})
    if (option->getNumOccurrences() && *option < 1)
      return fail("--" + option->ArgStr + " must be at least 1, got " +
                  Twine(static_cast<int64_t>(*option)));
  if (!measureLinksTo.empty())
    return measureLinks(measureLinksTo);
  if (doCalibrate) {
    if (output.empty())
      return fail("--calibrate needs -o FILE");
    std::string self = sys::fs::getMainExecutable(argv[0], reinterpret_cast<void *>(&fail));
    // Other work on the cores makes every measured rate low (and the plans
    // priced with them slow): say so before measuring.
    if (std::ifstream loadavg("/proc/loadavg"); loadavg) {
      double load = 0;
      unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      if (loadavg >> load && load > 0.5 * cores)
        errs() << "ptc-plan: warning: the machine is busy (load average " << format("%.1f", load)
               << " on " << cores << " cores): the calibration's rates will be low; calibrate "
               << "on an idle machine\n";
    }
    auto c = calibrate(self, outs());
    if (!c)
      return fail(toString(c.takeError()));
    if (Error e = saveCluster(*c, output))
      return fail(toString(std::move(e)));
    outs() << "ptc-plan: wrote " << output << "\n";
    return 0;
  }

  // The cluster.
  std::string clusterSpec = !calibrated.empty() ? calibrated.getValue() : clusterName.getValue();
  if (!calibrated.empty() && !clusterName.empty())
    return fail("--cluster and --calibrated both name the cluster; give one");
  if (clusterSpec.empty())
    return fail("no cluster: --cluster dgx-a100-ib|h100-ib|h200-ib|FILE.json, or --calibrated FILE from "
                "ptc-plan --calibrate");
  // --calibrated is always a file; --cluster a file where one exists (or it ends in .json), else a preset.
  bool isFile = !calibrated.empty() || StringRef(clusterSpec).ends_with(".json") || sys::fs::exists(clusterSpec);
  Expected<Cluster> cluster = isFile ? loadCluster(clusterSpec) : clusterPreset(clusterSpec);
  if (!cluster)
    return fail(toString(cluster.takeError()));
  if (gpusPerNode.getNumOccurrences() && (gpusPerNode < 1 || gpusPerNode > 1 << 20))
    return fail("--gpus-per-node " + std::to_string(gpusPerNode) + " must be 1 to 1048576");
  if (gpusPerNode > 0)
    cluster->devicesPerNode = gpusPerNode;
  if (!deviceMemory.empty()) {
    auto bytes = mlir::ptc::parseByteSize(deviceMemory);
    if (failed(bytes))
      return fail("--device-memory '" + deviceMemory + "' is not a size such as 80GB or 512MiB");
    cluster->memoryBytes = *bytes;
  }
  if (gpus <= 0)
    return fail("--gpus N (the devices to plan for) is required");
  if (gpus > 1000000)
    return fail("--gpus " + std::to_string(gpus) + " is more than the planner searches (1000000)");

  // The model.
  ModelSpec model;
  const std::string presetName = modelArgs->stringOr("preset", "");
  if (!input.empty()) {
    if (!modelArgs->all().empty())
      return fail("--" + modelArgs->all().begin()->first +
                  " sets a builder model's shape: give a model file or builder flags, not both");
    model.kind = ModelSource::File;
    model.file = input;
    if (!sys::fs::exists(input))
      return fail("cannot read '" + input + "'");
  } else {
    std::string kind = modelKind.empty() ? "gpt" : modelKind.getValue();
    if (!presetName.empty()) {
      const mlir::ptc::ModelPreset *p = nullptr;
      for (const auto &candidate : mlir::ptc::modelPresets())
        if (presetName == candidate.name && (modelKind.empty() || modelKind == candidate.model))
          p = &candidate;
      if (!p)
        return fail("unknown preset '" + presetName + "'" +
                    (modelKind.empty() ? "" : " for --model " + modelKind));
      kind = p->model;
    }
    const std::optional<ptc::BuilderKind> builder = parseOption<ptc::BuilderKind>(kind);
    if (!builder || !ptc::isLanguageModel(*builder))
      return fail("--model must be gpt or llama, not '" + kind + "'");
    model.kind = *builder == ptc::BuilderKind::Gpt ? ModelSource::Gpt : ModelSource::Llama;
    if (model.kind == ModelSource::Gpt) {
      Expected<mlir::ptc::GptConfig> c = mlir::ptc::gptConfigFrom(*modelArgs);
      if (!c)
        return fail(toString(c.takeError()));
      model.gpt = *c;
    } else {
      Expected<mlir::ptc::LlamaConfig> c = mlir::ptc::llamaConfigFrom(*modelArgs);
      if (!c)
        return fail(toString(c.takeError()));
      model.llama = *c;
    }
    const mlir::ptc::MoeLayersConfig &moe = model.kind == ModelSource::Gpt ? model.gpt.moe : model.llama.moe;
    if (moe.enabled() && moe.every != 1)
      return fail("--moe-every " + std::to_string(moe.every) +
                  ": the planner's per-layer probes need every layer alike (--moe-every 1)");
    if (globalBatch <= 0)
      return fail("--global-batch N (sequences per step) is required with a builder model");
  }

  SearchSpace space;
  space.devices = gpus;
  space.globalBatch = globalBatch;
  space.tp.assign(tpList.begin(), tpList.end());
  space.pp.assign(ppList.begin(), ppList.end());
  space.dp.assign(dpList.begin(), dpList.end());
  space.ep.assign(epList.begin(), epList.end());
  space.cp.assign(cpList.begin(), cpList.end());
  if (!cpAttentionList.empty() && !parseList(cpAttentionList, "--cp-attention", space.cpAttention))
    return 1;
  if (!mbsList.empty())
    space.microBatchSizes.assign(mbsList.begin(), mbsList.end());
  if (!vList.empty())
    space.virtualStages.assign(vList.begin(), vList.end());
  if (!zeroList.empty())
    space.zero.assign(zeroList.begin(), zeroList.end());
  for (const auto &[flag, list] : {std::pair{"--tp", &space.tp}, std::pair{"--pp", &space.pp},
                                   std::pair{"--dp", &space.dp}, std::pair{"--ep", &space.ep},
                                   std::pair{"--cp", &space.cp},
                                   std::pair{"--micro-batch-sizes", &space.microBatchSizes},
                                   std::pair{"--virtual-stages", &space.virtualStages}})
    for (int64_t v : *list)
      if (v < 1)
        return fail(std::string(flag) + " " + std::to_string(v) + " is not a size (at least 1)");
  for (int z : space.zero)
    if (z < 0 || z > 3)
      return fail("--zero " + std::to_string(z) + " is not a ZeRO stage (0-3)");
  if (!recomputeList.empty() && !parseList(recomputeList, "--recompute", space.recompute))
    return 1;
  if (!scheduleList.empty() && !parseList(scheduleList, "--schedules", space.schedules))
    return 1;
  // --layout's true / false read as on / off (ptc-compile's sequence-parallel=true|false).
  if (spChoice == "on" || spChoice == "true")
    space.sequenceParallel = {true};
  else if (spChoice == "off" || spChoice == "false")
    space.sequenceParallel = {false};
  else if (spChoice != "both")
    return fail("--sp must be on (true), off (false) or both");
  space.tpAcrossNodes = tpAcrossNodes;
  if (!compileOptions.empty() && !mlir::ptc::CompilePipelineOptions::createFromString(compileOptions))
    return fail("--compile-options '" + compileOptions + "': not ptc-compile options (see ptc-opt --help)");
  space.compileOptions = compileOptions;
  space.precision = cluster->profiles.empty() ? Precision::Bf16 : Precision::Fp32;
  if (!precision.empty()) {
    std::optional<Precision> p = parseOption<Precision>(precision.getValue());
    if (!p)
      return fail("--precision must be " + optionChoices<Precision>());
    space.precision = *p;
  }

  mlir::DialectRegistry registry;
  registry.insert<mlir::ptc::PtcDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect>();
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  mlir::ptc::registerAllPasses();
  Planner planner(context, model, *cluster, space);

  raw_ostream &os = outs();
  std::string what = model.kind == ModelSource::File ? model.file
                     : presetName.empty()              ? std::string(model.kindName())
                                                       : presetName;
  os << "ptc-plan: " << what;
  if (model.kind != ModelSource::File)
    os << " (" << model.layers() << " layers, hidden " << model.hidden() << ", " << model.heads() << " heads, seq "
       << model.seq() << "), global batch " << globalBatch;
  os << " on " << gpus << " x " << cluster->name << " (" << cluster->ranksPerNode(gpus) << " per node, "
     << mlir::ptc::formatByteSize(cluster->memoryBytes) << " each";
  if (cluster->oversubscribed(cluster->ranksPerNode(gpus)))
    os << "; " << gpus << " ranks on " << cluster->cores << " cores: OVERSUBSCRIBED";
  os << "), " << optionName(space.precision) << "\n";

  std::vector<Estimate> rows;
  if (!layoutText.empty()) {
    auto l = parseLayout(layoutText);
    if (!l)
      return fail(toString(l.takeError()));
    if (l->microbatches == 1 && model.kind != ModelSource::File && globalBatch % (l->dp * l->ep * l->microBatch) == 0)
      l->microbatches = globalBatch / (l->dp * l->ep * l->microBatch);
    std::string why = planner.invalidReason(*l);
    if (!why.empty())
      return fail("layout " + l->describe() + ": " + why);
    auto e = planner.evaluate(*l);
    if (!e)
      return fail("layout " + l->describe() + ": " + toString(e.takeError()));
    rows.push_back(*e);
  } else {
    SearchStats stats;
    auto found = planner.search(std::max(1u, top.getValue()), stats);
    if (!found)
      return fail(toString(found.takeError()));
    rows = std::move(*found);
    os << "searched " << stats.layouts << " layouts (" << stats.invalid << " refused, " << stats.outOfMemory
       << " out of memory among the fastest) with " << stats.probes << " probe compiles in "
       << format("%.2f", stats.seconds) << " s; memory: each row's plan compiled whole ("
       << stats.wholeCompiles << " whole-model " << (stats.wholeCompiles == 1 ? "compile" : "compiles")
       << "), ptc-opt's figures\n";
    if (rows.empty()) {
      for (auto &[reason, count] : stats.invalidReasons)
        errs() << "  " << count << " x " << reason << "\n";
      std::string closest;
      if (stats.smallest)
        closest = " (the smallest, " + stats.smallest->layout.describe() + ", needs " +
                  (stats.smallest->memoryExact ? "" : "at least ") + mlir::ptc::formatByteSize(stats.smallest->memory) + ")";
      return fail("no layout fits: every candidate was refused or needs more than " + mlir::ptc::formatByteSize(cluster->memoryBytes) +
                  " per device" + closest);
    }
  }
  printTable(rows, os);
  os << "best: --ptc-compile=\"" << rows.front().layout.compileOptions(space.precision) << "\"\n";
  {
    // What else the best layout needs: the model's batch and the rank count.
    const Layout &l = rows.front().layout;
    os << "  run it: " << (input.empty() ? "ptc-model ... --batch " + std::to_string(space.globalBatch) + ", then "
                                          : std::string())
       << "ptc-run PLAN --np " << l.devices() << " (or mpirun/srun with that many ranks)\n";
  }
  if (explain)
    for (size_t i = 1; i < rows.size(); ++i)
      os << "  #" << i + 1 << " " << rows[i].layout.describe() << " loses "
         << format("%.1f%%", 100 * (rows[i].step / rows.front().step - 1)) << ": "
         << whyLoses(rows[i], rows.front()) << "\n";
  if (!jsonOut.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Estimate &e : rows)
      j.push_back(toJson(e, space.precision));
    std::ofstream out(jsonOut.getValue());
    out << j.dump(2) << "\n";
    if (!out)
      return fail("cannot write '" + jsonOut + "'");
  }
  return 0;
}
