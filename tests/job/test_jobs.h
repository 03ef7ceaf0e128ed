// Small job files for the tests of job/, checkpoint/ and the daemons.
#ifndef CONVEYOR_TESTS_JOB_TEST_JOBS_H_
#define CONVEYOR_TESTS_JOB_TEST_JOBS_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace conveyor::job::testing {

// An MLP job with `stages` stages (a boundary between dense layers).
inline std::string JobYaml(int stages, const std::string& name = "mlp",
                           int steps = 3) {
  std::string layers;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += "    - dense: {features: 4}\n";
  }
  return absl::StrCat("name: ", name,
                      "\nmodel:\n  input_shape: [4]\n  init: {seed: 1}\n"
                      "  layers:\n",
                      layers,
                      "  loss: mse\ndata: {source: synthetic-regression}\n"
                      "training: {steps: ",
                      steps,
                      ", batch_size: 8, microbatches: 4}\n"
                      "optimizer: {kind: sgd, lr: 0.1}\n"
                      "pipeline: {schedule: 1f1b}\n");
}

}  // namespace conveyor::job::testing

#endif  // CONVEYOR_TESTS_JOB_TEST_JOBS_H_
