// What the coordinator's state file (coordinator/state_file.h) costs per
// step report that changes a job record (a committed checkpoint, say), with
// 16 to 512 jobs in the store: the full rewrite earlier releases did (every
// record encoded and written by WriteFileAtomically, with its fsyncs) against
// the journal (the one record appended and fdatasync'd, and its share of
// the compactions). Counters: bytes written per report, and compactions.
//
// The files go to $CONVEYOR_BENCH_DIR, or the current directory: a real
// disk, not a tmpfs, whose fsync would cost nothing.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/file.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/state_file.h"

namespace conveyor::coordinator {
namespace {

// A job file of the size users write (the record keeps it whole).
std::string JobYaml(uint64_t job) {
  return absl::StrCat(
      "name: finetune-", job,
      "\n"
      "model:\n"
      "  kind: gpt\n"
      "  vocab: 32000\n"
      "  hidden: 2048\n"
      "  layers: 24\n"
      "  heads: 16\n"
      "  sequence: 2048\n"
      "pipeline: {stages: 8, schedule: 1f1b, microbatches: 16}\n"
      "data:\n"
      "  source: tokens\n"
      "  path: /data/corpus/shard-*.bin\n"
      "  seed: 17\n"
      "training: {steps: 20000, batch_size: 256, microbatches: 16}\n"
      "optimizer: {kind: adamw, lr: 0.0003, weight_decay: 0.1, warmup: 500}\n"
      "checkpoint:\n"
      "  dir: /checkpoints/finetune-",
      job,
      "\n"
      "  every: 100\n"
      "  keep_latest: 3\n"
      "restart: {max_restarts: 3, elastic_min_workers: 4}\n");
}

v1::JobRecordState JobRecord(uint64_t job) {
  v1::JobRecordState record;
  v1::Job* info = record.mutable_info();
  info->set_id(absl::StrCat("job-", job));
  info->set_name(absl::StrCat("finetune-", job));
  info->set_state(v1::RUNNING);
  info->set_steps_total(20000);
  info->set_created_unix_ms(1'790'000'000'000 + job);
  info->set_checkpoint_dir(absl::StrCat("/checkpoints/finetune-", job));
  for (int w = 0; w < 8; ++w) {
    info->add_worker_ids(absl::StrCat("worker-", job * 8 + w));
  }
  record.mutable_request()->set_yaml(JobYaml(job));
  record.mutable_request()->set_file_name("finetune.yaml");
  record.mutable_request()->set_base_dir("/home/team/jobs");
  record.set_config_hash("9f2c4e1a7b3d5f60");
  record.set_attempt(1);
  return record;
}

// One step report's change to job `job`: its step count and a committed
// checkpoint.
void Step(v1::JobRecordState& record, int64_t step) {
  record.mutable_info()->set_steps_done(step);
  record.mutable_info()->set_last_checkpoint_step(step);
  record.mutable_info()->set_last_checkpoint_unix_ms(1'790'000'000'000 + step);
  record.mutable_committed()->set_step(step);
  record.mutable_committed()->set_step_dir(
      absl::StrCat(record.info().checkpoint_dir(), "/step-", step));
}

std::string BenchDir(const std::string& name) {
  const char* base = std::getenv("CONVEYOR_BENCH_DIR");
  const std::filesystem::path dir =
      std::filesystem::path(base != nullptr ? base : ".") /
      absl::StrCat("state_file_benchmark_", getpid());
  std::filesystem::create_directories(dir);
  for (const char* suffix : {"", ".journal", ".lock"}) {
    std::filesystem::remove(dir / (name + suffix));
  }
  return (dir / name).string();
}

// Earlier releases: every record, written whole on every change.
void BM_StepReportFullRewrite(benchmark::State& state) {
  const int jobs = static_cast<int>(state.range(0));
  std::vector<v1::JobRecordState> records;
  for (int j = 1; j <= jobs; ++j) records.push_back(JobRecord(j));
  const std::string path = BenchDir(absl::StrCat("full_", jobs));
  uint64_t bytes = 0;
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    Step(records[step % jobs], step);
    v1::CoordinatorState snapshot;  // JobStore::Snapshot's copy.
    snapshot.set_version("0.1.0");
    snapshot.set_next_job(jobs + 1);
    for (const v1::JobRecordState& r : records) *snapshot.add_jobs() = r;
    const std::string encoded = EncodeState(snapshot);
    if (absl::Status s = WriteFileAtomically(path, encoded); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    bytes += encoded.size();
  }
  state.counters["bytes_per_report"] =
      static_cast<double>(bytes) / static_cast<double>(state.iterations());
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

// The journal: the changed record appended, the snapshot rewritten only
// when the journal outgrows it.
void BM_StepReportJournal(benchmark::State& state) {
  const int jobs = static_cast<int>(state.range(0));
  std::vector<v1::JobRecordState> records;
  v1::CoordinatorState all;
  all.set_version("0.1.0");
  all.set_next_job(jobs + 1);
  for (int j = 1; j <= jobs; ++j) {
    records.push_back(JobRecord(j));
    *all.add_jobs() = records.back();
  }
  const std::string path = BenchDir(absl::StrCat("journal_", jobs));
  absl::StatusOr<std::unique_ptr<StateFile>> file = StateFile::Open(path);
  if (!file.ok() || !(*file)->Save(all).ok()) {
    state.SkipWithError("cannot open or save the state file");
    return;
  }
  const StateFile::Stats before = (*file)->stats();
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    v1::JobRecordState& record = records[step % jobs];
    Step(record, step);
    v1::CoordinatorState changed;  // JobStore::Changes: that record alone.
    changed.set_version("0.1.0");
    changed.set_next_job(jobs + 1);
    *changed.add_jobs() = record;
    if (absl::Status s = (*file)->Append(changed, {}); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  const StateFile::Stats after = (*file)->stats();
  state.counters["bytes_per_report"] =
      static_cast<double>(after.bytes - before.bytes) /
      static_cast<double>(state.iterations());
  state.counters["compactions"] =
      static_cast<double>(after.compactions - before.compactions);
  file->reset();
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

// Both ways at the job counts, 16 to 512.
void JobCounts(benchmark::internal::Benchmark* b) {
  for (int jobs : {16, 64, 128, 512}) b->Arg(jobs);
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK(BM_StepReportFullRewrite)->Apply(JobCounts);
BENCHMARK(BM_StepReportJournal)->Apply(JobCounts);

}  // namespace
}  // namespace conveyor::coordinator

BENCHMARK_MAIN();
