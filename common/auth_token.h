// The cluster's shared secret: read from --auth-token-file by every daemon and
// by conveyorctl, presented on every gRPC call as "authorization: Bearer
// <token>", and compared in constant time. The data plane's handshake
// (transport/tcp/frame.h) is keyed with it too, without carrying it: the
// plaintext handshake presents DataPlaneSecret, an HMAC of the job's secret
// under the token, so a process without the token cannot join a job's data
// plane even if it learns the job's secret, and the token cannot be read off
// the wire.
//
// A token is secret: errors name the file, never its content, and nothing
// here logs. Thread-safe (pure functions).
#ifndef CONVEYOR_COMMON_AUTH_TOKEN_H_
#define CONVEYOR_COMMON_AUTH_TOKEN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor {

// The gRPC metadata key the token travels under (lower case, as gRPC wants).
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr absl::string_view kBearerPrefix = "Bearer ";

// Longest token accepted; a longer file is more likely the wrong file.
inline constexpr size_t kMaxAuthTokenBytes = 4096;
// Shortest token accepted: a few characters can be guessed call by call.
inline constexpr size_t kMinAuthTokenBytes = 16;

// The token in `path`: the file's content without surrounding whitespace
// (so `echo secret > file` works). InvalidArgument naming the path when the
// token is empty, holds characters other than printable ASCII (gRPC
// metadata values must be), or is shorter than kMinAuthTokenBytes or longer
// than kMaxAuthTokenBytes; the errno-derived code when the file cannot be
// read.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// A warning, as ssh gives for a private key, when the token file can be
// read by other users (group or others have any permission bit); empty
// otherwise, or when the file cannot be examined (reading it reports that).
// Callers print it: a shared token is a credential.
std::string AuthTokenFileWarning(const std::string& path);

// The metadata value a client sends: "Bearer <token>".
std::string AuthMetadataValue(absl::string_view token);

// Whether a presented metadata value carries `token`, compared in time
// independent of where they differ.
bool AuthMetadataMatches(absl::string_view presented, absl::string_view token);

// The handshake secret of job `job_number` whose per-job secret (from the
// coordinator's JobProgram) is `job_secret`: with a token, the hex
// HMAC-SHA256 (common/hmac.h) under `token` of a label, the job number and
// the job secret (64 hex digits, within frame.h's kMaxSecretBytes); without
// one (empty `token`: a cluster without --auth-token-file), `job_secret`
// itself, so clusters without auth need nothing new. Ranks agree exactly
// when their tokens do, so a worker with another token (or none) fails the
// handshake.
// InvalidArgument for an empty `job_secret`; Internal when libcrypto fails.
absl::StatusOr<std::string> DataPlaneSecret(absl::string_view token,
                                            absl::string_view job_secret,
                                            uint64_t job_number);

// Equal length and bytes, in time independent of where they differ (so a
// secret cannot be guessed byte by byte from response times).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_AUTH_TOKEN_H_
