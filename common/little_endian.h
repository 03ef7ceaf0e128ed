// Little-endian integers in byte buffers: the wire formats (TCP frames, the
// NCCL header link) spell their byte order out, so they read the same on
// any host. Works on any byte pointer (uint8_t or char buffers).
//
// Thread-safe: stateless functions.
#ifndef CONVEYOR_COMMON_LITTLE_ENDIAN_H_
#define CONVEYOR_COMMON_LITTLE_ENDIAN_H_

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace conveyor {

template <std::unsigned_integral T>
void StoreLittleEndian(void* out, T value) {
  auto* p = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < sizeof(T); ++i) {
    p[i] = static_cast<uint8_t>(value >> (8 * i));
  }
}

template <std::unsigned_integral T>
T LoadLittleEndian(const void* in) {
  const auto* p = static_cast<const uint8_t*>(in);
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value = static_cast<T>(value | (static_cast<T>(p[i]) << (8 * i)));
  }
  return value;
}

inline void PutU16(void* out, uint16_t v) { StoreLittleEndian(out, v); }
inline void PutU32(void* out, uint32_t v) { StoreLittleEndian(out, v); }
inline void PutU64(void* out, uint64_t v) { StoreLittleEndian(out, v); }
inline uint16_t GetU16(const void* in) {
  return LoadLittleEndian<uint16_t>(in);
}
inline uint32_t GetU32(const void* in) {
  return LoadLittleEndian<uint32_t>(in);
}
inline uint64_t GetU64(const void* in) {
  return LoadLittleEndian<uint64_t>(in);
}

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_LITTLE_ENDIAN_H_
