// Printable: text from outside (a job's name, a message) made safe to print
// to a terminal or a log: every control character (C0 and DEL, ESC among
// them, which would let the text rewrite an operator's screen) becomes a
// \xNN escape; everything else, UTF-8 included, is kept. Pure.
#ifndef CONVEYOR_COMMON_PRINTABLE_H_
#define CONVEYOR_COMMON_PRINTABLE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace conveyor {

// Whether `text` holds a control character (what Printable escapes).
bool HasControlCharacters(absl::string_view text);

std::string Printable(absl::string_view text);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_PRINTABLE_H_
