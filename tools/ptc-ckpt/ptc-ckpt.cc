// ptc-ckpt: looks into and converts ptc's distributed checkpoints.
//
//   ptc-ckpt info CKPT [--verify|--no-verify]  what is inside (step, tensors, files, sizes, layout);
//                                       then every shard read and its digest checked
//   ptc-ckpt export CKPT --to hf-dir/   parameters in Hugging Face's form (index + shards)
//   ptc-ckpt export CKPT --to w.safetensors
//
// CKPT is a checkpoint directory (step-NNNNNNNN) or the --checkpoint-dir that
// holds them (its newest complete checkpoint).

#include "runtime/base/parse_number.h"
#include "runtime/io/dist_checkpoint.h"
#include "runtime/io/durable_file.h"
#include "runtime/io/hf_checkpoint.h"
#include "runtime/io/model_info.h"
#include "runtime/io/safetensors.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

using namespace ptc;

namespace {
const char *kUsage = R"(usage: ptc-ckpt info CKPT [--verify | --no-verify]
       ptc-ckpt export CKPT --to OUT [--max-shard-mb N]
  CKPT  a checkpoint directory (step-NNNNNNNN) or a --checkpoint-dir (its newest complete one)
  info  prints what is inside, then reads every shard, checks its digest and assembles every
        tensor (exit status 1 when one is missing, truncated or altered); --no-verify: the
        metadata only
  OUT   a directory (ending in '/' or existing): Hugging Face's sharded form; else one
        safetensors file. Only parameters are exported (optimizer state stays behind).
)";

int usage(const std::string &message) {
  std::cerr << "ptc-ckpt: error: " << message << " (see ptc-ckpt --help)\n";
  return 2;
}

int fail(const std::string &message) {
  std::cerr << "ptc-ckpt: error: " << message << "\n";
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  if (command != "info" && command != "export")
    return usage("unknown command '" + command + "' (info or export)");
  if (argc < 3)
    return usage(command + " needs a checkpoint");
  std::string ckpt = argv[2], to;
  int64_t maxShardMb = 5000;
  bool verify = true;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--no-verify" || a == "--verify") && command == "info") {
      verify = a == "--verify"; // verifying is the default; --verify says so
    } else if ((a == "--to" || a == "--max-shard-mb") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "--to") {
        to = v;
      } else {
        std::optional<int64_t> mb = parseInteger(v, 1, int64_t{1} << 40);
        if (!mb)
          return usage("--max-shard-mb needs a positive integer, got '" + v + "'");
        maxShardMb = *mb;
      }
    } else {
      return usage("unexpected argument '" + a + "'");
    }
  }
  if (command == "export" && to.empty())
    return usage("export needs --to OUT");
  if (command == "info" && !to.empty())
    return usage("info takes no --to");

  std::vector<std::string> incomplete;
  auto path = findCheckpoint(ckpt, &incomplete);
  if (!path.isOk())
    return fail(path.status().message());
  auto reader = CheckpointReader::open(*path);
  if (!reader.isOk())
    return fail(reader.status().message());
  const CheckpointMetadata &meta = reader->metadata();

  if (command == "info") {
    std::cout << "checkpoint " << *path << "\n  step " << meta.step << " (training continues with step index "
              << meta.step << ")\n";
    for (const auto &[key, value] : meta.info)
      std::cout << "  " << key << ": " << (value.empty() ? "(none)" : value) << "\n";
    int64_t params = 0, states = 0, paramElems = 0, stateElems = 0;
    for (const auto &[name, t] : meta.tensors) {
      bool p = t.kind == "parameter";
      (p ? params : states) += 1;
      (p ? paramElems : stateElems) += elementCount(t.shape);
    }
    std::cout << "  " << params << " parameters (" << paramElems << " values), " << states
              << " optimizer-state tensors (" << stateElems << " values), f32\n";
    std::error_code ec;
    int64_t bytes = 0;
    for (const auto &[file, digest] : meta.files) {
      auto size = std::filesystem::file_size(std::filesystem::path(*path) / file, ec);
      int64_t boxes = 0;
      for (const CheckpointBox &b : meta.boxes)
        boxes += b.file == file;
      std::cout << "  " << file << ": " << (ec ? std::string("MISSING") : std::to_string(size) + " bytes")
                << ", " << boxes << " boxes, digest " << digest << "\n";
      bytes += ec ? 0 : static_cast<int64_t>(size);
    }
    std::cout << "  " << meta.files.size() << " files, " << bytes << " bytes\n";
    for (const auto &[name, t] : meta.tensors) {
      int64_t boxes = 0;
      for (const CheckpointBox &b : meta.boxes)
        boxes += b.tensor == name;
      std::cout << "  " << (t.kind == "parameter" ? "param " : "state ") << name << " "
                << shapeString(t.shape) << " in " << boxes << (boxes == 1 ? " box" : " boxes") << "\n";
    }
    for (const std::string &p : incomplete)
      std::cout << "  (incomplete, ignored: " << p << ")\n";
    if (!verify)
      return 0;
    std::cout << std::flush;
    if (Status s = reader->verify(); !s.isOk())
      return fail("verify: " + s.message());
    std::cout << "  verified: " << meta.files.size() << " files read, digests match, "
              << meta.tensors.size() << " tensors assembled whole\n";
    return 0;
  }

  // export: whole parameters, in their names.
  bool directory = (!to.empty() && to.back() == '/') || std::filesystem::is_directory(to);
  Status ok = directory ? checkOutputDirectory(to, "--to") : checkOutputPath(to, "--to");
  if (!ok.isOk())
    return usage(ok.message());
  std::vector<std::vector<float>> wholes;
  std::vector<std::string> names;
  for (const auto &[name, t] : meta.tensors) {
    if (t.kind != "parameter")
      continue;
    wholes.emplace_back(static_cast<size_t>(elementCount(t.shape)));
    if (Status s = reader->readWhole(name, wholes.back().data()); !s.isOk())
      return fail(s.message());
    names.push_back(name);
  }
  std::vector<NamedTensor> tensors;
  size_t i = 0;
  for (const auto &[name, t] : meta.tensors)
    if (t.kind == "parameter")
      tensors.push_back({name, t.shape, wholes[i++].data()});
  std::map<std::string, std::string> metadata{{"format", "pt"},
                                              {"producer", "ptc-ckpt"},
                                              {"steps", std::to_string(meta.step)}};
  std::string infoText;
  if (auto it = meta.info.find("model_info"); it != meta.info.end())
    infoText = it->second;
  auto info = ModelInfo::parse(infoText, "checkpoint '" + *path + "'");
  if (!info.isOk())
    return fail(info.status().message());
  Status s = writeModelWeights(to, directory, tensors, metadata, maxShardMb * 1000 * 1000, *info);
  if (!s.isOk())
    return fail(s.message());
  std::cout << "ptc-ckpt: exported " << tensors.size() << " parameters of step " << meta.step
            << " to " << to << "\n";
  return 0;
}
