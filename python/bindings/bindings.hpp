// Shared helpers of the binding files.
#pragma once
#include <nanobind/nanobind.h>

#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/resource.hpp"

namespace vramkit::py {
namespace nb = nanobind;
// A non-negative Python int (or __index__) as uint64; ValueError naming `what` otherwise.
std::uint64_t to_u64(nb::handle h, const char* what);
stream_t to_stream(nb::handle h);
int to_device(nb::handle h);
nb::dict state_dict(const memory_state& s);
nb::dict stats_dict(const statistics& s);
}  // namespace vramkit::py

void bind_buffer(nanobind::module_& m);
void bind_monitor(nanobind::module_& m);
void bind_leaks(nanobind::module_& m);
