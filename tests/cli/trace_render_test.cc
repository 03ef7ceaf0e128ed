#include "cli/trace_render.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler/generators.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"

namespace conveyor::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr int64_t kRank1Start = 1'700'000'000'000'000;
// Rank 0 started 40 us after rank 1, the earliest rank.
constexpr int64_t kRank0Offset = 40;

void AddSpan(v1::RankTrace* rank, v1::Span::Kind kind, int stage,
             int microbatch, int64_t start_us, int64_t duration_us,
             int peer = -1, uint64_t bytes = 0) {
  v1::Span* span = rank->add_spans();
  span->set_kind(kind);
  span->set_stage(stage);
  span->set_microbatch(microbatch);
  span->set_start_us(start_us);
  span->set_duration_us(duration_us);
  span->set_peer(peer);
  span->set_bytes(bytes);
}

// One 1F1B step of P=2, V=1, M=2 with exact times. Each rank's spans tile its
// step without gaps until the optimizer ends, 5 us before its step time.
v1::Trace OneFOneBTrace() {
  v1::Trace trace;
  trace.set_job_id("job-7");
  trace.set_job_name("mlp");
  trace.set_step(3);
  trace.set_schedule("1f1b");
  trace.set_num_ranks(2);
  trace.set_virtual_stages(1);
  trace.set_microbatches(2);

  v1::RankTrace* r0 = trace.add_ranks();
  r0->set_rank(0);
  r0->set_worker_id("worker-1");
  r0->set_worker_name("alpha");
  r0->add_stages(0);
  r0->set_start_unix_us(kRank1Start + kRank0Offset);
  r0->set_seconds(0.001030);
  AddSpan(r0, v1::Span::DATA, 0, 0, 0, 10);
  AddSpan(r0, v1::Span::FORWARD, 0, 0, 10, 100);
  AddSpan(r0, v1::Span::SEND, 0, 0, 110, 5, 1, 4096);
  AddSpan(r0, v1::Span::DATA, 0, 1, 115, 10);
  AddSpan(r0, v1::Span::FORWARD, 0, 1, 125, 100);
  AddSpan(r0, v1::Span::SEND, 0, 1, 225, 5, 1, 4096);
  AddSpan(r0, v1::Span::RECV_WAIT, 0, 0, 230, 200, 1, 4096);
  AddSpan(r0, v1::Span::BACKWARD, 0, 0, 430, 200);
  AddSpan(r0, v1::Span::RECV_WAIT, 0, 1, 630, 115, 1, 4096);
  AddSpan(r0, v1::Span::BACKWARD, 0, 1, 745, 200);
  AddSpan(r0, v1::Span::ALL_REDUCE, -1, -1, 945, 20);
  AddSpan(r0, v1::Span::OPTIMIZER, -1, -1, 965, 60);

  v1::RankTrace* r1 = trace.add_ranks();
  r1->set_rank(1);
  r1->set_worker_id("worker-2");
  r1->set_worker_name("beta");
  r1->add_stages(1);
  r1->set_start_unix_us(kRank1Start);
  r1->set_seconds(0.001070);
  AddSpan(r1, v1::Span::RECV_WAIT, 1, 0, 0, 155, 0, 4096);
  AddSpan(r1, v1::Span::FORWARD, 1, 0, 155, 100);
  AddSpan(r1, v1::Span::LOSS, 1, 0, 255, 10);
  AddSpan(r1, v1::Span::BACKWARD, 1, 0, 265, 200);
  AddSpan(r1, v1::Span::SEND, 1, 0, 465, 5, 0, 4096);
  AddSpan(r1, v1::Span::DATA, 1, 1, 470, 5);  // Targets, before the forward.
  AddSpan(r1, v1::Span::FORWARD, 1, 1, 475, 95);
  AddSpan(r1, v1::Span::LOSS, 1, 1, 570, 10);
  AddSpan(r1, v1::Span::BACKWARD, 1, 1, 580, 200);
  AddSpan(r1, v1::Span::SEND, 1, 1, 780, 5, 0, 4096);
  AddSpan(r1, v1::Span::ALL_REDUCE, -1, -1, 785, 220);
  AddSpan(r1, v1::Span::OPTIMIZER, -1, -1, 1005, 60);
  return trace;
}

// ---------------------------------------------------------------------------
// Chrome trace JSON.

struct ChromeEvent {
  std::string name;
  std::string cat;
  int64_t ts;
  int64_t dur;
};

// The "X" events by (pid, tid), in output order.
std::map<std::pair<int, int>, std::vector<ChromeEvent>> TrackEvents(
    const nlohmann::json& doc) {
  std::map<std::pair<int, int>, std::vector<ChromeEvent>> tracks;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    tracks[{e.at("pid").get<int>(), e.at("tid").get<int>()}].push_back(
        {e.at("name").get<std::string>(), e.at("cat").get<std::string>(),
         e.at("ts").get<int64_t>(), e.at("dur").get<int64_t>()});
  }
  return tracks;
}

std::vector<std::string> Names(const std::vector<ChromeEvent>& events) {
  std::vector<std::string> names;
  for (const ChromeEvent& e : events) names.push_back(e.name);
  return names;
}

std::vector<int64_t> Starts(const std::vector<ChromeEvent>& events) {
  std::vector<int64_t> starts;
  for (const ChromeEvent& e : events) starts.push_back(e.ts);
  return starts;
}

nlohmann::json ParseChrome(const v1::Trace& trace) {
  const std::string text = RenderChromeTrace(trace);
  nlohmann::json doc = nlohmann::json::parse(text, nullptr,
                                             /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << text;
  return doc;
}

TEST(RenderChromeTraceTest, IsAnObjectWithEventsAndJobMetadata) {
  const nlohmann::json doc = ParseChrome(OneFOneBTrace());
  ASSERT_TRUE(doc.is_object());
  EXPECT_TRUE(doc.at("traceEvents").is_array());
  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  const nlohmann::json& other = doc.at("otherData");
  EXPECT_EQ(other.at("job_id"), "job-7");
  EXPECT_EQ(other.at("job_name"), "mlp");
  EXPECT_EQ(other.at("step"), 3);
  EXPECT_EQ(other.at("schedule"), "1f1b");
}

TEST(RenderChromeTraceTest, NamesOneProcessPerRankAndThreeTracksEach) {
  const nlohmann::json doc = ParseChrome(OneFOneBTrace());
  std::map<int, std::string> process_names;
  std::map<int, int> sort_index;
  std::map<int, std::map<int, std::string>> thread_names;
  int process_name_events = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    const int pid = e.at("pid").get<int>();
    if (e.at("name") == "process_name") {
      ++process_name_events;
      process_names[pid] = e.at("args").at("name").get<std::string>();
    } else if (e.at("name") == "process_sort_index") {
      sort_index[pid] = e.at("args").at("sort_index").get<int>();
    } else if (e.at("name") == "thread_name") {
      const int tid = e.at("tid").get<int>();
      EXPECT_EQ(thread_names[pid].count(tid), 0u) << "pid " << pid;
      thread_names[pid][tid] = e.at("args").at("name").get<std::string>();
    }
  }
  EXPECT_EQ(process_name_events, 2);
  EXPECT_EQ(process_names,
            (std::map<int, std::string>{{1, "rank 0: alpha (worker-1)"},
                                        {2, "rank 1: beta (worker-2)"}}));
  EXPECT_EQ(sort_index, (std::map<int, int>{{1, 0}, {2, 1}}));
  const std::map<int, std::string> tracks = {
      {1, "compute"}, {2, "communication"}, {3, "idle"}};
  ASSERT_EQ(thread_names.size(), 2u);
  EXPECT_EQ(thread_names[1], tracks);
  EXPECT_EQ(thread_names[2], tracks);
}

TEST(RenderChromeTraceTest, EveryCompleteEventStartsAtOrAfterZero) {
  const nlohmann::json doc = ParseChrome(OneFOneBTrace());
  int complete = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++complete;
    EXPECT_GE(e.at("ts").get<int64_t>(), 0) << e.dump();
    EXPECT_GE(e.at("dur").get<int64_t>(), 0) << e.dump();
  }
  EXPECT_EQ(complete, 24);  // Every span, no more.
}

TEST(RenderChromeTraceTest, TracksHoldTheRanksSpansShiftedByTheirStart) {
  const auto tracks = TrackEvents(ParseChrome(OneFOneBTrace()));
  // Rank 0 (pid 1) started 40 us after rank 1, so its spans move by 40.
  const auto& compute0 = tracks.at({1, 1});
  EXPECT_THAT(Names(compute0), ElementsAre("data", "F0.0", "data", "F0.1",
                                           "B0.0", "B0.1", "optimizer"));
  EXPECT_THAT(Starts(compute0), ElementsAre(40, 50, 155, 165, 470, 785, 1005));
  EXPECT_EQ(compute0[1].dur, 100);
  for (const ChromeEvent& e : compute0) EXPECT_EQ(e.cat, "compute");
  const auto& comm0 = tracks.at({1, 2});
  EXPECT_THAT(Names(comm0), ElementsAre("send", "send", "all-reduce"));
  EXPECT_THAT(Starts(comm0), ElementsAre(150, 265, 985));
  for (const ChromeEvent& e : comm0) EXPECT_EQ(e.cat, "communication");
  const auto& idle0 = tracks.at({1, 3});
  EXPECT_THAT(Names(idle0), ElementsAre("recv wait", "recv wait"));
  EXPECT_THAT(Starts(idle0), ElementsAre(270, 670));
  EXPECT_EQ(idle0[0].cat, "idle");
  EXPECT_EQ(idle0[0].dur, 200);

  // Rank 1 (pid 2) is the earliest: its times are unchanged.
  EXPECT_THAT(Names(tracks.at({2, 1})),
              ElementsAre("F1.0", "loss", "B1.0", "data", "F1.1", "loss",
                          "B1.1", "optimizer"));
  EXPECT_THAT(Starts(tracks.at({2, 1})),
              ElementsAre(155, 255, 265, 470, 475, 570, 580, 1005));
  EXPECT_THAT(Starts(tracks.at({2, 2})), ElementsAre(465, 780, 785));
  EXPECT_THAT(Starts(tracks.at({2, 3})), ElementsAre(0));
  EXPECT_EQ(tracks.size(), 6u);
}

TEST(RenderChromeTraceTest, ArgsCarryOnlyTheMeaningfulFields) {
  const nlohmann::json doc = ParseChrome(OneFOneBTrace());
  const nlohmann::json* send = nullptr;
  const nlohmann::json* optimizer = nullptr;
  const nlohmann::json* forward = nullptr;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("pid") != 1) continue;
    if (e.at("name") == "send" && send == nullptr) send = &e;
    if (e.at("name") == "optimizer") optimizer = &e;
    if (e.at("name") == "F0.1") forward = &e;
  }
  ASSERT_NE(send, nullptr);
  ASSERT_NE(optimizer, nullptr);
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(
      send->at("args"),
      nlohmann::json(
          {{"stage", 0}, {"microbatch", 0}, {"peer", 1}, {"bytes", 4096}}));
  EXPECT_EQ(forward->at("args"),
            nlohmann::json({{"stage", 0}, {"microbatch", 1}}));
  EXPECT_TRUE(optimizer->at("args").empty()) << optimizer->dump();
}

TEST(RenderChromeTraceTest, StaysValidJsonForOddInput) {
  v1::Trace trace = OneFOneBTrace();
  trace.mutable_ranks(0)->set_worker_name("bad \xff\xfe name \"quoted\"");
  AddSpan(trace.mutable_ranks(0), v1::Span::FORWARD, -1, -1, 2000, -7);
  AddSpan(trace.mutable_ranks(0), static_cast<v1::Span::Kind>(42), -1, -1, 2000,
          3);
  const nlohmann::json doc = ParseChrome(trace);
  ASSERT_FALSE(doc.is_discarded());
  const auto tracks = TrackEvents(doc);
  const auto& compute0 = tracks.at({1, 1});
  ASSERT_EQ(compute0.size(), 9u);
  // No stage: the op alone rather than "F-1.-1"; a negative duration as 0.
  EXPECT_EQ(compute0[7].name, "F");
  EXPECT_EQ(compute0[7].dur, 0);
  EXPECT_EQ(compute0[8].name, "span 42");
}

TEST(RenderChromeTraceTest, EmptyTraceHasNoEvents) {
  const nlohmann::json doc = ParseChrome(v1::Trace());
  EXPECT_TRUE(doc.at("traceEvents").empty());
}

// ---------------------------------------------------------------------------
// SVG.

// Tags balance and nest, with one root element. Enough to catch a renderer
// that leaves a group or a box open.
bool TagsBalance(const std::string& xml) {
  std::vector<std::string> stack;
  bool had_root = false;
  for (size_t i = xml.find('<'); i != std::string::npos;
       i = xml.find('<', i + 1)) {
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return false;
    const std::string tag = xml.substr(i + 1, end - i - 1);
    if (tag.empty() || tag[0] == '?') continue;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return false;
      stack.pop_back();
    } else if (tag.back() != '/') {
      if (stack.empty() && had_root) return false;
      had_root = true;
      stack.push_back(tag.substr(0, tag.find(' ')));
    }
  }
  return had_root && stack.empty();
}

// The <g id="rank-r"> group of `svg`, or "" when there is none.
std::string RankGroup(const std::string& svg, int r) {
  const size_t begin = svg.find(absl::StrCat("<g id=\"rank-", r, "\">"));
  if (begin == std::string::npos) return "";
  const size_t end = svg.find("</g>", begin);
  return svg.substr(begin, end - begin);
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t i = haystack.find(needle); i != std::string::npos;
       i = haystack.find(needle, i + 1)) {
    ++n;
  }
  return n;
}

TEST(RenderTraceSvgTest, DrawsOneGroupPerRankAndOneBoxPerAction) {
  absl::StatusOr<std::string> svg = RenderTraceSvg(OneFOneBTrace());
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_THAT(*svg, StartsWith("<?xml"));
  EXPECT_TRUE(TagsBalance(*svg));
  EXPECT_EQ(Count(*svg, "<g id=\"rank-"), 2);
  for (int r = 0; r < 2; ++r) {
    const std::string group = RankGroup(*svg, r);
    ASSERT_FALSE(group.empty()) << "rank " << r;
    EXPECT_EQ(Count(group, "<rect"), 4) << group;
  }
  // The boxes are the stage actions in time order; loss, data, sends and
  // the optimizer are not boxes of their own.
  EXPECT_THAT(RankGroup(*svg, 1),
              HasSubstr("<title>B1.0: 0.225 to 0.425</title>"));
  EXPECT_THAT(*svg, Not(HasSubstr("optimizer")));
  EXPECT_THAT(*svg, HasSubstr(">time (ms)</text>"));  // The axis's unit.
}

TEST(RenderTraceSvgTest, ForwardBoxCoversAdjacentDataAndLoss) {
  absl::StatusOr<std::string> svg = RenderTraceSvg(OneFOneBTrace());
  ASSERT_TRUE(svg.ok()) << svg.status();
  const std::string r0 = RankGroup(*svg, 0);
  const std::string r1 = RankGroup(*svg, 1);
  // Rank 0: data then forward, 40 us after the earliest start: the first
  // action, where the axis starts (time before it belongs to the step
  // before, telemetry/step_timeline.h).
  EXPECT_THAT(r0, HasSubstr("<title>F0.0: 0 to 0.11</title>"));
  EXPECT_THAT(r0, HasSubstr("<title>F0.1: 0.115 to 0.225</title>"));
  // Rank 1: forward then loss; data (targets), forward, loss.
  EXPECT_THAT(r1, HasSubstr("<title>F1.0: 0.115 to 0.225</title>"));
  EXPECT_THAT(r1, HasSubstr("<title>F1.1: 0.43 to 0.54</title>"));
  // A backward is never widened.
  EXPECT_THAT(r0, HasSubstr("<title>B0.0: 0.43 to 0.63</title>"));
}

TEST(RenderTraceSvgTest, DataOfAnotherMicrobatchIsNotMerged) {
  v1::Trace trace = OneFOneBTrace();
  // The data span before F0.1 now claims microbatch 0.
  trace.mutable_ranks(0)->mutable_spans(3)->set_microbatch(0);
  absl::StatusOr<std::string> svg = RenderTraceSvg(trace);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_THAT(RankGroup(*svg, 0),
              HasSubstr("<title>F0.1: 0.125 to 0.225</title>"));
}

TEST(RenderTraceSvgTest, SortsSpansByTime) {
  v1::Trace trace = OneFOneBTrace();
  // Recorded out of order: the last backward first.
  v1::RankTrace* r0 = trace.mutable_ranks(0);
  r0->mutable_spans()->SwapElements(0, 9);
  absl::StatusOr<std::string> svg = RenderTraceSvg(trace);
  ASSERT_TRUE(svg.ok()) << svg.status();
  const std::string group = RankGroup(*svg, 0);
  const size_t first = group.find("<title>F0.0");
  const size_t last = group.find("<title>B0.1");
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(last, std::string::npos);
  EXPECT_LT(first, last);
  EXPECT_THAT(group, HasSubstr("<title>F0.0: 0 to 0.11</title>"));
}

TEST(RenderTraceSvgTest, TitleHasMeasuredMakespanAndBubble) {
  absl::StatusOr<std::string> svg = RenderTraceSvg(OneFOneBTrace());
  ASSERT_TRUE(svg.ok()) << svg.status();
  // Makespan: from the first action (40 us after the earliest start) to
  // B0.1's end at 945 + 40 us. Busy: 0.62 ms per rank, so the bubble is
  // 2 * 0.325 / (2 * 0.945): what the coordinator reports for the step.
  EXPECT_THAT(*svg, HasSubstr(">job-7 step 3 (measured): 1f1b, P=2 V=1 M=2, "
                              "makespan 0.945, bubble 34.39%</text>"));
}

TEST(RenderTraceSvgTest, KeepsACallersTitle) {
  scheduler::SvgOptions options;
  options.title = "before & after";
  absl::StatusOr<std::string> svg = RenderTraceSvg(OneFOneBTrace(), options);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_THAT(*svg, HasSubstr(">before &amp; after: 1f1b, P=2"));
  EXPECT_THAT(*svg, Not(HasSubstr("(measured)")));
}

TEST(RenderTraceSvgTest, DrawsInterleavedChunksOnTheirRanks) {
  // P=2, V=2: rank 0 holds stages 0 and 2.
  v1::Trace trace;
  trace.set_job_id("j");
  trace.set_schedule("interleaved-1f1b");
  trace.set_num_ranks(2);
  trace.set_virtual_stages(2);
  trace.set_microbatches(1);
  v1::RankTrace* r0 = trace.add_ranks();
  r0->set_rank(0);
  AddSpan(r0, v1::Span::FORWARD, 0, 0, 0, 10);
  AddSpan(r0, v1::Span::FORWARD, 2, 0, 20, 10);
  AddSpan(r0, v1::Span::BACKWARD_INPUT, 2, 0, 40, 10);
  AddSpan(r0, v1::Span::BACKWARD_WEIGHT, 2, 0, 60, 10);
  v1::RankTrace* r1 = trace.add_ranks();
  r1->set_rank(1);
  AddSpan(r1, v1::Span::FORWARD, 1, 0, 10, 10);
  absl::StatusOr<std::string> svg = RenderTraceSvg(trace);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_EQ(Count(RankGroup(*svg, 0), "<rect"), 4);
  EXPECT_EQ(Count(RankGroup(*svg, 1), "<rect"), 1);
  EXPECT_THAT(RankGroup(*svg, 0), HasSubstr("<title>BW2.0: 0.06 to 0.07"));
}

void ExpectInvalid(const v1::Trace& trace, const std::string& why) {
  absl::StatusOr<std::string> svg = RenderTraceSvg(trace);
  EXPECT_EQ(svg.status().code(), absl::StatusCode::kInvalidArgument) << why;
}

TEST(RenderTraceSvgTest, RejectsTracesItCannotDraw) {
  // The base trace is fine; each case breaks one thing.
  ASSERT_TRUE(RenderTraceSvg(OneFOneBTrace()).ok());

  v1::Trace no_ranks = OneFOneBTrace();
  no_ranks.clear_ranks();
  no_ranks.set_num_ranks(0);
  ExpectInvalid(no_ranks, "no ranks");

  v1::Trace count = OneFOneBTrace();
  count.set_num_ranks(3);
  ExpectInvalid(count, "ranks count != num_ranks");

  v1::Trace schedule = OneFOneBTrace();
  schedule.set_schedule("2f2b");
  ExpectInvalid(schedule, "unknown schedule");

  v1::Trace stage_high = OneFOneBTrace();
  stage_high.mutable_ranks(0)->mutable_spans(1)->set_stage(2);
  ExpectInvalid(stage_high, "stage >= P*V");

  v1::Trace stage_negative = OneFOneBTrace();
  stage_negative.mutable_ranks(1)->mutable_spans(1)->set_stage(-1);
  ExpectInvalid(stage_negative, "stage < 0");

  v1::Trace wrong_rank = OneFOneBTrace();
  wrong_rank.mutable_ranks(0)->mutable_spans(1)->set_stage(1);
  ExpectInvalid(wrong_rank, "stage % P != rank");

  v1::Trace microbatch = OneFOneBTrace();
  microbatch.mutable_ranks(0)->mutable_spans(7)->set_microbatch(2);
  ExpectInvalid(microbatch, "microbatch >= M");

  v1::Trace negative_start = OneFOneBTrace();
  negative_start.mutable_ranks(0)->mutable_spans(10)->set_start_us(-1);
  ExpectInvalid(negative_start, "negative start");

  v1::Trace negative_duration = OneFOneBTrace();
  negative_duration.mutable_ranks(1)->mutable_spans(0)->set_duration_us(-5);
  ExpectInvalid(negative_duration, "negative duration");

  v1::Trace repeated_rank = OneFOneBTrace();
  repeated_rank.mutable_ranks(1)->set_rank(0);
  ExpectInvalid(repeated_rank, "rank 0 twice");

  v1::Trace no_microbatches = OneFOneBTrace();
  no_microbatches.set_microbatches(0);
  ExpectInvalid(no_microbatches, "M = 0");
}

// ---------------------------------------------------------------------------
// Accounting.

TEST(AccountTraceTest, SumsEachStreamPerRank) {
  const std::vector<RankAccounting> rows = AccountTrace(OneFOneBTrace());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].rank, 0);
  // data 20 + forward 200 + backward 400 + optimizer 60.
  EXPECT_DOUBLE_EQ(rows[0].compute_seconds, 680e-6);
  EXPECT_DOUBLE_EQ(rows[0].communication_seconds, 30e-6);
  EXPECT_DOUBLE_EQ(rows[0].idle_seconds, 315e-6);
  EXPECT_DOUBLE_EQ(rows[0].step_seconds, 0.001030);
  EXPECT_EQ(rows[1].rank, 1);
  // forward 195 + loss 20 + data 5 + backward 400 + optimizer 60.
  EXPECT_DOUBLE_EQ(rows[1].compute_seconds, 680e-6);
  EXPECT_DOUBLE_EQ(rows[1].communication_seconds, 230e-6);
  EXPECT_DOUBLE_EQ(rows[1].idle_seconds, 155e-6);
  EXPECT_DOUBLE_EQ(rows[1].step_seconds, 0.001070);
}

TEST(AccountTraceTest, IgnoresUnknownKinds) {
  v1::Trace trace = OneFOneBTrace();
  AddSpan(trace.mutable_ranks(0), static_cast<v1::Span::Kind>(42), -1, -1, 2000,
          1000);
  const std::vector<RankAccounting> rows = AccountTrace(trace);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].compute_seconds + rows[0].communication_seconds +
                       rows[0].idle_seconds,
                   1025e-6);
}

TEST(FormatAccountingTest, ShowsMillisecondsAndTheAccountedShare) {
  const std::string text = FormatAccounting(AccountTrace(OneFOneBTrace()));
  EXPECT_EQ(text,
            "RANK  COMPUTE   COMMUNICATION  IDLE      STEP      ACCOUNTED\n"
            "0     0.680 ms  0.030 ms       0.315 ms  1.030 ms  99.5%\n"
            "1     0.680 ms  0.230 ms       0.155 ms  1.070 ms  99.5%\n");
}

TEST(FormatAccountingTest, MarksAMissingStepTime) {
  const std::string text = FormatAccounting(
      {{.rank = 4, .compute_seconds = 0.5, .step_seconds = 0}});
  EXPECT_THAT(text, HasSubstr("\n4     500.000 ms"));
  EXPECT_THAT(text, HasSubstr("0.000 ms  -\n"));
}

// ---------------------------------------------------------------------------
// The bubble's breakdown.

TEST(ExplainBubbleTest, ComparesTheMeasuredStepWithTheSimulatorAtItsCosts) {
  // Every forward box is 110 us (data or loss included) and every backward
  // 200 us on both stages, so the two simulations agree: 1F1B with P = M = 2
  // idles (P - 1) / (M + P - 1) = 1/3. Measured: the boxes span 945 us from
  // rank 0's first data read to its last backward, and hold 620 us a rank.
  absl::StatusOr<BubbleBreakdown> bubble = ExplainBubble(OneFOneBTrace());
  ASSERT_TRUE(bubble.ok()) << bubble.status();
  EXPECT_NEAR(bubble->measured, 1 - 1240.0 / 1890.0, 1e-12);
  EXPECT_NEAR(bubble->at_stage_costs, 1.0 / 3, 1e-12);
  EXPECT_NEAR(bubble->at_uniform_costs, 1.0 / 3, 1e-12);
}

// A trace that is exactly the simulator's timeline of `costs`, in whole
// microseconds, every rank starting at the same instant.
v1::Trace SimulatedTrace(const scheduler::Schedule& schedule,
                         const scheduler::SimulationCosts<int64_t>& costs) {
  const scheduler::SimulationResult<int64_t> result =
      *scheduler::Simulate(schedule, costs);
  v1::Trace trace;
  trace.set_job_id("job-9");
  trace.set_step(1);
  trace.set_schedule(std::string(scheduler::ScheduleKindName(schedule.kind)));
  trace.set_num_ranks(schedule.ranks);
  trace.set_virtual_stages(schedule.virtual_stages);
  trace.set_microbatches(schedule.microbatches);
  for (int r = 0; r < schedule.ranks; ++r) {
    v1::RankTrace* rank = trace.add_ranks();
    rank->set_rank(r);
    rank->set_start_unix_us(kRank1Start);
    for (size_t i = 0; i < schedule.actions[r].size(); ++i) {
      const scheduler::Action& a = schedule.actions[r][i];
      const scheduler::ActionTiming<int64_t>& t = result.timings[r][i];
      const v1::Span::Kind kind = a.op == scheduler::Op::kForward
                                      ? v1::Span::FORWARD
                                      : v1::Span::BACKWARD;
      AddSpan(rank, kind, a.stage, a.microbatch, t.start, t.end - t.start);
    }
  }
  return trace;
}

TEST(ExplainBubbleTest, SeparatesTheStagesImbalanceFromTheRest) {
  // The second stage's backward takes twice the first's: the simulator at
  // the step's stage costs reproduces the measured bubble exactly, and at
  // uniform stages (F 100, B 300 us) gives 1F1B's (P - 1) / (M + P - 1).
  const scheduler::Schedule schedule = *scheduler::GenerateSchedule(
      scheduler::ScheduleKind::k1F1B,
      {.ranks = 2, .microbatches = 4, .virtual_stages = 1});
  scheduler::SimulationCosts<int64_t> costs;
  costs.forward = {100, 100};
  costs.backward = {200, 400};
  const v1::Trace trace = SimulatedTrace(schedule, costs);
  absl::StatusOr<BubbleBreakdown> bubble = ExplainBubble(trace);
  ASSERT_TRUE(bubble.ok()) << bubble.status();
  EXPECT_NEAR(bubble->at_uniform_costs, 1.0 / 5, 1e-12);
  EXPECT_NEAR(bubble->at_stage_costs, bubble->measured, 1e-12);
  // Rank 1 is busy 4 x 500 us from the first forward's end (100 us) and
  // rank 0's last backward follows (200 us): 1 - (1200 + 2000) / (2 x 2300).
  EXPECT_NEAR(bubble->measured, 1 - 3200.0 / 4600.0, 1e-12);
  EXPECT_THAT(FormatBubbleBreakdown(*bubble),
              HasSubstr("(stage imbalance +10.4 points; communication, "
                        "runtime and uneven actions +0.0)"));
}

TEST(ExplainBubbleTest, RefusesWhatItCannotSimulate) {
  EXPECT_EQ(ExplainBubble(v1::Trace()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Rank 1 reported nothing: its stage's actions never ran.
  v1::Trace trace = OneFOneBTrace();
  trace.mutable_ranks(1)->clear_spans();
  EXPECT_FALSE(ExplainBubble(trace).ok());
}

TEST(FormatBubbleBreakdownTest, ShowsPercentAndSignedPoints) {
  EXPECT_EQ(FormatBubbleBreakdown({.measured = 0.245,
                                   .at_stage_costs = 0.2213,
                                   .at_uniform_costs = 0.2}),
            "bubble 24.5% measured; simulated for these actions: 22.1% at "
            "this step's stage costs, 20.0% at uniform stages (stage "
            "imbalance +2.1 points; communication, runtime and uneven actions "
            "+2.4)\n");
  EXPECT_THAT(
      FormatBubbleBreakdown(
          {.measured = 0.1999, .at_stage_costs = 0.2, .at_uniform_costs = 0.2}),
      HasSubstr("actions +0.0)"));
  EXPECT_THAT(
      FormatBubbleBreakdown(
          {.measured = 0.18, .at_stage_costs = 0.2, .at_uniform_costs = 0.2}),
      HasSubstr("actions -2.0)"));
}

}  // namespace
}  // namespace conveyor::cli
