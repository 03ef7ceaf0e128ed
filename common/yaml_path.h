// YamlScalarAt: the scalar a path of map keys leads to in a YAML tree
// ("optimizer", "schedule", "kind"), for code that reads a value or two of
// a document without parsing all of it (resume's allowed changes of
// training.steps, conveyorctl's --steps). Keys are matched as written;
// nothing is inserted into the tree.
//
// Thread-compatible (yaml-cpp nodes share their tree).
#ifndef CONVEYOR_COMMON_YAML_PATH_H_
#define CONVEYOR_COMMON_YAML_PATH_H_

#include <initializer_list>
#include <optional>
#include <string>

#include "yaml-cpp/yaml.h"

namespace conveyor {

// The scalar at `keys` under `doc`'s maps; nullopt when a key is missing,
// a step is not a map, or the value is not a scalar.
inline std::optional<std::string> YamlScalarAt(
    const YAML::Node& doc, std::initializer_list<const char*> keys) {
  YAML::Node node = doc;
  for (const char* key : keys) {
    if (!node.IsMap()) return std::nullopt;
    YAML::Node next;
    bool found = false;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key) {
        next = it->second;
        found = true;
        break;
      }
    }
    if (!found) return std::nullopt;
    node.reset(next);  // Rebinds `node`; `=` would assign into the tree.
  }
  if (!node.IsScalar()) return std::nullopt;
  return node.Scalar();
}

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_YAML_PATH_H_
