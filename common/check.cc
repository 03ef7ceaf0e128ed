#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace conveyor::check_internal {

void CheckFailed(const char* file, int line, const char* expression,
                 absl::string_view message) {
  std::fprintf(stderr, "%s:%d: check failed: %s: %.*s\n", file, line,
               expression, static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace conveyor::check_internal
