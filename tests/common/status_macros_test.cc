#include "common/status_macros.h"

#include <string>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

int g_evaluations = 0;

absl::Status Fails() {
  ++g_evaluations;
  return absl::NotFoundError("missing");
}
absl::Status Succeeds() {
  ++g_evaluations;
  return absl::OkStatus();
}
absl::StatusOr<std::string> Value(bool ok) {
  ++g_evaluations;
  if (!ok) return absl::InvalidArgumentError("bad");
  return std::string("value");
}

absl::Status Chain(bool first_ok, int* reached) {
  RETURN_IF_ERROR(first_ok ? Succeeds() : Fails());
  *reached = 1;
  return absl::OkStatus();
}

absl::StatusOr<size_t> Assign(bool ok) {
  ASSIGN_OR_RETURN(std::string s, Value(ok));
  ASSIGN_OR_RETURN(s, Value(true));  // Re-assigning an existing variable.
  return s.size();
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesTheErrorAndStops) {
  int reached = 0;
  g_evaluations = 0;
  absl::Status status = Chain(false, &reached);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "missing");
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(g_evaluations, 1);
}

TEST(StatusMacrosTest, ReturnIfErrorContinuesOnOk) {
  int reached = 0;
  EXPECT_TRUE(Chain(true, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, AssignOrReturnMovesTheValueOrReturnsTheError) {
  g_evaluations = 0;
  absl::StatusOr<size_t> ok = Assign(true);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 5u);
  EXPECT_EQ(g_evaluations, 2);

  absl::StatusOr<size_t> bad = Assign(false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
