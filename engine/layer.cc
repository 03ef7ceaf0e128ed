#include "engine/layer.h"

namespace conveyor::engine {

size_t Stash::bytes() const {
  size_t total = 0;
  for (const Tensor& t : saved) total += t.defined() ? t.bytes() : 0;
  for (const Tensor& t : output_grads) total += t.defined() ? t.bytes() : 0;
  for (const Stash& child : children) total += child.bytes();
  return total;
}

}  // namespace conveyor::engine
