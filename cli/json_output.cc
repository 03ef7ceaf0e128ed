#include "cli/json_output.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace conveyor::cli {

absl::Status WriteProtoJson(const google::protobuf::Message& message,
                            std::ostream& out) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.always_print_enums_as_ints = false;
  std::string json;
  if (const auto status =
          google::protobuf::util::MessageToJsonString(message, &json, options);
      !status.ok()) {
    return absl::InternalError(
        absl::StrCat("writing JSON: ", status.ToString()));
  }
  out << json << "\n";
  return absl::OkStatus();
}

}  // namespace conveyor::cli
