// Starting a helper thread of vramkit's (map_ahead's page maker, async_map's
// worker).
#pragma once
#include <pthread.h>

#include <csignal>
#include <thread>
#include <utility>

namespace vramkit::detail {

// Starts the helper with every asynchronous signal blocked in it (a thread
// inherits its creator's mask, so the caller's is blocked around the start and
// restored): a process-directed SIGTERM or SIGINT then goes to a thread that
// handles it. Python runs its handlers only in the main thread, and one that
// the kernel hands to a helper never wakes a main thread blocked in a wait.
// Faults stay deliverable. The thread is named for debuggers and /proc.
template <class F>
std::thread start_helper(const char* name, F&& body) {
  sigset_t quiet, old;
  sigfillset(&quiet);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&quiet, s);
  pthread_sigmask(SIG_BLOCK, &quiet, &old);
  std::thread t;
  try {
    t = std::thread(std::forward<F>(body));
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_setname_np(t.native_handle(), name);
  return t;
}

}  // namespace vramkit::detail
