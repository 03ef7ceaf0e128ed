// UninitializedVector<T>: a std::vector whose resize leaves new elements of
// a trivial T uninitialised, for buffers that a loop fills at once anyway.
// A plain vector's resize writes zeros to every byte first: for a 4 GB
// buffer that is seconds of work before the fill loop can poll a job's
// cancellation, and every page resident though the fill may stop early.
// Thread-compatible, as std::vector.
#ifndef CONVEYOR_COMMON_UNINITIALIZED_VECTOR_H_
#define CONVEYOR_COMMON_UNINITIALIZED_VECTOR_H_

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace conveyor {

// std::allocator, but value-initialisation (what resize(n) asks for)
// becomes default-initialisation: nothing for trivial types.
template <typename T>
class DefaultInitAllocator : public std::allocator<T> {
 public:
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitializedVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_UNINITIALIZED_VECTOR_H_
