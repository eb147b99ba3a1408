// Installing one handler for several signals (system calls restarted, no
// signal masked while it runs): the launchers' handlers that pass a stop
// request on to the process they wait for.
#ifndef PTC_RUNTIME_BASE_SIGNAL_HANDLERS_H
#define PTC_RUNTIME_BASE_SIGNAL_HANDLERS_H

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

} // namespace ptc

#endif // PTC_RUNTIME_BASE_SIGNAL_HANDLERS_H
