// FleetSummary: one line on what a coordinator holds ("3 workers (2 idle,
// 1 busy); 1 job running, 2 queued"), the body of its /readyz. Pure.
#ifndef CONVEYOR_COORDINATOR_FLEET_SUMMARY_H_
#define CONVEYOR_COORDINATOR_FLEET_SUMMARY_H_

#include <string>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"

namespace conveyor::coordinator {

std::string FleetSummary(const std::vector<v1::Worker>& workers,
                         const std::vector<v1::Job>& jobs);

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_FLEET_SUMMARY_H_
