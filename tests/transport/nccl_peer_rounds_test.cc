#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl/internal/peer_rounds.h"
#include "transport/nccl/p2p_channel.h"  // ResolvePeers

namespace conveyor::transport::p2p_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TensorHeader H(int64_t step) {
  TensorHeader h;
  h.tag.job = 1;
  h.tag.step = step;
  h.bytes = 4;
  return h;
}

// Rank 1 of 4, exchanging with ranks 0 and 2 (not 3).
struct PeerRoundsTest : ::testing::Test {
  PeerRounds rounds{/*rank=*/1, /*world_size=*/4, {0, 2}};
};

TEST_F(PeerRoundsTest, ARoundWaitsForTheProposalOfEveryPeer) {
  EXPECT_THAT(rounds.Missing(0), ElementsAre(0, 2));
  ASSERT_TRUE(rounds.Proposal(2, 0).ok());
  rounds.AddProposal(2, {H(7)});
  EXPECT_THAT(rounds.Missing(0), ElementsAre(0));
  EXPECT_EQ(rounds.highest_seen(), 1u);
  ASSERT_TRUE(rounds.Proposal(0, 0).ok());
  rounds.AddProposal(0, {});
  EXPECT_THAT(rounds.Missing(0), IsEmpty());
  EXPECT_THAT(rounds.TakeProposal(2), ElementsAre(H(7)));
  EXPECT_THAT(rounds.TakeProposal(0), IsEmpty());
}

TEST_F(PeerRoundsTest, ProposalsOutOfOrderAreInternal) {
  const absl::Status s = rounds.Proposal(0, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("rank 0 proposed round 1, expected 0"));
}

TEST_F(PeerRoundsTest, APeerThatSaidGoodbyeTakesPartOnlyInItsRounds) {
  ASSERT_TRUE(rounds.Proposal(0, 0).ok());
  ASSERT_TRUE(rounds.Goodbye(0, 1).ok());
  EXPECT_TRUE(rounds.Participates(0, 0));
  EXPECT_FALSE(rounds.Participates(0, 1));
  EXPECT_TRUE(rounds.Gone(0));
  EXPECT_THAT(rounds.Missing(1), ElementsAre(2));
  // Its link closing afterwards is expected, and it may send nothing more.
  EXPECT_FALSE(rounds.LinkBroke(0));
  EXPECT_EQ(rounds.CheckSender(0).code(), absl::StatusCode::kInternal);
}

TEST_F(PeerRoundsTest, AGoodbyeMustCountTheRoundsProposed) {
  EXPECT_EQ(rounds.Goodbye(2, 3).code(), absl::StatusCode::kInternal);
}

TEST_F(PeerRoundsTest, OnlyPeersMaySendAndOnlyTheirLinksMatter) {
  EXPECT_FALSE(rounds.is_peer(3));
  EXPECT_FALSE(rounds.Participates(3, 0));
  EXPECT_EQ(rounds.CheckSender(3).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(rounds.LinkBroke(3));
  EXPECT_TRUE(rounds.LinkBroke(2));
  EXPECT_TRUE(rounds.Gone(2));
}

TEST(ResolvePeersTest, EmptyMeansEveryOtherRankAndBadListsAreRejected) {
  EXPECT_THAT(ResolvePeers(1, 3, {}).value(), ElementsAre(0, 2));
  EXPECT_THAT(ResolvePeers(0, 3, {2, 1}).value(), ElementsAre(1, 2));
  EXPECT_EQ(ResolvePeers(0, 3, {0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolvePeers(0, 3, {1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::transport::p2p_internal
