// HMAC-SHA256 (RFC 2104 with SHA-256, as in RFC 4231), from OpenSSL's
// libcrypto: a keyed hash that proves knowledge of the key without revealing
// it. Used to derive the data plane's handshake secret from the cluster's
// auth token (common/auth_token.h: DataPlaneSecret), so the token itself
// never travels over the plaintext data plane.
//
// Keys and messages are bytes (any content); nothing here logs.
// Thread-safe (pure functions).
#ifndef CONVEYOR_COMMON_HMAC_H_
#define CONVEYOR_COMMON_HMAC_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor {

inline constexpr size_t kHmacSha256Bytes = 32;

// The 32-byte HMAC-SHA256 of `message` under `key`. Internal when libcrypto
// fails (it has no SHA-256, e.g. a broken FIPS configuration): nothing the
// caller can retry.
absl::StatusOr<std::string> HmacSha256(absl::string_view key,
                                       absl::string_view message);

// HmacSha256 as 64 lowercase hex digits.
absl::StatusOr<std::string> HmacSha256Hex(absl::string_view key,
                                          absl::string_view message);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_HMAC_H_
