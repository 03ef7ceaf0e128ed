// A measured step's timeline as the schedule's boxes, and the schedule
// bubble it shows: one definition for the trace SVG's title
// (cli/trace_render.h) and the bubble the coordinator reports for every
// step (conveyor_job_bubble_ratio, `watch`, metrics.jsonl), so the two
// never disagree (docs/metrics.md).
//
// Header-only: the coordinator and the CLI each link the protocol already.
#ifndef CONVEYOR_TELEMETRY_STEP_TIMELINE_H_
#define CONVEYOR_TELEMETRY_STEP_TIMELINE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "conveyor/v1/conveyor.pb.h"
#include "scheduler/action.h"

namespace conveyor::telemetry {

// The schedule op a span kind is, if it is one of a schedule's actions.
inline std::optional<scheduler::Op> SpanOp(int kind) {
  switch (kind) {
    case v1::Span::FORWARD:
      return scheduler::Op::kForward;
    case v1::Span::BACKWARD:
      return scheduler::Op::kBackward;
    case v1::Span::BACKWARD_INPUT:
      return scheduler::Op::kBackwardInput;
    case v1::Span::BACKWARD_WEIGHT:
      return scheduler::Op::kBackwardWeight;
    default:
      return std::nullopt;
  }
}

// One action of a rank as drawn: a forward's box takes in its data reads
// before it and its loss after it (same stage and microbatch).
struct ActionBox {
  scheduler::Op op;
  int stage = 0;
  int microbatch = 0;
  double start_ms = 0;  // From the timeline's origin.
  double end_ms = 0;
};

// A rank's spans as reported: microseconds from its step's start, which is
// start_unix_us on its own wall clock.
struct RankSpans {
  int64_t start_unix_us = 0;
  const google::protobuf::RepeatedPtrField<v1::Span>* spans = nullptr;
};

// The ranks' boxes in time order, in milliseconds from the step's first
// action anywhere. Not from the earliest rank's start: a rank that finished
// its previous step early (1F1B's last rank) starts its next one waiting for
// input that is not yet coming, and that overlap of two steps is no bubble
// of either; the simulator likewise starts the clock at the first forward.
// `origin_us` is any common reference (the earliest start avoids large
// magnitudes). Spans must not be negative (the trace renderer refuses those
// first); spans that are not actions are left out.
inline std::vector<std::vector<ActionBox>> ActionBoxes(
    const std::vector<RankSpans>& ranks, int64_t origin_us) {
  std::vector<std::vector<ActionBox>> boxes(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<const v1::Span*> spans;
    spans.reserve(ranks[r].spans->size());
    for (const v1::Span& span : *ranks[r].spans) spans.push_back(&span);
    // Time order; ties (zero-length spans) keep the recorded order.
    std::stable_sort(spans.begin(), spans.end(),
                     [](const v1::Span* a, const v1::Span* b) {
                       return a->start_us() < b->start_us();
                     });
    // Doubles: an int64 sum of garbage wall-clock values could overflow,
    // and the result is in (fractional) milliseconds anyway.
    const double offset_us = static_cast<double>(ranks[r].start_unix_us) -
                             static_cast<double>(origin_us);
    auto ms = [offset_us](int64_t us) {
      return (offset_us + static_cast<double>(us)) / 1000.0;
    };
    auto same_cell = [](const v1::Span* a, const v1::Span* b) {
      return a->stage() == b->stage() && a->microbatch() == b->microbatch();
    };
    for (size_t i = 0; i < spans.size(); ++i) {
      const std::optional<scheduler::Op> op = SpanOp(spans[i]->kind());
      if (!op) continue;
      size_t first = i, last = i;
      if (*op == scheduler::Op::kForward) {
        while (first > 0 && spans[first - 1]->kind() == v1::Span::DATA &&
               same_cell(spans[first - 1], spans[i])) {
          --first;
        }
        while (last + 1 < spans.size() &&
               (spans[last + 1]->kind() == v1::Span::LOSS ||
                spans[last + 1]->kind() == v1::Span::DATA) &&
               same_cell(spans[last + 1], spans[i])) {
          ++last;
        }
      }
      // Spans on a rank do not overlap, so the last one ends the box.
      boxes[r].push_back(
          {*op, spans[i]->stage(), spans[i]->microbatch(),
           ms(spans[first]->start_us()),
           ms(spans[last]->start_us() + spans[last]->duration_us())});
      i = last;
    }
  }
  double first = 0;
  bool any = false;
  for (const std::vector<ActionBox>& rank : boxes) {
    for (const ActionBox& box : rank) {
      first = any ? std::min(first, box.start_ms) : box.start_ms;
      any = true;
    }
  }
  for (std::vector<ActionBox>& rank : boxes) {
    for (ActionBox& box : rank) {
      box.start_ms -= first;
      box.end_ms -= first;
    }
  }
  return boxes;
}

// The schedule bubble of the boxes: the idle area over ranks x makespan,
// the makespan running from the first action anywhere to the last (the
// optimizer after it is no schedule's business). 0 without actions.
inline double ScheduleBubble(const std::vector<std::vector<ActionBox>>& boxes) {
  double makespan = 0, busy = 0;
  for (const std::vector<ActionBox>& rank : boxes) {
    for (const ActionBox& box : rank) {
      busy += box.end_ms - box.start_ms;
      makespan = std::max(makespan, box.end_ms);
    }
  }
  if (boxes.empty() || !(makespan > 0)) return 0;
  return std::clamp(1.0 - busy / (static_cast<double>(boxes.size()) * makespan),
                    0.0, 1.0);
}

}  // namespace conveyor::telemetry

#endif  // CONVEYOR_TELEMETRY_STEP_TIMELINE_H_
