// The NVML monitor against a scripted stand-in for libnvidia-ml (entry points
// handed in through the symbol lookup). The simulated driver is Python (vramkit.monitor.fake).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "vramkit/monitor/nvml.hpp"

using namespace vramkit;
using namespace vramkit::monitor;

namespace {

// ---- a scripted driver ---------------------------------------------------------
struct stub_driver {
  int inits = 0, shutdowns = 0;
  int init_result = 0;
  bool memory_v2 = true;         // nvmlDeviceGetMemoryInfo_v2 exported
  bool detail_list = true;       // nvmlDeviceGetRunningProcessDetailList exported
  bool processes_v2 = true;      // nvmlDeviceGetComputeRunningProcesses_v2 exported
  bool power_supported = true;
  unsigned procs = 3;            // processes per device
  unsigned spawn_between = 0;    // processes that appear between the sizing call and the fill
  bool v2_shuffled = false;      // _v2 returns a layout-mismatch pattern (pid 0)
  unsigned last_memory_version = 0, last_list_version = 0;
  int list_calls = 0, power_calls = 0;
};
stub_driver g;

using ret = int;
struct dev_st;
dev_st* const k_dev0 = reinterpret_cast<dev_st*>(0x1000);
dev_st* const k_dev1 = reinterpret_cast<dev_st*>(0x2000);
constexpr unsigned long long k_total = 80ull << 30;

unsigned idx(dev_st* d) { return d == k_dev0 ? 0 : 1; }

ret s_init() {
  ++g.inits;
  return g.init_result;
}
ret s_shutdown() {
  ++g.shutdowns;
  return 0;
}
const char* s_error_string(ret r) { return r == 9 ? "Driver Not Loaded" : "stub error"; }
ret s_driver_version(char* buf, unsigned n) {
  std::snprintf(buf, n, "999.1.2");
  return 0;
}
ret s_count(unsigned* n) {
  *n = 2;
  return 0;
}
ret s_handle(unsigned i, dev_st** d) {
  if (i > 1) return 2;
  *d = i == 0 ? k_dev0 : k_dev1;
  return 0;
}
ret s_name(dev_st* d, char* buf, unsigned n) {
  std::snprintf(buf, n, "Stub GPU %u", idx(d));
  return 0;
}
ret s_uuid(dev_st* d, char* buf, unsigned n) {
  std::snprintf(buf, n, "GPU-stub-%u", idx(d));
  return 0;
}
struct pci_t {
  char legacy[16];
  unsigned domain, bus, device, id, sub;
  char bus_id[32];
};
ret s_pci(dev_st* d, pci_t* p) {
  std::snprintf(p->bus_id, sizeof p->bus_id, "00000000:%02X:00.0", 0x19 + idx(d));
  return 0;
}
struct mem1 {
  unsigned long long total, free, used;
};
struct mem2 {
  unsigned version;
  unsigned long long total, reserved, free, used;
};
ret s_mem1(dev_st*, mem1* m) {
  m->total = k_total;
  m->used = (1ull << 30) + (512ull << 20);  // allocated + reserve
  m->free = m->total - m->used;
  return 0;
}
ret s_mem2(dev_st*, mem2* m) {
  g.last_memory_version = m->version;
  if (m->version != 0x02000028) return 25;
  m->total = k_total;
  m->reserved = 512ull << 20;
  m->used = 1ull << 30;
  m->free = m->total - m->used - m->reserved;
  return 0;
}
struct util_t {
  unsigned gpu, memory;
};
ret s_util(dev_st*, util_t* u) {
  u->gpu = 42;
  u->memory = 7;
  return 0;
}
ret s_temp(dev_st*, int sensor, unsigned* t) {
  *t = sensor == 0 ? 55 : 0;
  return 0;
}
ret s_power(dev_st*, unsigned* mw) {
  ++g.power_calls;
  if (!g.power_supported) return 3;
  *mw = 123456;
  return 0;
}
struct pinfo1 {
  unsigned pid;
  unsigned long long used;
};
struct pinfo2 {
  unsigned pid;
  unsigned long long used;
  unsigned gi, ci;
};
struct pdetail {
  unsigned pid;
  unsigned long long used;
  unsigned gi, ci;
  unsigned long long cc;
};
struct plist {
  unsigned version, mode, n;
  pdetail* procs;
};

// Fills like the driver: needs `have`, reports the need with INSUFFICIENT_SIZE.
template <class E>
ret fill(unsigned* n, E* out, unsigned have, bool shuffle = false) {
  ++g.list_calls;
  if (*n < have) {
    *n = have;
    g.procs += g.spawn_between;  // processes start between the sizing call and the next one
    g.spawn_between = 0;
    return 7;
  }
  for (unsigned i = 0; i < have; ++i) {
    out[i] = E{};
    out[i].pid = shuffle ? 0 : 1000 + i;
    out[i].used = (i + 1) * (64ull << 20);
  }
  *n = have;
  return 0;
}
ret s_detail(dev_st*, plist* l) {
  g.last_list_version = l->version;
  if (l->version != 0x01000018 || l->mode != 0) return 25;
  return fill(&l->n, l->procs, g.procs);
}
ret s_procs_v2(dev_st*, unsigned* n, pinfo2* p) { return fill(n, p, g.procs, g.v2_shuffled); }
ret s_procs_v1(dev_st*, unsigned* n, pinfo1* p) { return fill(n, p, g.procs); }

void* lookup(const char* name) {
  std::string n = name;
#define SYM(s, f) \
  if (n == s) return reinterpret_cast<void*>(&f);
  SYM("nvmlInit_v2", s_init)
  SYM("nvmlShutdown", s_shutdown)
  SYM("nvmlErrorString", s_error_string)
  SYM("nvmlSystemGetDriverVersion", s_driver_version)
  SYM("nvmlDeviceGetCount_v2", s_count)
  SYM("nvmlDeviceGetHandleByIndex_v2", s_handle)
  SYM("nvmlDeviceGetName", s_name)
  SYM("nvmlDeviceGetUUID", s_uuid)
  SYM("nvmlDeviceGetPciInfo_v3", s_pci)
  SYM("nvmlDeviceGetMemoryInfo", s_mem1)
  if (g.memory_v2) SYM("nvmlDeviceGetMemoryInfo_v2", s_mem2)
  SYM("nvmlDeviceGetUtilizationRates", s_util)
  SYM("nvmlDeviceGetTemperature", s_temp)
  SYM("nvmlDeviceGetPowerUsage", s_power)
  if (g.detail_list) SYM("nvmlDeviceGetRunningProcessDetailList", s_detail)
  if (g.processes_v2) SYM("nvmlDeviceGetComputeRunningProcesses_v2", s_procs_v2)
  SYM("nvmlDeviceGetComputeRunningProcesses", s_procs_v1)
#undef SYM
  return nullptr;
}

class MonitorNvml : public ::testing::Test {
 protected:
  void SetUp() override { g = stub_driver{}; }
};

}  // namespace

TEST_F(MonitorNvml, DeviceFieldsAndMemoryV2) {
  {
    nvml_monitor m(lookup);
    EXPECT_EQ(g.inits, 1);
    EXPECT_EQ(m.backend_name(), "nvml");
    EXPECT_EQ(m.driver_version(), "999.1.2");
    ASSERT_EQ(m.device_count(), 2u);
    auto d = m.device(1);
    EXPECT_EQ(g.last_memory_version, 0x02000028u);
    EXPECT_EQ(d.index, 1u);
    EXPECT_EQ(d.name, "Stub GPU 1");
    EXPECT_EQ(d.uuid, "GPU-stub-1");
    EXPECT_EQ(d.pci_bus_id, "00000000:1A:00.0");
    EXPECT_EQ(d.total_bytes, k_total);
    EXPECT_EQ(d.used_bytes, 1ull << 30);
    ASSERT_TRUE(d.reserved_bytes);
    EXPECT_EQ(*d.reserved_bytes, 512ull << 20);
    EXPECT_EQ(d.free_bytes + d.used_bytes + *d.reserved_bytes, k_total);
    EXPECT_EQ(d.utilization_gpu.value_or(0), 42u);
    EXPECT_EQ(d.utilization_memory.value_or(0), 7u);
    EXPECT_EQ(d.temperature_c.value_or(0), 55u);
    ASSERT_TRUE(d.power_w);
    EXPECT_DOUBLE_EQ(*d.power_w, 123.456);
    EXPECT_TRUE(m.has_memory_v2(1));
    EXPECT_THROW(m.device(2), invalid_argument);
    EXPECT_EQ(m.devices().size(), 2u);
  }
  EXPECT_EQ(g.shutdowns, 1);  // init and shutdown pair up
}

TEST_F(MonitorNvml, FallsBackToMemoryV1WithoutReservedSplit) {
  g.memory_v2 = false;
  nvml_monitor m(lookup);
  auto d = m.device(0);
  EXPECT_FALSE(d.reserved_bytes);
  EXPECT_EQ(d.used_bytes, (1ull << 30) + (512ull << 20));
  EXPECT_FALSE(m.has_memory_v2(0));
}

TEST_F(MonitorNvml, UnsupportedPowerIsAskedOnce) {
  g.power_supported = false;
  nvml_monitor m(lookup);
  EXPECT_FALSE(m.device(0).power_w);
  EXPECT_FALSE(m.device(0).power_w);
  EXPECT_EQ(g.power_calls, 1);
}

TEST_F(MonitorNvml, ProcessesThroughDetailListLargestFirst) {
  nvml_monitor m(lookup);
  auto ps = m.processes(0);
  EXPECT_EQ(g.last_list_version, 0x01000018u);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].pid, 1002u);
  EXPECT_EQ(ps[0].used_bytes.value_or(0), 3 * (64ull << 20));
  EXPECT_EQ(ps[2].pid, 1000u);
  EXPECT_EQ(m.process_api(0), "detail_list");
}

TEST_F(MonitorNvml, InsufficientSizeLoopHandlesProcessesStartingInBetween) {
  g.procs = 2;
  g.spawn_between = 40;  // more than the headroom of the second call
  nvml_monitor m(lookup);
  auto ps = m.processes(0);
  EXPECT_EQ(ps.size(), 42u);
  EXPECT_GE(g.list_calls, 3);
}

TEST_F(MonitorNvml, NoProcessesIsAnEmptyList) {
  g.procs = 0;
  nvml_monitor m(lookup);
  EXPECT_TRUE(m.processes(1).empty());
}

TEST_F(MonitorNvml, FallsBackToV2ThenV1) {
  g.detail_list = false;
  {
    nvml_monitor m(lookup);
    EXPECT_EQ(m.processes(0).size(), 3u);
    EXPECT_EQ(m.process_api(0), "v2");
  }
  g.processes_v2 = false;
  {
    nvml_monitor m(lookup);
    EXPECT_EQ(m.processes(0).size(), 3u);
    EXPECT_EQ(m.process_api(0), "v1");
  }
}

TEST_F(MonitorNvml, ImplausibleListDropsTheMethod) {
  g.detail_list = false;
  g.v2_shuffled = true;
  nvml_monitor m(lookup);
  auto ps = m.processes(0);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_NE(ps[0].pid, 0u);
  EXPECT_EQ(m.process_api(0), "v1");
}

TEST_F(MonitorNvml, InitFailureIsNvmlUnavailable) {
  g.init_result = 9;
  try {
    nvml_monitor m(lookup);
    FAIL() << "expected nvml_unavailable";
  } catch (const nvml_unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("Driver Not Loaded"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.shutdowns, 0);
}

TEST_F(MonitorNvml, MissingEntryPointIsNvmlUnavailable) {
  try {
    nvml_monitor m([](const char*) -> void* { return nullptr; });
    FAIL() << "expected nvml_unavailable";
  } catch (const nvml_unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("nvmlInit_v2"), std::string::npos) << e.what();
  }
}

TEST(MonitorNvmlReal, ConstructsOrSaysWhyNot) {
  try {
    nvml_monitor m;
    nvml_monitor second;  // shares the loaded library and its init
    ASSERT_EQ(m.device_count(), second.device_count());
    for (unsigned i = 0; i < m.device_count(); ++i) {
      auto d = m.device(i);
      EXPECT_GT(d.total_bytes, 0u);
      EXPECT_LE(d.used_bytes, d.total_bytes);
      m.processes(i);
    }
  } catch (const nvml_unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("NVML is not available"), std::string::npos);
    GTEST_SKIP() << e.what();
  }
}
