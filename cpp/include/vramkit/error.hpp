// Exception hierarchy shared by every resource. Deallocation never throws;
// every other entry point reports bad input through these types.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

namespace vramkit {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class invalid_argument : public error {
 public:
  using error::error;
};

class cuda_error : public error {
 public:
  cuda_error(const std::string& what, int code) : error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

class out_of_memory : public error {
 public:
  out_of_memory(const std::string& what, std::size_t requested)
      : error(what), requested_(requested) {}
  std::size_t requested() const noexcept { return requested_; }

 private:
  std::size_t requested_;
};

// "12.5 MiB (13107200 bytes)": the form every message uses for sizes.
std::string format_bytes(std::size_t bytes);
// printf-style fixed-point ("%.*f"): vramkit avoids iostreams, whose locale
// state another library in the process (PyTorch's) can leave unusable.
std::string format_fixed(double v, int precision);

}  // namespace vramkit
