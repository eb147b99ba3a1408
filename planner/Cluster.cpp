//===- Cluster.cpp - cluster presets and their JSON form -------------------===//

#include "planner/Cluster.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <tuple>

namespace ptc::planner {

double Cluster::peak(const std::string &dtype) const {
  for (const auto &[type, flops] : peakFlops)
    if (type == dtype)
      return flops;
  return peakFlops.empty() ? 0 : peakFlops.front().second;
}

std::pair<const ComputeProfile *, double> Cluster::profileFor(int64_t ranksPerNode) const {
  if (profiles.empty())
    return {nullptr, 1.0};
  // ptc-run gives each rank cores / ranks threads (at least one).
  int64_t threads = cores > 0 ? std::max<int64_t>(1, cores / std::max<int64_t>(1, ranksPerNode)) : 0;
  const ComputeProfile *best = &profiles.front();
  for (const ComputeProfile &p : profiles)
    if (std::abs(p.threads - threads) < std::abs(best->threads - threads))
      best = &p;
  double slowdown = oversubscribed(ranksPerNode) ? static_cast<double>(ranksPerNode) / cores : 1.0;
  return {best, slowdown};
}

double interpolate(const std::vector<Point> &points, double size) {
  if (points.empty())
    return 0;
  if (size <= points.front().size)
    return points.front().throughput;
  if (size >= points.back().size)
    return points.back().throughput;
  for (size_t i = 1; i < points.size(); ++i)
    if (size <= points[i].size) {
      const Point &a = points[i - 1], &b = points[i];
      double t = (std::log(size) - std::log(a.size)) / (std::log(b.size) - std::log(a.size));
      return a.throughput + t * (b.throughput - a.throughput);
    }
  return points.back().throughput;
}

const std::vector<std::string> &clusterPresetNames() {
  static const std::vector<std::string> names = {"dgx-a100-ib", "h100-ib", "h200-ib"};
  return names;
}

llvm::Expected<Cluster> clusterPreset(const std::string &name) {
  Cluster c;
  c.name = name;
  c.devicesPerNode = 8;
  c.kernelOverhead = 4e-6;
  if (name == "dgx-a100-ib") {
    // DGX A100 80GB: NVSwitch (NVLink 3, 300 GB/s per direction; nccl-tests
    // all-reduce bus bandwidth about 230 GB/s), 8 HDR InfiniBand NICs
    // (200 Gb/s = 25 GB/s per GPU), as in Narayanan et al. 2021.
    c.source = "NVIDIA A100 datasheet (312 TFLOP/s bf16, 19.5 fp32, 2039 GB/s HBM); DGX A100 "
               "NVSwitch and 8x HDR 200 Gb/s InfiniBand";
    c.memoryBytes = 80e9;
    c.peakFlops = {{"bf16", 312e12}, {"f16", 312e12}, {"f32", 19.5e12}};
    c.memoryBandwidth = 2039e9;
    c.intraNode = {230e9, 5e-6};
    c.interNode = {23e9, 10e-6};
    c.matmulHalfFlops = 2e9; // about 8 us of fixed cost per GEMM
  } else if (name == "h100-ib" || name == "h200-ib") {
    // DGX H100 / H200: NVLink 4 (450 GB/s per direction; bus bandwidth about
    // 360 GB/s), 8 NDR InfiniBand NICs (400 Gb/s = 50 GB/s per GPU).
    bool h200 = name == "h200-ib";
    c.source = h200 ? "NVIDIA H200 SXM datasheet (989 TFLOP/s dense bf16, 67 fp32, 4.8 TB/s HBM3e, "
                      "141 GB); NVLink 4 and 8x NDR 400 Gb/s InfiniBand"
                    : "NVIDIA H100 SXM datasheet (989 TFLOP/s dense bf16, 67 fp32, 3.35 TB/s HBM3); "
                      "NVLink 4 and 8x NDR 400 Gb/s InfiniBand";
    c.memoryBytes = h200 ? 141e9 : 80e9;
    c.peakFlops = {{"bf16", 989e12}, {"f16", 989e12}, {"f32", 67e12}};
    c.memoryBandwidth = h200 ? 4800e9 : 3350e9;
    c.intraNode = {360e9, 5e-6};
    c.interNode = {45e9, 10e-6};
    // Hopper needs larger GEMMs to fill its tensor cores (about 8 us fixed per GEMM).
    c.matmulHalfFlops = 6e9;
  } else {
    std::string known;
    for (const std::string &n : clusterPresetNames())
      known += (known.empty() ? "" : ", ") + n;
    return llvm::createStringError("unknown cluster preset '" + name + "' (expected one of: " + known +
                                   ", or a JSON file)");
  }
  return c;
}

namespace {
using nlohmann::json;

json points(const std::vector<Point> &ps) {
  json a = json::array();
  for (const Point &p : ps)
    a.push_back({p.size, p.throughput});
  return a;
}

llvm::Expected<std::vector<Point>> readPoints(const json &j, const std::string &what) {
  std::vector<Point> out;
  if (!j.is_array())
    return llvm::createStringError(what + " must be an array of [size, throughput] pairs");
  for (const json &p : j) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number() ||
        p[0].get<double>() <= 0 || p[1].get<double>() <= 0)
      return llvm::createStringError(what + ": each point must be [size > 0, throughput > 0]");
    out.push_back({p[0].get<double>(), p[1].get<double>()});
  }
  std::sort(out.begin(), out.end(), [](const Point &a, const Point &b) { return a.size < b.size; });
  return out;
}

/// `key` of `j` as a number (`fallback` when absent): positive, or with
/// `positive` false at least zero; `integer`: a whole number up to 1e9.
llvm::Expected<double> number(const json &j, const char *key, double fallback, bool positive = true,
                              bool integer = false) {
  if (!j.contains(key))
    return fallback;
  const json &v = j.at(key);
  bool ok = v.is_number() && (positive ? v.get<double>() > 0 : v.get<double>() >= 0) &&
            (!integer || (v.is_number_integer() && v.get<double>() <= 1e9));
  if (!ok)
    return llvm::createStringError(std::string("'") + key + "' must be a " + (positive ? "positive " : "non-negative ") +
                                   (integer ? "integer" : "number"));
  return v.get<double>();
}

llvm::Expected<Link> readLink(const json &j, const char *key) {
  if (!j.contains(key) || !j.at(key).is_object())
    return llvm::createStringError(std::string("'") + key +
                                   "' must be an object {\"bus_bandwidth\": B/s, \"latency\": s}");
  const json &l = j.at(key);
  auto bw = number(l, "bus_bandwidth", 0);
  if (!bw)
    return bw.takeError();
  auto lat = number(l, "latency", 0, /*positive=*/false);
  if (!lat)
    return lat.takeError();
  if (*bw <= 0)
    return llvm::createStringError(std::string(key) + ".bus_bandwidth is missing");
  auto pbw = number(l, "p2p_bandwidth", 0, /*positive=*/false);
  if (!pbw)
    return pbw.takeError();
  auto plat = number(l, "p2p_latency", 0, /*positive=*/false);
  if (!plat)
    return plat.takeError();
  return Link{*bw, *lat, *pbw, *plat};
}
} // namespace

llvm::Expected<Cluster> loadCluster(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    return llvm::createStringError("cannot read cluster description '" + path + "'");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return llvm::createStringError("cluster description '" + path + "' is not a JSON object");
  auto fail = [&](llvm::Error e) {
    return llvm::createStringError("cluster description '" + path + "': " + llvm::toString(std::move(e)));
  };
  Cluster c;
  for (auto [key, field, fallback] : {std::tuple{"name", &c.name, path}, std::tuple{"source", &c.source, std::string()}}) {
    if (j.contains(key) && !j[key].is_string())
      return fail(llvm::createStringError(std::string("'") + key + "' must be a string"));
    *field = j.contains(key) ? j[key].get<std::string>() : fallback;
  }
  auto perNode = number(j, "devices_per_node", 0, /*positive=*/false, /*integer=*/true);
  if (!perNode)
    return fail(perNode.takeError());
  c.devicesPerNode = static_cast<int64_t>(*perNode);
  auto mem = number(j, "memory_bytes", 0, false);
  if (!mem)
    return fail(mem.takeError());
  c.memoryBytes = *mem;
  if (j.contains("peak_flops")) {
    if (!j["peak_flops"].is_object())
      return fail(llvm::createStringError("'peak_flops' must map element types to FLOP/s"));
    for (auto &[type, v] : j["peak_flops"].items()) {
      if (!v.is_number() || v.get<double>() <= 0)
        return fail(llvm::createStringError("peak_flops." + type + " must be a positive number"));
      c.peakFlops.push_back({type, v.get<double>()});
    }
  }
  for (auto [key, field] : {std::pair{"matmul_efficiency", &c.matmulEfficiency},
                            std::pair{"matmul_half_flops", &c.matmulHalfFlops},
                            std::pair{"attention_efficiency", &c.attentionEfficiency},
                            std::pair{"memory_bandwidth", &c.memoryBandwidth},
                            std::pair{"memory_efficiency", &c.memoryEfficiency},
                            std::pair{"kernel_overhead", &c.kernelOverhead}}) {
    auto v = number(j, key, *field, false);
    if (!v)
      return fail(v.takeError());
    *field = *v;
  }
  auto cores = number(j, "cores", 0, /*positive=*/false, /*integer=*/true);
  if (!cores)
    return fail(cores.takeError());
  c.cores = static_cast<int64_t>(*cores);
  if (j.contains("profiles")) {
    if (!j["profiles"].is_array())
      return fail(llvm::createStringError("'profiles' must be an array"));
    for (const json &p : j["profiles"]) {
      ComputeProfile prof;
      if (!p.is_object() || !p.contains("threads") || !p["threads"].is_number_integer() ||
          p["threads"].get<int64_t>() < 1 || p["threads"].get<int64_t>() > 4096)
        return fail(llvm::createStringError("each profile needs an integer 'threads' in [1, 4096]"));
      prof.threads = p["threads"].get<int>();
      for (auto [key, field] : {std::pair{"matmul", &prof.matmul}, std::pair{"attention", &prof.attention},
                                std::pair{"memory", &prof.memory}}) {
        if (!p.contains(key))
          return fail(llvm::createStringError(std::string("profile is missing '") + key + "'"));
        auto pts = readPoints(p[key], key);
        if (!pts)
          return fail(pts.takeError());
        *field = std::move(*pts);
      }
      for (auto [key, field] : {std::pair{"matmul_scale", &prof.matmulScale},
                                std::pair{"attention_scale", &prof.attentionScale},
                                std::pair{"other_scale", &prof.otherScale}}) {
        auto v = number(p, key, 1.0);
        if (!v)
          return fail(v.takeError());
        *field = *v;
      }
      c.profiles.push_back(std::move(prof));
    }
  }
  if (c.peakFlops.empty() && c.profiles.empty())
    return fail(llvm::createStringError("needs 'peak_flops' or calibrated 'profiles'"));
  if (c.profiles.empty() && c.devicesPerNode <= 0)
    return fail(llvm::createStringError("needs 'devices_per_node' (GPUs per node)"));
  if (!c.profiles.empty() && c.cores <= 0)
    return fail(llvm::createStringError("calibrated 'profiles' need the node's 'cores'"));
  if (c.profiles.empty() && c.memoryBandwidth <= 0)
    return fail(llvm::createStringError("needs 'memory_bandwidth' (bytes/s) without calibrated profiles"));
  auto intra = readLink(j, "intra_node");
  if (!intra)
    return fail(intra.takeError());
  c.intraNode = *intra;
  if (j.contains("inter_node")) {
    auto inter = readLink(j, "inter_node");
    if (!inter)
      return fail(inter.takeError());
    c.interNode = *inter;
  } else {
    c.interNode = c.intraNode;
  }
  if (j.contains("overlap") && !j["overlap"].is_boolean())
    return fail(llvm::createStringError("'overlap' must be true or false"));
  c.overlap = j.contains("overlap") ? j["overlap"].get<bool>() : c.profiles.empty();
  return c;
}

llvm::Error saveCluster(const Cluster &c, const std::string &path) {
  json j;
  j["name"] = c.name;
  j["source"] = c.source;
  j["devices_per_node"] = c.devicesPerNode;
  j["memory_bytes"] = c.memoryBytes;
  j["cores"] = c.cores;
  json peak = json::object();
  for (const auto &[type, flops] : c.peakFlops)
    peak[type] = flops;
  j["peak_flops"] = peak;
  j["memory_bandwidth"] = c.memoryBandwidth;
  j["kernel_overhead"] = c.kernelOverhead;
  json profs = json::array();
  for (const ComputeProfile &p : c.profiles)
    profs.push_back({{"threads", p.threads},
                     {"matmul", points(p.matmul)},
                     {"attention", points(p.attention)},
                     {"memory", points(p.memory)},
                     {"matmul_scale", p.matmulScale},
                     {"attention_scale", p.attentionScale},
                     {"other_scale", p.otherScale}});
  j["profiles"] = profs;
  for (auto [key, link] : {std::pair{"intra_node", &c.intraNode}, std::pair{"inter_node", &c.interNode}}) {
    j[key] = {{"bus_bandwidth", link->busBandwidth}, {"latency", link->latency}};
    if (link->p2pBandwidth > 0) {
      j[key]["p2p_bandwidth"] = link->p2pBandwidth;
      j[key]["p2p_latency"] = link->p2pLatency;
    }
  }
  j["overlap"] = c.overlap;
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out)
    return llvm::createStringError("cannot write '" + path + "'");
  return llvm::Error::success();
}

} // namespace ptc::planner
