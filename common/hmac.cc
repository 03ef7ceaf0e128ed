#include "common/hmac.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <climits>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "common/status_macros.h"

namespace conveyor {

absl::StatusOr<std::string> HmacSha256(absl::string_view key,
                                       absl::string_view message) {
  // HMAC() takes the key length as an int; tokens are far shorter
  // (kMaxAuthTokenBytes), so this only guards against misuse.
  if (key.size() > INT_MAX) {
    return absl::InvalidArgumentError("HMAC key longer than INT_MAX bytes");
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_bytes = 0;
  // The one-shot HMAC() (not deprecated in OpenSSL 3) holds no state
  // between calls, so concurrent callers need no lock.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), mac, &mac_bytes) == nullptr ||
      mac_bytes != kHmacSha256Bytes) {
    return absl::InternalError("libcrypto could not compute HMAC-SHA256");
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_bytes);
}

absl::StatusOr<std::string> HmacSha256Hex(absl::string_view key,
                                          absl::string_view message) {
  ASSIGN_OR_RETURN(const std::string mac, HmacSha256(key, message));
  return absl::BytesToHexString(mac);
}

}  // namespace conveyor
