#include "common/auth_token.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/hmac.h"
#include "common/status_macros.h"

namespace conveyor {

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  // Room for the token and some whitespace around it.
  ASSIGN_OR_RETURN(const std::string content,
                   ReadFile(path, 2 * kMaxAuthTokenBytes));
  const absl::string_view token = absl::StripAsciiWhitespace(content);
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth token file ", path, " is empty"));
  }
  if (token.size() > kMaxAuthTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth token file ", path, ": the token is longer than ",
                     kMaxAuthTokenBytes, " bytes"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth token file ", path,
          ": the token may only hold printable ASCII without spaces"));
    }
  }
  if (token.size() < kMinAuthTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "auth token file ", path, ": the token has ", token.size(),
        " characters; use at least ", kMinAuthTokenBytes,
        " (for example: head -c 32 /dev/urandom | base64 > FILE)"));
  }
  return std::string(token);
}

std::string AuthTokenFileWarning(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 0077) == 0) return "";
  return absl::StrFormat(
      "auth token file %s can be read by other users (mode %04o); "
      "chmod 600 it",
      path, st.st_mode & 07777);
}

std::string AuthMetadataValue(absl::string_view token) {
  return absl::StrCat(kBearerPrefix, token);
}

bool AuthMetadataMatches(absl::string_view presented, absl::string_view token) {
  // The whole value is compared, prefix included, so a value without the
  // prefix fails in the same time as a wrong token.
  return ConstantTimeEquals(presented, AuthMetadataValue(token));
}

absl::StatusOr<std::string> DataPlaneSecret(absl::string_view token,
                                            absl::string_view job_secret,
                                            uint64_t job_number) {
  if (job_secret.empty()) {
    return absl::InvalidArgumentError("the job's data-plane secret is empty");
  }
  if (token.empty()) return std::string(job_secret);
  // The label keeps this MAC apart from any other the token may key one
  // day; the job number ends at the first ':' after it (digits only),
  // so no two (number, secret) pairs give the same message. Binding the
  // number as well as the secret means a handshake seen on the wire is no
  // use for any other job.
  return HmacSha256Hex(
      token,
      absl::StrCat("conveyor-data-plane-v1:", job_number, ":", job_secret));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walks the longer string in full; the result is accumulated, never
  // returned early.
  const size_t n = std::max(a.size(), b.size());
  uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
    const uint8_t y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace conveyor
