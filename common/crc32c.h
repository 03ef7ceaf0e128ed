// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected), the checksum that
// iSCSI, ext4 and leveldb use, here for detecting corrupt checkpoint files
// (checkpoint/manifest.h). It is not a cryptographic hash: it finds
// accidental damage (a flipped bit, a truncated or torn write), not
// tampering.
//
// The result chains, so a large file can be checksummed in chunks:
//
//   uint32_t crc = 0;
//   while (ReadChunk(&chunk)) crc = Crc32c(chunk, crc);
//   // crc == Crc32c(<whole file>)
//
// Thread-safe (a pure function over constant tables).
#ifndef CONVEYOR_COMMON_CRC32C_H_
#define CONVEYOR_COMMON_CRC32C_H_

#include <cstdint>
#include <span>

namespace conveyor {

// The CRC-32C of `data` appended to the bytes whose CRC-32C is `crc` (0 for
// none): Crc32c(b, Crc32c(a)) == Crc32c(a followed by b).
uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc = 0);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_CRC32C_H_
