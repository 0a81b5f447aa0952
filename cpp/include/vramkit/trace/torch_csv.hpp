// A fast reader of PyTorch allocator trace CSVs (t_us,action,addr,size,stream,
// plain or gzip) into columns, for traces of millions of events. It handles
// the plain form PyTorch's exporters write; for anything else (quotes, hex,
// malformed rows) it declines and the caller uses the exact Python reader,
// which also words the errors.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vramkit {

struct torch_csv_columns {
  // alloc (0) and free_requested (1) rows only, in file order
  std::vector<std::uint8_t> action;
  std::vector<std::uint64_t> addr;
  std::vector<std::int64_t> size;
  std::vector<std::uint64_t> stream;
  std::vector<std::int64_t> t_us;
  bool has_time = false;
  bool has_stream = false;
  std::map<std::string, std::uint64_t> events;  // every action seen, with its count
};

// Returns false (out untouched but for partial columns) when the file is not in
// the plain form this reader accepts; `why` then says what it met. Bounded:
// past max_bytes decompressed bytes `why` is "bytes bound", past max_rows
// alloc/free rows "rows bound" (a hostile file cannot take the machine's
// memory), and a line longer than 64 KiB is not plain.
bool read_torch_csv_fast(const std::string& path, torch_csv_columns& out, std::string& why,
                         std::uint64_t max_bytes = ~std::uint64_t{0}, std::uint64_t max_rows = ~std::uint64_t{0});

}  // namespace vramkit
