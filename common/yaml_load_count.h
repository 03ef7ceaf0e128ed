// Test hooks that count how often LoadYaml (common/yaml_reader.h) loads a
// given text in this process: the check that a job's YAML is loaded once
// per process (job/parsed_job.h), however many hashes, plans, restarts and
// relayouts use it. Off unless a test turns it on, so that a daemon keeps
// no record of the texts it parsed.
//
// Thread-safe.
#ifndef CONVEYOR_COMMON_YAML_LOAD_COUNT_H_
#define CONVEYOR_COMMON_YAML_LOAD_COUNT_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace conveyor {

// Starts counting (from zero) or stops and forgets the counts.
void TEST_CountYamlLoads(bool on);

// How many times LoadYaml has loaded exactly `text` since counting began.
int64_t TEST_YamlLoadsOf(absl::string_view text);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_YAML_LOAD_COUNT_H_
