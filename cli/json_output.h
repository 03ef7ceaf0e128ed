// `-o json` for conveyorctl's listing and inspection commands: the
// coordinator's messages in the proto3 JSON mapping, so a script reads the
// same fields the API has (docs/cli-json.md lists the shapes).
//
//   field names as in conveyor.proto (snake_case), every field present
//   (zeros and empty lists included), enums by name ("RUNNING"), 64-bit
//   integers as strings ("steps_total": "100"), one object per command
//   followed by a newline.
#ifndef CONVEYOR_CLI_JSON_OUTPUT_H_
#define CONVEYOR_CLI_JSON_OUTPUT_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace conveyor::cli {

// The values -o takes, for the flag's check and help.
inline constexpr char kTableFormat[] = "table";
inline constexpr char kJsonFormat[] = "json";

// Writes `message` as one JSON object and a newline. Internal error if
// protobuf cannot (it cannot fail for Conveyor's messages).
absl::Status WriteProtoJson(const google::protobuf::Message& message,
                            std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_JSON_OUTPUT_H_
