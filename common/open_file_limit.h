// RaiseOpenFileLimit: lifts the process's soft limit on open files to its
// hard limit, as daemons that hold many sockets do (Go's runtime does it for
// every program). The soft limit is 1024 in most shells and units; a
// coordinator with a few hundred workers, watchers and scrapers can reach
// it, and then refuses connections. The hard limit is the operator's (or
// systemd's LimitNOFILE) and is left alone. Thread-safe.
#ifndef CONVEYOR_COMMON_OPEN_FILE_LIMIT_H_
#define CONVEYOR_COMMON_OPEN_FILE_LIMIT_H_

#include <cstdint>

namespace conveyor {

// The soft limit after the call (unchanged when it cannot be read or
// raised); -1 for no limit.
int64_t RaiseOpenFileLimit();

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_OPEN_FILE_LIMIT_H_
