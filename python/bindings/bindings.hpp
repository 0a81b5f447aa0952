// Shared helpers of the binding files.
#pragma once
#include <nanobind/nanobind.h>

#include <vector>

#include "vramkit/mr/pool_resource.hpp"
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
// The pool's segments with their blocks, as Resource.segments() returns them.
nb::list segments_list(const std::vector<segment_info>& segs);
// Copies host bytes to a device address of the current backend (cudaMemcpy, or memcpy on the host).
void copy_host_to_device(void* dst, const void* src, std::size_t bytes);
}  // namespace vramkit::py

void bind_resource(nanobind::module_& m);
void bind_device(nanobind::module_& m);
void bind_trace(nanobind::module_& m);
void bind_buffer(nanobind::module_& m);
void bind_monitor(nanobind::module_& m);
void bind_leaks(nanobind::module_& m);
void bind_emul(nanobind::module_& m);
