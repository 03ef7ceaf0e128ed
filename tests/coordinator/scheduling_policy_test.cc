#include "coordinator/scheduling_policy.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::Pair;

TEST(ParseOwnerQuotasTest, ParsesOwnersAndCounts) {
  absl::StatusOr<OwnerQuotas> q = ParseOwnerQuotas("team-a=16,team.b_2=8");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_THAT(*q, ElementsAre(Pair("team-a", 16), Pair("team.b_2", 8)));
  absl::StatusOr<OwnerQuotas> none = ParseOwnerQuotas("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(ParseOwnerQuotasTest, RefusesBadEntriesNamingThem) {
  const struct {
    const char* text;
    const char* says;
  } cases[] = {
      {"team-a", "'team-a' has no '='"},
      {"team-a=16,", "'' has no '='"},
      {"=4", "'=4': the owner must be 1 to 64 characters of A-Z a-z 0-9 . _ -"},
      {"te am=4", "'te am=4': the owner must be"},
      {"team-a=0",
       "'team-a=0': the quota must be a whole number of workers "
       "in [1, 1048576]"},
      {"team-a=-1", "the quota must be a whole number"},
      {"team-a=1.5", "the quota must be a whole number"},
      {"team-a=", "the quota must be a whole number"},
      {"team-a=99999999999", "the quota must be a whole number"},
      {"team-a=2,team-a=3", "owner 'team-a' is given twice"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<OwnerQuotas> q = ParseOwnerQuotas(c.text);
    ASSERT_FALSE(q.ok()) << c.text;
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(q.status().message(), HasSubstr("--owner-quota: ")) << c.text;
    EXPECT_THAT(q.status().message(),
                HasSubstr("expected OWNER=WORKERS[,OWNER=WORKERS...]"));
    EXPECT_THAT(q.status().message(), HasSubstr(c.says)) << c.text;
  }
}

TEST(ChooseVictimsTest, LowestPriorityFirst) {
  // Needs 4 more: the two low jobs (2 + 2), not the normal one that alone
  // would do.
  EXPECT_THAT(ChooseVictims({{.number = 1, .priority = 100, .workers = 4},
                             {.number = 2, .priority = 0, .workers = 2},
                             {.number = 3, .priority = 0, .workers = 2}},
                            4),
              Optional(ElementsAre(2, 3)));
}

TEST(ChooseVictimsTest, FewestWithinAPriority) {
  // Needs 4: the one low job of 4 rather than two of 2.
  EXPECT_THAT(ChooseVictims({{.number = 1, .priority = 0, .workers = 2},
                             {.number = 2, .priority = 0, .workers = 4},
                             {.number = 3, .priority = 0, .workers = 2}},
                            4),
              Optional(ElementsAre(2)));
  // Among equal jobs the newest goes.
  EXPECT_THAT(ChooseVictims({{.number = 5, .priority = 0, .workers = 2},
                             {.number = 9, .priority = 0, .workers = 2}},
                            1),
              Optional(ElementsAre(9)));
}

TEST(ChooseVictimsTest, SparesWhatTheOthersCover) {
  // Needs 5. Greedy by priority takes low 3 (job 1), low 1 (job 2), then
  // normal 4 (job 3) = 8; jobs 1 and 3 alone give 7 >= 5, so job 2 (the
  // smaller low one, chosen after job 1) is spared, then job 1 is still
  // needed (4 < 5).
  EXPECT_THAT(ChooseVictims({{.number = 1, .priority = 0, .workers = 3},
                             {.number = 2, .priority = 0, .workers = 1},
                             {.number = 3, .priority = 100, .workers = 4}},
                            5),
              Optional(ElementsAre(1, 3)));
}

TEST(ChooseVictimsTest, NothingWhenAllTogetherAreTooFewOrNoneNeeded) {
  EXPECT_EQ(ChooseVictims({{.number = 1, .priority = 0, .workers = 2},
                           {.number = 2, .priority = 0, .workers = 1}},
                          4),
            std::nullopt);
  EXPECT_EQ(ChooseVictims({}, 1), std::nullopt);
  EXPECT_THAT(ChooseVictims({{.number = 1, .priority = 0, .workers = 2}}, 0),
              Optional(ElementsAre()));
  // A job holding none of the needed kind of worker is never chosen.
  EXPECT_THAT(ChooseVictims({{.number = 1, .priority = 0, .workers = 0},
                             {.number = 2, .priority = 50, .workers = 1}},
                            1),
              Optional(ElementsAre(2)));
}

}  // namespace
}  // namespace conveyor::coordinator
