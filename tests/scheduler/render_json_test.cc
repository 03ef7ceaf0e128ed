#include "scheduler/render_json.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/generators.h"
#include "scheduler/validator.h"

namespace conveyor::scheduler {
namespace {

using ::nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Schedule SmallSplitSchedule() {
  Schedule s;
  s.kind = ScheduleKind::kZeroBubbleH1;
  s.ranks = 2;
  s.virtual_stages = 1;
  s.microbatches = 1;
  s.actions = {{{Op::kForward, 0, 0},
                {Op::kBackwardInput, 0, 0},
                {Op::kBackwardWeight, 0, 0}},
               {{Op::kForward, 1, 0}, {Op::kBackward, 1, 0}}};
  return s;
}

TEST(ScheduleToJsonTest, WritesTheCliShape) {
  const json expected = json::parse(R"({
    "kind": "zb-h1", "ranks": 2, "virtual": 1, "microbatches": 1,
    "placement": "loop",
    "schedule": [
      {"rank": 0, "actions": [{"op": "F", "stage": 0, "microbatch": 0},
                              {"op": "BI", "stage": 0, "microbatch": 0},
                              {"op": "BW", "stage": 0, "microbatch": 0}]},
      {"rank": 1, "actions": [{"op": "F", "stage": 1, "microbatch": 0},
                              {"op": "B", "stage": 1, "microbatch": 0}]}]})");
  EXPECT_EQ(ScheduleToJson(SmallSplitSchedule()), expected);
}

TEST(ScheduleToJsonTest, NumbersAreIntegersAndKindUsesTheCliName) {
  absl::StatusOr<Schedule> s =
      GenerateSchedule(ScheduleKind::kInterleaved1F1B,
                       {.ranks = 2, .microbatches = 2, .virtual_stages = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  const json j = ScheduleToJson(*s);
  EXPECT_EQ(j["kind"], "interleaved-1f1b");
  EXPECT_EQ(j["virtual"], 2);
  ASSERT_TRUE(j["schedule"][1]["actions"][0]["stage"].is_number_integer());
  EXPECT_EQ(j["schedule"][1]["rank"], 1);
  EXPECT_EQ(j["schedule"][1]["actions"].size(), 8u);  // 2 chunks x 2 x (F+B).
}

TEST(SimulationToJsonTest, IntegerTimesStayIntegers) {
  SimulationResult<int64_t> r;
  r.makespan = 90;
  r.busy = {60, 60};
  r.idle = {30, 30};
  r.peak_inflight = {2, 1};
  r.peak_pending_weight_grads = {0, 0};
  const json j = SimulationToJson(r);
  ASSERT_TRUE(j["makespan"].is_number_integer());
  EXPECT_EQ(j["makespan"], 90);
  EXPECT_NEAR(j["bubble_fraction"].get<double>(), 60.0 / 180.0, 1e-12);
  EXPECT_EQ(j["peak_inflight"], json({2, 1}));
  EXPECT_EQ(j["busy"], json({60, 60}));
  EXPECT_EQ(j["idle"], json({30, 30}));
  EXPECT_EQ(j["peak_pending_weight_grads"], json({0, 0}));
  // Per-action timings are deliberately left out.
  EXPECT_FALSE(j.contains("timings"));
}

TEST(SimulationToJsonTest, DoubleTimesAreFloats) {
  SimulationResult<double> r;
  r.makespan = 2.5;
  r.busy = {2.0};
  r.idle = {0.5};
  r.peak_inflight = {1};
  r.peak_pending_weight_grads = {3};
  const json j = SimulationToJson(r);
  ASSERT_TRUE(j["makespan"].is_number_float());
  EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 2.5);
  EXPECT_NEAR(j["bubble_fraction"].get<double>(), 0.2, 1e-12);
  EXPECT_EQ(j["idle"], json({0.5}));
  EXPECT_EQ(j["peak_pending_weight_grads"], json({3}));
}

TEST(ScheduleFromJsonTest, RoundTripsEveryGeneratedKindThroughText) {
  struct Case {
    ScheduleKind kind;
    ScheduleOptions options;
  };
  const std::vector<Case> cases = {
      {ScheduleKind::kGPipe,
       {.ranks = 4, .microbatches = 8, .virtual_stages = 2}},
      {ScheduleKind::k1F1B, {.ranks = 4, .microbatches = 8}},
      {ScheduleKind::kInterleaved1F1B,
       {.ranks = 4, .microbatches = 8, .virtual_stages = 3}},
      {ScheduleKind::kZeroBubbleH1, {.ranks = 5, .microbatches = 7}},
      {ScheduleKind::kZeroBubbleV,
       {.ranks = 3, .microbatches = 5, .virtual_stages = 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ScheduleKindName(c.kind));
    absl::StatusOr<Schedule> original = GenerateSchedule(c.kind, c.options);
    ASSERT_TRUE(original.ok()) << original.status();
    const std::string text = ScheduleToJson(*original).dump();
    absl::StatusOr<Schedule> loaded = ScheduleFromJson(json::parse(text));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->kind, original->kind);
    EXPECT_EQ(loaded->ranks, original->ranks);
    EXPECT_EQ(loaded->virtual_stages, original->virtual_stages);
    EXPECT_EQ(loaded->microbatches, original->microbatches);
    EXPECT_EQ(loaded->placement, original->placement);
    EXPECT_EQ(loaded->actions, original->actions);
    EXPECT_TRUE(ValidateSchedule(*loaded).ok());
  }
}

TEST(ScheduleFromJsonTest, EntriesMayComeInAnyRankOrder) {
  json j = ScheduleToJson(SmallSplitSchedule());
  std::swap(j["schedule"][0], j["schedule"][1]);
  absl::StatusOr<Schedule> loaded = ScheduleFromJson(j);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->actions, SmallSplitSchedule().actions);
}

TEST(ScheduleFromJsonTest, IgnoresUnknownKeysIncludingTheSimulation) {
  json j = ScheduleToJson(SmallSplitSchedule());
  j["simulation"] = {{"makespan", 5}};
  j["comment"] = "hand-edited";
  j["schedule"][0]["note"] = 1;
  j["schedule"][0]["actions"][0]["duration"] = 2.5;
  absl::StatusOr<Schedule> loaded = ScheduleFromJson(j);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->actions, SmallSplitSchedule().actions);
}

TEST(ScheduleFromJsonTest, LoadsSemanticallyBrokenSchedulesForTheValidator) {
  // Stage out of range, a stage on the wrong rank, a missing backward and a
  // microbatch beyond M: all for ValidateSchedule to reject, not the loader.
  const json j = json::parse(R"({
    "kind": "1f1b", "ranks": 2, "virtual": 1, "microbatches": 1,
    "schedule": [
      {"rank": 0, "actions": [{"op": "F", "stage": 99, "microbatch": 0},
                              {"op": "B", "stage": 1, "microbatch": 7}]},
      {"rank": 1, "actions": []}]})");
  absl::StatusOr<Schedule> loaded = ScheduleFromJson(j);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(loaded->actions[0], ElementsAre(Action{Op::kForward, 99, 0},
                                              Action{Op::kBackward, 1, 7}));
  EXPECT_TRUE(loaded->actions[1].empty());
}

// Each case breaks one thing in a valid document and names the message.
struct ErrorCase {
  std::string name;
  std::function<void(json&)> mutate;
  std::string message;
};

std::vector<ErrorCase> ErrorCases() {
  return {
      {"not an object", [](json& j) { j = json::array(); },
       "top level: expected an object, got array"},
      {"kind missing", [](json& j) { j.erase("kind"); },
       "kind: missing required key"},
      {"kind not a string", [](json& j) { j["kind"] = 3; },
       "kind: expected a string, got number 3"},
      {"kind unknown", [](json& j) { j["kind"] = "pipedream"; },
       "kind: unknown schedule 'pipedream'; allowed: gpipe, 1f1b, "
       "interleaved-1f1b, zb-h1, eager-1f1b"},
      {"placement unknown", [](json& j) { j["placement"] = "w"; },
       "placement: unknown placement 'w'; allowed: loop, v"},
      {"placement not a string", [](json& j) { j["placement"] = 1; },
       "placement: expected a string, got number 1"},
      {"ranks missing", [](json& j) { j.erase("ranks"); },
       "ranks: missing required key"},
      {"ranks a string", [](json& j) { j["ranks"] = "2"; },
       "ranks: expected an integer, got string \"2\""},
      {"ranks a float", [](json& j) { j["ranks"] = 2.0; },
       "ranks: expected an integer, got number 2.0"},
      {"ranks zero", [](json& j) { j["ranks"] = 0; },
       "ranks: must be >= 1, got 0"},
      {"virtual negative", [](json& j) { j["virtual"] = -1; },
       "virtual: must be >= 1, got -1"},
      {"virtual missing", [](json& j) { j.erase("virtual"); },
       "virtual: missing required key"},
      {"microbatches too large",
       [](json& j) { j["microbatches"] = uint64_t{1} << 40; },
       "microbatches: is 1099511627776, too large (at most 2147483647)"},
      {"microbatches negative", [](json& j) { j["microbatches"] = -5; },
       "microbatches: must be >= 1, got -5"},
      {"stage count overflows", [](json& j) { j["virtual"] = 2000000000; },
       "virtual: ranks * virtual = 4000000000 stages, too many"},
      {"schedule missing", [](json& j) { j.erase("schedule"); },
       "schedule: missing required key"},
      {"schedule an object", [](json& j) { j["schedule"] = json::object(); },
       "schedule: expected an array, got object"},
      {"schedule too short", [](json& j) { j["schedule"].erase(1); },
       "schedule: has 1 entries but ranks is 2; need one entry per rank"},
      {"ranks count mismatch", [](json& j) { j["ranks"] = 3; },
       "schedule: has 2 entries but ranks is 3"},
      {"entry not an object", [](json& j) { j["schedule"][1] = 5; },
       "schedule[1]: expected an object, got number 5"},
      {"rank missing", [](json& j) { j["schedule"][1].erase("rank"); },
       "schedule[1].rank: missing required key"},
      {"rank out of range", [](json& j) { j["schedule"][1]["rank"] = 2; },
       "schedule[1].rank: is 2 but ranks is 2 (valid ranks are 0..1)"},
      {"rank negative", [](json& j) { j["schedule"][0]["rank"] = -1; },
       "schedule[0].rank: must be >= 0, got -1"},
      {"rank twice", [](json& j) { j["schedule"][1]["rank"] = 0; },
       "schedule[1].rank: rank 0 already appears in schedule[0]"},
      {"actions missing", [](json& j) { j["schedule"][0].erase("actions"); },
       "schedule[0].actions: missing required key"},
      {"actions a string", [](json& j) { j["schedule"][0]["actions"] = "F"; },
       "schedule[0].actions: expected an array, got string \"F\""},
      {"action not an object",
       [](json& j) { j["schedule"][0]["actions"][2] = json::array(); },
       "schedule[0].actions[2]: expected an object, got array"},
      {"op missing",
       [](json& j) { j["schedule"][1]["actions"][1].erase("op"); },
       "schedule[1].actions[1].op: missing required key"},
      {"op not a string",
       [](json& j) { j["schedule"][1]["actions"][1]["op"] = nullptr; },
       "schedule[1].actions[1].op: expected a string, got null"},
      {"op unknown",
       [](json& j) {
         json& actions = j["schedule"][1]["actions"];  // Two actions.
         actions.push_back({{"op", "F"}, {"stage", 1}, {"microbatch", 1}});
         actions.push_back({{"op", "X"}, {"stage", 1}, {"microbatch", 1}});
       },
       "schedule[1].actions[3].op: unknown op 'X'; allowed: F, B, BI, BW"},
      {"stage negative",
       [](json& j) { j["schedule"][0]["actions"][1]["stage"] = -3; },
       "schedule[0].actions[1].stage: must be >= 0, got -3"},
      {"stage missing",
       [](json& j) { j["schedule"][0]["actions"][1].erase("stage"); },
       "schedule[0].actions[1].stage: missing required key"},
      {"microbatch a boolean",
       [](json& j) { j["schedule"][0]["actions"][0]["microbatch"] = true; },
       "schedule[0].actions[0].microbatch: expected an integer, got boolean "
       "true"},
      {"microbatch negative",
       [](json& j) { j["schedule"][0]["actions"][2]["microbatch"] = -1; },
       "schedule[0].actions[2].microbatch: must be >= 0, got -1"},
  };
}

TEST(ScheduleFromJsonTest, StructuralErrorsSayWhereAndWhat) {
  // The valid document loads, so each failure below is the mutation's doing.
  ASSERT_TRUE(ScheduleFromJson(ScheduleToJson(SmallSplitSchedule())).ok());
  for (const ErrorCase& c : ErrorCases()) {
    SCOPED_TRACE(c.name);
    json j = ScheduleToJson(SmallSplitSchedule());
    c.mutate(j);
    absl::StatusOr<Schedule> loaded = ScheduleFromJson(j);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(loaded.status().message(), HasSubstr(c.message));
  }
}

TEST(ScheduleFromJsonTest, LongValuesAreShortenedInMessages) {
  json j = ScheduleToJson(SmallSplitSchedule());
  j["ranks"] = std::string(1000, 'x');
  absl::StatusOr<Schedule> loaded = ScheduleFromJson(j);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("xxx..."));
  EXPECT_LT(loaded.status().message().size(), 120u);
}

TEST(ScheduleFromJsonTest, InvalidUtf8InAValueStillGivesAPreciseMessage) {
  json j = ScheduleToJson(SmallSplitSchedule());
  j["schedule"][0]["actions"][1]["stage"] = std::string("\xff\xfe");
  absl::StatusOr<Schedule> loaded = ScheduleFromJson(j);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("schedule[0].actions[1].stage: expected an integer, "
                        "got string"));
}

TEST(ScheduleFromJsonTest, NeverThrowsOnOddValues) {
  for (const json& odd :
       {json(), json(nullptr), json(true), json("schedule"), json(1.5),
        json::binary({1, 2, 3}), json::parse(R"({"kind": {"a": 1}})")}) {
    absl::StatusOr<Schedule> loaded;
    EXPECT_NO_THROW(loaded = ScheduleFromJson(odd)) << odd.dump();
    EXPECT_FALSE(loaded.ok()) << odd.dump();
  }
}

}  // namespace
}  // namespace conveyor::scheduler
