#include "coordinator/state_journal.h"

#include <string>
#include <vector>

#include "common/little_endian.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

StateChanges SomeChanges(uint64_t job) {
  StateChanges changes;
  changes.changed.set_version("1.2.3");
  changes.changed.set_next_job(job + 1);
  v1::JobRecordState* record = changes.changed.add_jobs();
  record->mutable_info()->set_id("job-" + std::to_string(job));
  record->mutable_info()->set_state(v1::RUNNING);
  record->mutable_request()->set_yaml("name: x\n");
  changes.changed.add_queue(job);
  changes.has_queue = true;
  changes.removed = {job - 1};
  return changes;
}

// A journal of generation 7 with a record per job 2, 3, 4; `ends` gets the
// offset where each record ends.
std::string ThreeRecords(std::vector<size_t>* ends) {
  std::string journal = EncodeJournalHeader(7);
  for (uint64_t job : {2, 3, 4}) {
    journal += EncodeJournalRecord(7, job - 1, EncodeChanges(SomeChanges(job)));
    ends->push_back(journal.size());
  }
  return journal;
}

TEST(StateJournalTest, ChangesRoundTrip) {
  const StateChanges changes = SomeChanges(5);
  absl::StatusOr<StateChanges> back = DecodeChanges(EncodeChanges(changes));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->changed.SerializeAsString(),
            changes.changed.SerializeAsString());
  EXPECT_TRUE(back->has_queue);
  EXPECT_THAT(back->removed, ElementsAre(4u));

  // Without its queue, an empty queue and an unchanged one differ.
  StateChanges no_queue = changes;
  no_queue.has_queue = false;
  back = DecodeChanges(EncodeChanges(no_queue));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->has_queue);
  EXPECT_EQ(back->changed.queue_size(), 0);
  EXPECT_EQ(back->changed.jobs(0).info().id(), "job-5");
}

TEST(StateJournalTest, DecodeChangesRefusesAbsurdCountsAndJunk) {
  std::string payload = EncodeChanges(SomeChanges(5));
  PutU32(payload.data() + 1, 0xffffffffu);  // Removed jobs.
  EXPECT_THAT(DecodeChanges(payload).status().message(),
              HasSubstr("lists 4294967295 removed jobs"));
  EXPECT_EQ(DecodeChanges("ab").status().code(), absl::StatusCode::kDataLoss);
  std::string flags = EncodeChanges(SomeChanges(5));
  flags[0] = 0x40;
  EXPECT_THAT(DecodeChanges(flags).status().message(),
              HasSubstr("unknown flags"));
}

TEST(StateJournalTest, ReadsEveryRecordInOrder) {
  std::vector<size_t> ends;
  const std::string journal = ThreeRecords(&ends);
  absl::StatusOr<ParsedJournal> parsed = ParseJournal(journal);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->generation, 7u);
  EXPECT_EQ(parsed->valid_bytes, journal.size());
  EXPECT_EQ(parsed->dropped_tail, "");
  ASSERT_EQ(parsed->records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parsed->records[i].sequence, i + 1);
    EXPECT_EQ(parsed->records[i].offset,
              i == 0 ? kJournalHeaderBytes : ends[i - 1]);
    absl::StatusOr<StateChanges> changes =
        DecodeChanges(parsed->records[i].payload);
    ASSERT_TRUE(changes.ok()) << changes.status();
    EXPECT_EQ(changes->changed.jobs(0).info().id(),
              "job-" + std::to_string(i + 2));
  }
  // Just a header: an empty journal.
  parsed = ParseJournal(EncodeJournalHeader(3));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->records.empty());
  EXPECT_EQ(parsed->valid_bytes, kJournalHeaderBytes);
}

TEST(StateJournalTest, ATornLastRecordIsDroppedAtEveryOffset) {
  std::vector<size_t> ends;
  const std::string journal = ThreeRecords(&ends);
  for (size_t cut = ends[1]; cut < ends[2]; ++cut) {
    absl::StatusOr<ParsedJournal> parsed = ParseJournal(journal.substr(0, cut));
    ASSERT_TRUE(parsed.ok()) << "cut at " << cut << ": " << parsed.status();
    EXPECT_EQ(parsed->records.size(), 2u) << "cut at " << cut;
    EXPECT_EQ(parsed->valid_bytes, ends[1]) << "cut at " << cut;
    EXPECT_EQ(parsed->dropped_tail.empty(), cut == ends[1]) << cut;
  }
}

TEST(StateJournalTest, ADamagedLastRecordIsDroppedNeverMisread) {
  std::vector<size_t> ends;
  const std::string journal = ThreeRecords(&ends);
  for (size_t i = ends[1]; i < ends[2]; ++i) {
    for (uint8_t flip : {0x01, 0x80}) {
      std::string bad = journal;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      absl::StatusOr<ParsedJournal> parsed = ParseJournal(bad);
      ASSERT_TRUE(parsed.ok()) << "byte " << i << ": " << parsed.status();
      EXPECT_EQ(parsed->records.size(), 2u) << "byte " << i;
      EXPECT_EQ(parsed->valid_bytes, ends[1]) << "byte " << i;
      EXPECT_THAT(parsed->dropped_tail, HasSubstr("cut short by a crash"));
    }
  }
}

TEST(StateJournalTest, ADamagedRecordFollowedByValidOnesIsDataLoss) {
  std::vector<size_t> ends;
  const std::string journal = ThreeRecords(&ends);
  for (size_t i = ends[0]; i < ends[1]; ++i) {
    std::string bad = journal;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    absl::StatusOr<ParsedJournal> parsed = ParseJournal(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
    EXPECT_THAT(
        parsed.status().message(),
        HasSubstr("damaged journal record at byte " + std::to_string(ends[0])));
  }
}

TEST(StateJournalTest, AnAbsurdLengthIsATornTailNotAnAllocation) {
  std::vector<size_t> ends;
  std::string journal = ThreeRecords(&ends);
  PutU32(journal.data() + ends[1], 0xffffffffu);
  absl::StatusOr<ParsedJournal> parsed = ParseJournal(journal);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->records.size(), 2u);
  EXPECT_THAT(parsed->dropped_tail, HasSubstr("a record of 4294967295 bytes"));
}

TEST(StateJournalTest, ARecordOfAnotherGenerationNeverPasses) {
  std::string journal = EncodeJournalHeader(8);
  journal += EncodeJournalRecord(7, 1, EncodeChanges(SomeChanges(2)));
  absl::StatusOr<ParsedJournal> parsed = ParseJournal(journal);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->records.empty());
  EXPECT_FALSE(parsed->dropped_tail.empty());
}

TEST(StateJournalTest, RefusesADamagedOrForeignHeader) {
  const std::string header = EncodeJournalHeader(7);
  for (size_t i = 0; i < header.size(); ++i) {
    std::string bad = header;
    bad[i] = static_cast<char>(bad[i] ^ 0x04);
    EXPECT_EQ(ParseJournal(bad).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
  }
  EXPECT_THAT(ParseJournal(header.substr(0, 10)).status().message(),
              HasSubstr("no CVYJ header"));
  EXPECT_THAT(ParseJournal("").status().message(), HasSubstr("no CVYJ header"));
}

}  // namespace
}  // namespace conveyor::coordinator
