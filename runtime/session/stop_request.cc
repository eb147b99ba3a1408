#include "runtime/session/stop_request.h"

#include "runtime/comm/communicator.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <pthread.h>
#include <thread>
#include <string>

namespace ptc {
namespace {
std::atomic<int> gStopSignal{0};
} // namespace

void installStopSignals(const std::vector<int> &signals) {
  // No handler interrupts the compute threads (a signal frame pushed onto a
  // JIT kernel's stack corrupted the heap here): the signals are blocked in
  // this thread, and so in every thread it creates from now on, and one
  // thread waits for them.
  sigset_t set;
  sigemptyset(&set);
  for (int sig : signals)
    sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0)
        continue;
      int expected = 0;
      if (gStopSignal.compare_exchange_strong(expected, sig))
        continue;
      // Asked twice: end now, as the signal's default action would.
      std::signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      std::raise(sig);
    }
  }).detach();
}

int stopSignal() { return gStopSignal.load(); }

std::string signalName(int signal) {
  switch (signal) {
  case SIGUSR1: return "USR1";
  case SIGUSR2: return "USR2";
  case SIGTERM: return "TERM";
  case SIGINT: return "INT";
  case SIGHUP: return "HUP";
  default: return std::to_string(signal);
  }
}

Status StopHook::afterStep(TrainingSession &session, const StepResult &r) {
  bool stop = stopSignal() != 0;
  if (Communicator *comm = session.communicator(); comm && comm->worldSize() > 1) {
    auto any = comm->anyRank(stop);
    if (!any.isOk())
      return any.status();
    stop = *any;
  }
  if (stop)
    stoppedAfter_ = r.step + 1;
  return Status::ok();
}

} // namespace ptc
