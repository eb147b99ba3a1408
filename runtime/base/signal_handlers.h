// Installing one handler for several signals (system calls restarted, no
// signal masked while it runs): the launchers' handlers that pass a stop
// request on to the process they wait for; and unblocking signals blocked
// before main (ptc-run's start-up block of its stop signals).
#ifndef PTC_RUNTIME_BASE_SIGNAL_HANDLERS_H
#define PTC_RUNTIME_BASE_SIGNAL_HANDLERS_H

#include <pthread.h>

#include <csignal>
#include <initializer_list>

namespace ptc {

inline void handleSignals(std::initializer_list<int> signals, void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : signals)
    sigaction(sig, &action, nullptr);
}

/// Unblocks `signals` in the calling thread (a pending one is delivered now).
inline void unblockSignals(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : signals)
    sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

} // namespace ptc

#endif // PTC_RUNTIME_BASE_SIGNAL_HANDLERS_H
