#include "cli/format.h"

#include <sstream>
#include <string>
#include <vector>

#include "cli/watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::StepSummary Step(int64_t step, double loss) {
  v1::StepSummary s;
  s.set_step(step);
  s.set_has_loss(true);
  s.set_loss(loss);
  s.set_seconds(0.0032);
  s.set_samples_per_second(40000);
  s.set_learning_rate(0.003);
  return s;
}

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-7");
  job.set_name("mlp");
  job.set_state(v1::RUNNING);
  job.set_priority(100);  // normal
  job.set_steps_total(200);
  job.set_schedule("1f1b");
  job.set_num_stages(2);
  job.set_num_workers(2);
  job.set_virtual_stages(1);
  job.set_batch_size(128);
  job.set_microbatches(4);
  job.add_worker_ids("worker-1");
  job.add_worker_ids("worker-2");
  return job;
}

TEST(FormatDurationTest, PicksAUnitByMagnitude) {
  EXPECT_EQ(FormatDuration(0.42), "0.4 s");
  EXPECT_EQ(FormatDuration(9.96), "10.0 s");
  EXPECT_EQ(FormatDuration(12.3), "12 s");
  EXPECT_EQ(FormatDuration(245), "4m05s");
  EXPECT_EQ(FormatDuration(3720), "1h02m");
  EXPECT_EQ(FormatDuration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(FormatDuration(-1), "-");
}

TEST(FormatTableTest, PadsColumnsWithoutTrailingSpaces) {
  EXPECT_EQ(FormatTable({"ID", "STATE", "NOTE"},
                        {{"worker-1", "IDLE", ""}, {"w-2", "LOST", "gone"}}),
            "ID        STATE  NOTE\n"
            "worker-1  IDLE\n"
            "w-2       LOST   gone\n");
}

TEST(LogEveryTest, AboutTwentyLinesAndAlwaysTheEnds) {
  EXPECT_EQ(DefaultLogEvery(200), 10);
  EXPECT_EQ(DefaultLogEvery(7), 1);
  EXPECT_EQ(DefaultLogEvery(0), 1);
  int lines = 0;
  for (int step = 1; step <= 200; ++step) lines += ShouldLogStep(step, 200, 10);
  EXPECT_EQ(lines, 21);  // 1, 10, 20, ..., 200.
  EXPECT_TRUE(ShouldLogStep(1, 200, 10));
  EXPECT_TRUE(ShouldLogStep(200, 200, 7));
  EXPECT_FALSE(ShouldLogStep(11, 200, 10));
}

TEST(StepTimeEstimatorTest, EstimatesTheRemainingSteps) {
  StepTimeEstimator estimator;
  EXPECT_FALSE(estimator.Remaining(0, 100).has_value());
  estimator.Add(0.5);
  ASSERT_TRUE(estimator.Remaining(10, 100).has_value());
  EXPECT_DOUBLE_EQ(*estimator.Remaining(10, 100), 45);
  EXPECT_DOUBLE_EQ(*estimator.Remaining(100, 100), 0);
  // A slower step moves the average a fifth of the way.
  estimator.Add(1.5);
  EXPECT_DOUBLE_EQ(*estimator.Remaining(90, 100), 7);
}

TEST(FormatStepLineTest, MatchesTheInProcessShape) {
  EXPECT_EQ(FormatStepLine(Step(40, 0.1234567), 200, 5.1),
            "step  40/200  loss 0.123457  lr 0.003  3.2 ms  40000 samples/s  "
            "ETA 5.1 s");
}

TEST(FormatStepLineTest, ShowsTokensBubbleAndNoEtaAtTheEnd) {
  v1::StepSummary s = Step(200, 2.5);
  s.set_tokens_per_second(9000);
  s.set_bubble_fraction(0.125);
  s.add_ranks();
  s.add_ranks();
  EXPECT_EQ(FormatStepLine(s, 200, 0.0),
            "step 200/200  loss 2.500000  lr 0.003  3.2 ms  40000 samples/s  "
            "9000 tokens/s  bubble 12.5%");
}

TEST(FormatStepLineTest, ShowsTheGradientNormAndMfuWhenKnown) {
  v1::StepSummary s = Step(200, 2.5);
  s.set_grad_norm(0.8125);
  s.set_mfu(0.4125);
  EXPECT_EQ(FormatStepLine(s, 200, 0.0),
            "step 200/200  loss 2.500000  lr 0.003  3.2 ms  40000 samples/s  "
            "grad norm 0.812  MFU 41.2%");
}

TEST(FormatStepLineTest, ShowsFlopsPerDeviceAndTheFullestDevicesMemory) {
  v1::StepSummary s = Step(200, 2.5);
  s.set_tflops_per_device(312.5);
  s.set_mfu(0.45);
  s.set_peak_memory_allocated_bytes(uint64_t{30} << 30);
  s.set_peak_memory_reserved_bytes(uint64_t{33} << 30);
  s.set_memory_capacity_bytes(uint64_t{80} << 30);
  EXPECT_EQ(FormatStepLine(s, 200, 0.0),
            "step 200/200  loss 2.500000  lr 0.003  3.2 ms  40000 samples/s  "
            "312 TFLOP/s/device  MFU 45.0%  mem 30.0 GiB (38%), 33.0 GiB "
            "reserved");
  // The CPU: reserved is allocated, so it is not repeated.
  s.set_peak_memory_reserved_bytes(uint64_t{30} << 30);
  EXPECT_THAT(FormatStepLine(s, 200, 0.0), HasSubstr("mem 30.0 GiB (38%)"));
  EXPECT_THAT(FormatStepLine(s, 200, 0.0), Not(HasSubstr("reserved")));
  s.set_memory_capacity_bytes(uint64_t{24} << 40);
  EXPECT_THAT(FormatStepLine(s, 200, 0.0), HasSubstr("mem 30.0 GiB (<1%)"));
}

TEST(FormatStepLineTest, LeavesOutTheLossWhenThereIsNone) {
  v1::StepSummary s = Step(3, 0);
  s.set_has_loss(false);
  EXPECT_THAT(FormatStepLine(s, 10, std::nullopt), Not(HasSubstr("loss")));
}

TEST(FormatStepLineTest, ShowsTheEvaluationThatFollowedTheStep) {
  v1::StepSummary s = Step(40, 2.5);
  s.set_has_eval(true);
  s.set_eval_loss(2.75);
  EXPECT_EQ(
      FormatStepLine(s, 200, std::nullopt),
      "step  40/200  loss 2.500000  eval loss 2.750000  lr 0.003  3.2 ms  "
      "40000 samples/s");
  s.set_eval_perplexity(15.64263);
  EXPECT_THAT(FormatStepLine(s, 200, std::nullopt),
              HasSubstr("eval loss 2.750000 (ppl 15.64)  lr"));
  EXPECT_THAT(FormatProgressBar(s, 200, std::nullopt, 4),
              HasSubstr("loss 2.500000  eval loss 2.750000 (ppl 15.64)"));
}

TEST(WatchPrinterTest, AlwaysLogsAStepAnEvaluationFollowed) {
  std::ostringstream out;
  WatchPrinter printer(out, {.log_every = 100, .tty = false});
  v1::JobEvent event;
  *event.mutable_job() = RunningJob();
  *event.mutable_step() = Step(7, 1.5);
  printer.OnEvent(event);
  EXPECT_THAT(out.str(), Not(HasSubstr("step   7/200")));
  event.mutable_step()->set_step(8);
  event.mutable_step()->set_has_eval(true);
  event.mutable_step()->set_eval_loss(1.75);
  printer.OnEvent(event);
  EXPECT_THAT(out.str(), HasSubstr("step   8/200  loss 1.500000  eval loss "
                                   "1.750000"));
}

TEST(FormatProgressBarTest, FillsInProportion) {
  EXPECT_EQ(FormatProgressBar(Step(50, 0.5), 200, 150.0, 20),
            "[#####---------------]   50/200  loss 0.500000  40000 samples/s  "
            "3.2 ms/step  ETA 2m30s");
  v1::StepSummary tokens = Step(200, 0.5);
  tokens.set_tokens_per_second(1234);
  EXPECT_EQ(FormatProgressBar(tokens, 200, 0.0, 4),
            "[####]  200/200  loss 0.500000  1234 tokens/s  3.2 ms/step");
}

TEST(FormatStateLineTest, DescribesEachState) {
  v1::Job job = RunningJob();
  job.set_state(v1::QUEUED);
  job.set_queue_position(2);
  EXPECT_EQ(FormatStateLine(job), "job-7 (mlp): QUEUED, position 2");
  job.add_resume_notes("training.steps raised from 10 to 20");
  EXPECT_EQ(FormatStateLine(job),
            "job-7 (mlp): QUEUED, position 2\n"
            "  note: training.steps raised from 10 to 20");
  job.clear_resume_notes();
  job.set_queue_reason(
      "needs 2 workers; 1 is live: it waits for more to "
      "register");
  EXPECT_EQ(FormatStateLine(job),
            "job-7 (mlp): QUEUED, position 2: needs 2 workers; 1 is live: it "
            "waits for more to register");
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("  queue     position 2; needs 2 workers; 1 is live"));
  job.clear_queue_reason();
  job.set_state(v1::RUNNING);
  EXPECT_EQ(FormatStateLine(job),
            "job-7 (mlp): RUNNING: 1f1b: 2 worker(s) x 1 virtual stage(s) = 2 "
            "stage(s); batch 128 in 4 microbatch(es) on worker-1, worker-2");
  job.set_devices_per_stage(2);
  job.set_data_plane("nccl");
  EXPECT_EQ(FormatStateLine(job),
            "job-7 (mlp): RUNNING: 1f1b: 2 worker(s) x 1 virtual stage(s) = 2 "
            "stage(s); batch 128 in 4 microbatch(es) on worker-1, worker-2, 2 "
            "devices per stage; data plane: nccl");
}

TEST(FormatOutcomeTest, SaysHowTheJobEnded) {
  v1::Job job = RunningJob();
  job.set_state(v1::SUCCEEDED);
  job.set_steps_done(200);
  job.set_has_loss(true);
  job.set_last_loss(0.0123);
  job.set_started_unix_ms(1000);
  job.set_ended_unix_ms(13300);
  EXPECT_EQ(FormatOutcome(job),
            "SUCCEEDED: 200/200 steps in 12 s, final loss 0.012300");
  job.set_has_eval(true);
  job.set_last_eval_step(200);
  job.set_last_eval_loss(2.5);
  job.set_last_eval_perplexity(12.1825);
  EXPECT_EQ(FormatOutcome(job),
            "SUCCEEDED: 200/200 steps in 12 s, final loss 0.012300, eval loss "
            "2.500000 (perplexity 12.18)");
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("  eval      loss 2.500000, perplexity 12.18 after "
                        "step 200"));
  job.set_state(v1::FAILED);
  job.set_steps_done(40);
  job.set_message("worker-2 lost");
  EXPECT_EQ(FormatOutcome(job), "FAILED: worker-2 lost (after 40/200 steps)");
  job.set_state(v1::CANCELLED);
  job.clear_message();
  EXPECT_EQ(FormatOutcome(job),
            "CANCELLED: (no reason given) (after 40/200 steps)");
}

TEST(FormatJobDetailsTest, ShowsCheckpointsResumeAndRestarts) {
  v1::Job job;
  job.set_id("job-4");
  job.set_state(v1::RUNNING);
  job.set_checkpoint_dir("/ckpt/run");
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("checkpoint  /ckpt/run\n"));
  job.set_last_checkpoint_step(40);
  job.set_resumed_from_step(20);
  job.set_resumed_from("/ckpt/run/step-20");
  job.set_max_restarts(2);
  job.set_restarts(1);
  job.set_last_restart_reason("worker-2 (b, rank 1, stages 1) lost");
  const std::string text = FormatJobDetails(job, absl::FromUnixMillis(0));
  EXPECT_THAT(text, HasSubstr("/ckpt/run (newest complete: step 40)"));
  EXPECT_THAT(text, HasSubstr("from step 20 (/ckpt/run/step-20)"));
  EXPECT_THAT(text, HasSubstr("1 of at most 2; last after: worker-2 (b, rank "
                              "1, stages 1) lost"));
}

// An elastic restart's layouts, one line each, once there is more than one.
TEST(FormatJobDetailsTest, ShowsEveryLayoutOnceThereAreTwo) {
  v1::Job job;
  job.set_id("job-5");
  job.set_state(v1::RUNNING);
  v1::JobLayout* first = job.add_layouts();
  first->set_num_workers(4);
  first->set_num_stages(4);
  for (int b : {0, 3, 6, 9}) first->add_stage_begin(b);
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              ::testing::Not(HasSubstr("layouts")));
  v1::JobLayout* second = job.add_layouts();
  second->set_from_step(4);
  second->set_num_workers(3);
  second->set_num_stages(3);
  for (int b : {0, 6, 9}) second->add_stage_begin(b);
  second->set_reason("worker-2 lost; laid out on 3 of the 4 workers");
  const std::string text = FormatJobDetails(job, absl::FromUnixMillis(0));
  EXPECT_THAT(text, HasSubstr("  layouts   from step 0: 4 workers, 4 stages at "
                              "layers [0, 3, 6, 9]\n"));
  EXPECT_THAT(text,
              HasSubstr("\n            from step 4: 3 workers, 3 stages at "
                        "layers [0, 6, 9]; worker-2 lost; laid out on 3 "
                        "of the 4 workers\n"));
  // One of each is singular ("1 workers, 1 stages" once).
  v1::JobLayout* third = job.add_layouts();
  third->set_from_step(9);
  third->set_num_workers(1);
  third->set_num_stages(1);
  third->add_stage_begin(0);
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("from step 9: 1 worker, 1 stage at layers [0]\n"));
}

TEST(FormatJobDetailsTest, ShowsDevicesPerStageAndTheDataPlane) {
  v1::Job job = RunningJob();
  std::string text = FormatJobDetails(job, absl::FromUnixMillis(0));
  EXPECT_THAT(text, Not(HasSubstr("devices")));
  EXPECT_THAT(text, Not(HasSubstr("data plane")));
  job.set_devices_per_stage(2);
  job.set_data_plane("tcp (ranks 0 and 1 share GPU GPU-a)");
  text = FormatJobDetails(job, absl::FromUnixMillis(0));
  EXPECT_THAT(text,
              HasSubstr("  devices     2 per stage (each microbatch split "
                        "over them)\n"));
  EXPECT_THAT(text,
              HasSubstr("  data plane  tcp (ranks 0 and 1 share GPU GPU-a)\n"));
  // Tensor parallel: the mesh's replicas and ranks, on both views.
  job.set_devices_per_stage(4);
  job.set_tensor_parallel(2);
  text = FormatJobDetails(job, absl::FromUnixMillis(0));
  EXPECT_THAT(text, HasSubstr("  devices     4 per stage: 2 replica(s) x 2 "
                              "tensor-parallel ranks\n"));
  EXPECT_THAT(FormatStateLine(job),
              HasSubstr(", 4 devices per stage (2 replica(s) x 2 "
                        "tensor-parallel ranks);"));
}

TEST(FormatJobDetailsTest, ShowsTheAutoSplitOnceChosen) {
  v1::Job job = RunningJob();
  job.mutable_auto_split()->set_chosen(false);
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("  stages    auto; not chosen yet (profiling)\n"));
  v1::AutoSplit* a = job.mutable_auto_split();
  a->set_chosen(true);
  a->set_profiled_on("cpu:1");
  a->set_from_cache(true);
  a->set_predicted_step_seconds(0.0126);
  a->set_predicted_bubble(0.25);
  a->set_predicted_even_step_seconds(0.021);
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("  stages    auto from a profile on cpu:1 (cached); "
                        "predicted step 12.60 ms, bubble 25.0%; even split "
                        "21.00 ms\n"));
}

TEST(FormatJobDetailsTest, ShowsFieldsAndTheStageTable) {
  v1::Job job = RunningJob();
  job.set_steps_done(40);
  job.set_has_loss(true);
  job.set_last_loss(0.5);
  job.set_last_step_seconds(0.0032);
  job.set_samples_per_second(40000);
  job.set_created_unix_ms(1'000'000);
  job.set_started_unix_ms(1'002'000);
  job.set_checkpoint_dir("/ckpt/mlp");
  for (int s = 0; s < 2; ++s) {
    v1::StagePlacement* p = job.add_stages();
    p->set_stage(s);
    p->set_rank(s);
    p->set_first_layer(s * 4);
    p->set_num_layers(4);
    p->set_num_params(1000 + s);
    p->set_worker_id(absl::StrCat("worker-", s + 1));
  }
  const std::string text =
      FormatJobDetails(job, absl::FromUnixMillis(1'062'000));
  EXPECT_EQ(text,
            "job-7 (mlp): RUNNING\n"
            "  progress    40/200 steps, loss 0.500000, 3.2 ms/step, 40000 "
            "samples/s\n"
            "  pipeline    1f1b: 2 worker(s) x 1 virtual stage(s) = 2 "
            "stage(s); batch 128 in 4 microbatch(es)\n"
            "  created     1m02s ago\n"
            "  running     for 1m00s\n"
            "  checkpoint  /ckpt/mlp\n"
            "\n"
            "STAGE  RANK  LAYERS  PARAMETERS  WORKER\n"
            "0      0     0-3     1000        worker-1\n"
            "1      1     4-7     1001        worker-2\n");
}

TEST(FormatJobDetailsTest, ShowsPriorityOwnerAgingAndPreemptions) {
  v1::Job job = RunningJob();
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              testing::Not(HasSubstr("priority")));
  job.set_priority(0);
  job.set_owner("team-a");
  job.set_preemptions(2);
  job.set_preempted_by("job-9");
  std::string text = FormatJobDetails(job, absl::FromUnixMillis(0));
  EXPECT_THAT(text, HasSubstr("  priority   low; owner team-a\n"));
  EXPECT_THAT(text, HasSubstr("  preempted  2 times, last by job-9\n"));
  job.set_state(v1::QUEUED);
  job.set_effective_priority(90);
  job.set_queued_wait_ms(90 * 60 * 1000);
  EXPECT_THAT(FormatJobDetails(job, absl::FromUnixMillis(0)),
              HasSubstr("  priority   low (90 with aging after 1h30m "
                        "queued); owner team-a\n"));
}

TEST(FormatJobsTableTest, OneRowPerJob) {
  v1::Job job = RunningJob();
  job.set_steps_done(40);
  job.set_created_unix_ms(1'000'000);
  v1::Job queued;
  queued.set_id("job-8");
  queued.set_state(v1::QUEUED);
  queued.set_steps_total(10);
  queued.set_schedule("interleaved-1f1b");
  queued.set_virtual_stages(2);
  queued.set_num_workers(4);
  queued.set_priority(0);
  queued.set_effective_priority(35);
  queued.set_owner("team-a");
  queued.set_queue_reason("needs 4 workers, 2 free; behind job-6 (high)");
  job.set_priority(300);
  EXPECT_EQ(FormatJobsTable({job, queued}, absl::FromUnixMillis(1'005'000)),
            "ID     NAME  STATE    STEPS   LOSS  SCHEDULE              "
            "WORKERS  AGE    PRIORITY  OWNER   WAITS FOR\n"
            "job-7  mlp   RUNNING  40/200  -     1f1b                  2"
            "        5.0 s  urgent    -       -\n"
            "job-8  -     QUEUED   0/10    -     interleaved-1f1b V=2  4"
            "        -      low+35    team-a  needs 4 workers, 2 free; behind "
            "job-6 (high)\n");
}

TEST(FormatWorkersTableTest, OneRowPerWorker) {
  v1::Worker busy;
  busy.set_id("worker-1");
  busy.set_name("local-0");
  busy.set_state(v1::BUSY);
  busy.set_job_id("job-7");
  busy.add_stages(0);
  busy.add_stages(2);
  busy.set_seconds_since_heartbeat(0.4);
  busy.set_data_address("127.0.0.1:4100");
  busy.set_metrics_address("127.0.0.1:9465");
  v1::Worker lost;
  lost.set_id("worker-2");
  lost.set_name("gpu-host:77");
  lost.set_state(v1::LOST);
  lost.set_seconds_since_heartbeat(75);
  lost.set_lost_reason("no heartbeat for 5 s");
  EXPECT_EQ(FormatWorkersTable({busy, lost}),
            "ID        NAME         STATE  JOB    STAGES  HEARTBEAT  "
            "DATA-ADDRESS    METRICS         NOTE\n"
            "worker-1  local-0      BUSY   job-7  0,2     0.4 s ago  "
            "127.0.0.1:4100  127.0.0.1:9465\n"
            "worker-2  gpu-host:77  LOST   -      -       1m15s ago  -"
            "               -               no heartbeat for 5 s\n");
}

// A data plane asked for on port 0 binds a free port per job: the table
// once showed "127.0.0.1:0". It shows the bound endpoint of the job a worker
// holds, and HOST:* (a port picked per job) otherwise.
TEST(FormatWorkersTableTest, ShowsTheBoundDataEndpoint) {
  v1::Worker idle;
  idle.set_id("worker-1");
  idle.set_name("a");
  idle.set_state(v1::IDLE);
  idle.set_data_address("127.0.0.1:0");
  v1::Worker busy = idle;
  busy.set_id("worker-2");
  busy.set_state(v1::BUSY);
  busy.set_data_endpoint("127.0.0.1:41234");
  const std::string table = FormatWorkersTable({idle, busy});
  EXPECT_THAT(table, HasSubstr("127.0.0.1:* "));
  EXPECT_THAT(table, HasSubstr("127.0.0.1:41234"));
  EXPECT_THAT(table, Not(HasSubstr("127.0.0.1:0 ")));
}

// The watch output, event by event.
std::vector<v1::JobEvent> Events() {
  std::vector<v1::JobEvent> events;
  v1::Job job = RunningJob();
  job.set_steps_total(4);
  job.set_state(v1::QUEUED);
  job.set_queue_position(1);
  events.emplace_back().mutable_job()->CopyFrom(job);
  job.set_state(v1::RUNNING);
  events.emplace_back().mutable_job()->CopyFrom(job);
  for (int step = 1; step <= 4; ++step) {
    job.set_steps_done(step);
    job.set_has_loss(true);
    job.set_last_loss(1.0 / step);
    v1::JobEvent& e = events.emplace_back();
    *e.mutable_job() = job;
    *e.mutable_step() = Step(step, 1.0 / step);
    e.mutable_step()->set_seconds(1);
  }
  job.set_state(v1::SUCCEEDED);
  events.emplace_back().mutable_job()->CopyFrom(job);
  return events;
}

TEST(WatchPrinterTest, PrintsStateChangesAndLoggedSteps) {
  std::ostringstream out;
  absl::Time t = absl::UnixEpoch();
  WatchPrinter printer(out, {.log_every = 2, .tty = false, .clock = [&t] {
                               return t += absl::Seconds(1);
                             }});
  std::vector<v1::JobEvent> events = Events();
  for (const v1::JobEvent& e : events) printer.OnEvent(e);
  printer.PrintOutcome(events.back().job());
  EXPECT_EQ(out.str(),
            "job-7 (mlp): QUEUED, position 1\n"
            "job-7 (mlp): RUNNING: 1f1b: 2 worker(s) x 1 virtual stage(s) = "
            "2 stage(s); batch 128 in 4 microbatch(es) on worker-1, "
            "worker-2\n"
            "step 1/4  loss 1.000000  lr 0.003  1000.0 ms  40000 samples/s  "
            "ETA 3.0 s\n"
            "step 2/4  loss 0.500000  lr 0.003  1000.0 ms  40000 samples/s  "
            "ETA 2.0 s\n"
            "step 4/4  loss 0.250000  lr 0.003  1000.0 ms  40000 samples/s\n"
            "SUCCEEDED: 4/4 steps, final loss 0.250000\n");
}

TEST(WatchPrinterTest, RedrawsOneBarOnATerminalUnderTheStepLines) {
  std::ostringstream out;
  absl::Time t = absl::UnixEpoch();
  WatchPrinter printer(
      out, {.log_every = 3, .tty = true, .bar_width = 4, .clock = [&t] {
              return t += absl::Seconds(1);
            }});
  std::vector<v1::JobEvent> events = Events();
  for (const v1::JobEvent& e : events) printer.OnEvent(e);
  printer.PrintOutcome(events.back().job());
  const std::string text = out.str();
  // A logged step's line replaces the bar, which is redrawn below it.
  EXPECT_THAT(text, HasSubstr("\rstep 1/4  loss 1.000000  lr 0.003  1000.0 ms"
                              "  40000 samples/s"));
  EXPECT_THAT(text, HasSubstr("\033[K\n[#---]  1/4  loss 1.000000"));
  // Steps between the logged ones only move the bar.
  EXPECT_THAT(text, HasSubstr("\r[##--]  2/4  loss 0.500000"));
  EXPECT_THAT(text, Not(HasSubstr("step 2/4")));
  EXPECT_THAT(text, HasSubstr("\rstep 4/4  loss 0.250000"));
  EXPECT_THAT(text, HasSubstr("\n[####]  4/4  loss 0.250000  40000 samples/s  "
                              "1000.0 ms/step\033[K\nSUCCEEDED: 4/4 steps"));
}

TEST(WatchPrinterTest, EstimatesFromTheTimeBetweenSteps) {
  // The steps say 1 s each, but arrive 3 s apart: what the pipeline spends
  // between steps counts too.
  std::ostringstream out;
  absl::Time t = absl::UnixEpoch();
  WatchPrinter printer(
      out, {.log_every = 1, .clock = [&t] { return t += absl::Seconds(3); }});
  std::vector<v1::JobEvent> events = Events();
  for (const v1::JobEvent& e : events) printer.OnEvent(e);
  EXPECT_THAT(out.str(), HasSubstr("step 1/4  loss 1.000000  lr 0.003  1000.0 "
                                   "ms  40000 samples/s  ETA 3.0 s\n"));
  EXPECT_THAT(out.str(), HasSubstr("step 2/4  loss 0.500000  lr 0.003  1000.0 "
                                   "ms  40000 samples/s  ETA 2.8 s\n"));
}

}  // namespace
}  // namespace conveyor::cli
