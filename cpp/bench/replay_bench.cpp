// Replays .ops traces (int64 triples op,id,size; op 0 = alloc, 1 = free: the
// anchors' harness format) through vramkit allocators, cold then warm, and
// prints one JSON line per (trace, allocator), as the harness does.
//
//   vramkit_replay_bench [--passes N] [--allocator SPEC]... FILE.ops...
// SPEC as in `vramkit replay --allocator`: vramkit (pool over the default
// page device), pool:upstream=cuda, host, vmm, cuda, cuda_async.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "vramkit/runtime.hpp"
#include "vramkit/trace/replay.hpp"

using namespace vramkit;

static std::vector<trace_op> load_ops(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw invalid_argument("cannot open " + path);
  std::vector<trace_op> ops;
  std::int64_t t[3];
  while (f.read(reinterpret_cast<char*>(t), sizeof t)) {
    if (t[0] != 0 && t[0] != 1) throw invalid_argument(path + ": bad op " + std::to_string(t[0]));
    trace_op o;
    o.action = static_cast<std::uint8_t>(t[0]);
    o.id = static_cast<std::uint64_t>(t[1]);
    o.size = t[0] == 0 ? static_cast<std::uint64_t>(t[2] ? t[2] : 1) : 0;
    ops.push_back(o);
  }
  return ops;
}

int main(int argc, char** argv) {
  int passes = 4;
  std::vector<std::string> allocs, files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--passes") && i + 1 < argc) passes = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--allocator") && i + 1 < argc) allocs.push_back(argv[++i]);
    else files.push_back(argv[i]);
  }
  if (allocs.empty()) allocs.push_back("vramkit");
  if (files.empty()) {
    std::fprintf(stderr, "usage: vramkit_replay_bench [--passes N] [--allocator SPEC]... FILE.ops...\n");
    return 2;
  }
  try {
    for (auto& file : files) {
      auto ops = load_ops(file);
      validate_trace(ops);
      std::string name = file.substr(file.find_last_of('/') + 1);
      if (name.size() > 4 && name.substr(name.size() - 4) == ".ops") name.resize(name.size() - 4);
      for (auto& spec : allocs) {
        auto r = make_resource(spec, 0);
        replay_options o;
        o.passes = passes;
        auto res = replay(ops, *r, o);
        std::printf(
            "{\"trace\":\"%s\",\"allocator\":\"%s\",\"ops\":%zu,\"peak_live_requested\":%zu,"
            "\"peak_reserved\":%zu,\"fragmentation\":%.4f,\"fragmentation_all_passes\":%.4f,"
            "\"ns_per_op\":%.1f,\"warm_ns_per_op\":%.1f,\"ooms\":%zu,\"upstream_allocs\":%zu}\n",
            name.c_str(), spec.c_str(), res.ops, res.peak_live_bytes, res.peak_reserved_bytes, res.fragmentation,
            res.fragmentation_all_passes, res.cold_ns_per_op, res.warm_ns_per_op, res.ooms, res.upstream_allocs);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vramkit_replay_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
