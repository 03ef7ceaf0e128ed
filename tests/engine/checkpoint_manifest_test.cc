#include "engine/checkpoint_manifest.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "engine/stage_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using Json = nlohmann::json;

CheckpointManifest SampleManifest() {
  CheckpointManifest m;
  m.job = "mlp";
  m.job_id = "job-7";
  m.step = 100;
  m.config_hash = "0123456789abcdef";
  m.num_stages = 3;
  m.stage_begin = {0, 2, 5};
  for (int s = 0; s < 3; ++s) {
    m.stages.push_back({.stage = s,
                        .file = StageFileName(s),
                        .bytes = 1000u + static_cast<uint64_t>(s),
                        .crc32c = 0x0000abcdu + static_cast<uint32_t>(s)});
  }
  m.created_unix_ms = 1700000000123;
  return m;
}

uint32_t CrcOf(const std::string& s) {
  return Crc32c(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

TEST(ManifestJsonTest, RoundTrips) {
  const CheckpointManifest m = SampleManifest();
  absl::StatusOr<CheckpointManifest> parsed =
      ParseManifest(ManifestToJson(m), "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, m);
}

TEST(ManifestJsonTest, IsPrettyWithFormatFirstAndCrcAsEightHexDigits) {
  const std::string json = ManifestToJson(SampleManifest());
  EXPECT_THAT(json, ::testing::StartsWith(
                        "{\n  \"format\": \"conveyor-checkpoint-v1\",\n  "
                        "\"job\": \"mlp\",\n"));
  EXPECT_THAT(json, HasSubstr("\"crc32c\": \"0000abcd\""));
  EXPECT_THAT(json, HasSubstr("\"file\": \"stage-2.safetensors\""));
  // The same manifest always gives the same text.
  EXPECT_EQ(json, ManifestToJson(SampleManifest()));
}

TEST(ManifestJsonTest, ParseReturnsStagesInStageOrder) {
  CheckpointManifest m = SampleManifest();
  std::swap(m.stages[0], m.stages[2]);
  absl::StatusOr<CheckpointManifest> parsed =
      ParseManifest(ManifestToJson(m), "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, SampleManifest());
}

struct BadManifest {
  std::string name;
  std::function<void(Json&)> mutate;
  std::string field;  // What the error must name.
};

TEST(ParseManifestTest, RejectsEveryInvalidFieldNamingIt) {
  const std::vector<BadManifest> cases = {
      {"wrong format", [](Json& j) { j["format"] = "conveyor-checkpoint-v2"; },
       "format: must be \"conveyor-checkpoint-v1\""},
      {"no format", [](Json& j) { j.erase("format"); }, "format: missing"},
      {"job not a string", [](Json& j) { j["job"] = 3; },
       "job: must be a string"},
      {"no job_id", [](Json& j) { j.erase("job_id"); }, "job_id: missing"},
      {"job_id null", [](Json& j) { j["job_id"] = nullptr; },
       "job_id: must be a string"},
      {"negative step", [](Json& j) { j["step"] = -1; }, "step: must be in"},
      {"fractional step", [](Json& j) { j["step"] = 1.5; },
       "step: must be an integer"},
      {"step as float", [](Json& j) { j["step"] = 100.0; },
       "step: must be an integer"},
      {"step as string", [](Json& j) { j["step"] = "100"; },
       "step: must be an integer"},
      {"no step", [](Json& j) { j.erase("step"); }, "step: missing"},
      {"huge step", [](Json& j) { j["step"] = UINT64_MAX; },
       "step: must be in [0, 9223372036854775807]"},
      {"empty config_hash", [](Json& j) { j["config_hash"] = ""; },
       "config_hash: must not be empty"},
      {"no config_hash", [](Json& j) { j.erase("config_hash"); },
       "config_hash: missing"},
      {"zero stages", [](Json& j) { j["num_stages"] = 0; },
       "num_stages: must be in [1, 4096]"},
      {"too many stages", [](Json& j) { j["num_stages"] = 4097; },
       "num_stages: must be in [1, 4096]"},
      {"num_stages disagrees with the lists",
       [](Json& j) { j["num_stages"] = 2; }, "stage_begin: must be a list"},
      {"stage_begin too short",
       [](Json& j) {
         j["stage_begin"] = {0, 2};
       },
       "stage_begin: must be a list of num_stages (3)"},
      {"stage_begin not a list", [](Json& j) { j["stage_begin"] = 0; },
       "stage_begin: must be a list"},
      {"stage_begin not from 0",
       [](Json& j) {
         j["stage_begin"] = {1, 2, 5};
       },
       "stage_begin[0]: is 1"},
      {"stage_begin not increasing",
       [](Json& j) {
         j["stage_begin"] = {0, 5, 5};
       },
       "stage_begin[2]: is 5"},
      {"stage_begin negative",
       [](Json& j) {
         j["stage_begin"] = {0, -2, 5};
       },
       "stage_begin[1]: must be in"},
      {"stage_begin item a string",
       [](Json& j) {
         j["stage_begin"] = {0, "2", 5};
       },
       "stage_begin[1]: must be an integer"},
      {"stages not a list", [](Json& j) { j["stages"] = Json::object(); },
       "stages: must be a list"},
      {"a stage missing",
       [](Json& j) { j["stages"].erase(j["stages"].begin() + 1); },
       "stages: must be a list of num_stages (3) stage files"},
      {"a stage twice",
       [](Json& j) {
         j["stages"][2]["stage"] = 1;
         j["stages"][2]["file"] = "stage-1.safetensors";
       },
       "stages[2].stage: stage 1 appears twice"},
      {"stage out of range", [](Json& j) { j["stages"][0]["stage"] = 3; },
       "stages[0].stage: must be in [0, 2]"},
      {"stage not an object", [](Json& j) { j["stages"][1] = "stage-1"; },
       "stages[1]: must be an object"},
      {"another stage's file",
       [](Json& j) { j["stages"][1]["file"] = "stage-2.safetensors"; },
       "stages[1].file: must be \"stage-1.safetensors\""},
      {"no file", [](Json& j) { j["stages"][1].erase("file"); },
       "stages[1].file: missing"},
      {"negative bytes", [](Json& j) { j["stages"][0]["bytes"] = -1; },
       "stages[0].bytes: must be a non-negative integer"},
      {"fractional bytes", [](Json& j) { j["stages"][0]["bytes"] = 2.5; },
       "stages[0].bytes: must be a non-negative integer"},
      {"crc too short", [](Json& j) { j["stages"][0]["crc32c"] = "abcdef0"; },
       "stages[0].crc32c: must be 8 lowercase hex digits"},
      {"crc too long", [](Json& j) { j["stages"][0]["crc32c"] = "0abcdef01"; },
       "stages[0].crc32c: must be 8 lowercase hex digits"},
      {"crc uppercase", [](Json& j) { j["stages"][0]["crc32c"] = "ABCDEF01"; },
       "stages[0].crc32c: must be 8 lowercase hex digits"},
      {"crc not hex", [](Json& j) { j["stages"][0]["crc32c"] = "xyz01234"; },
       "stages[0].crc32c: must be 8 lowercase hex digits"},
      {"crc signed", [](Json& j) { j["stages"][0]["crc32c"] = "-bcdef01"; },
       "stages[0].crc32c: must be 8 lowercase hex digits"},
      {"crc a number", [](Json& j) { j["stages"][0]["crc32c"] = 43981; },
       "stages[0].crc32c: must be a string"},
      {"unknown stage key", [](Json& j) { j["stages"][2]["path"] = "/x"; },
       "stages[2]: unknown key \"path\""},
      {"unknown top-level key", [](Json& j) { j["extra"] = 1; },
       "(top level): unknown key \"extra\""},
      {"no created_unix_ms", [](Json& j) { j.erase("created_unix_ms"); },
       "created_unix_ms: missing"},
      {"negative created_unix_ms", [](Json& j) { j["created_unix_ms"] = -5; },
       "created_unix_ms: must be in"},
  };
  const Json good = Json::parse(ManifestToJson(SampleManifest()));
  for (const BadManifest& c : cases) {
    Json j = good;
    c.mutate(j);
    absl::StatusOr<CheckpointManifest> parsed =
        ParseManifest(j.dump(), "ckpt/step-100/manifest.json");
    ASSERT_FALSE(parsed.ok()) << c.name;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("ckpt/step-100/manifest.json: " + c.field))
        << c.name;
  }
}

TEST(ParseManifestTest, RejectsFileNamesThatCouldLeaveTheStepDirectory) {
  const Json good = Json::parse(ManifestToJson(SampleManifest()));
  for (const std::string& name : std::vector<std::string>{
           "../stage-1.safetensors", "/etc/passwd", "stage-1.safetensors/../x",
           "sub/stage-1.safetensors", "./stage-1.safetensors",
           "stage-01.safetensors", "stage-1.safetensors ", "",
           std::string("stage-1.safetensors\0x", 21)}) {
    Json j = good;
    j["stages"][1]["file"] = name;
    absl::StatusOr<CheckpointManifest> parsed =
        ParseManifest(j.dump(), "m.json");
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_THAT(parsed.status().message(), HasSubstr("m.json: stages[1].file"))
        << name;
  }
}

TEST(ParseManifestTest, RejectsTextThatIsNotAManifest) {
  const std::string good = ManifestToJson(SampleManifest());
  std::string duplicate = good;
  duplicate.insert(2, "\"job\": \"other\",");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "m.json: manifest is not valid JSON"},
      {"{", "m.json: manifest is not valid JSON"},
      {good.substr(0, good.size() / 2), "m.json: manifest is not valid JSON"},
      {"[]", "m.json: (top level): must be an object"},
      {"null", "m.json: (top level): must be an object"},
      {"{\"format\": \"conveyor-checkpoint-v1\"} {}",
       "m.json: manifest is not valid JSON"},
      {duplicate, "m.json: manifest has duplicate key 'job'"},
      {std::string(100, '[') + std::string(100, ']'),
       "m.json: manifest is nested deeper than 8"},
      {"{\"format\": \"\xff\xfe\"}", "m.json: manifest is not valid JSON"},
      {std::string(kMaxManifestBytes + 1, ' '), "over the limit"},
  };
  for (const auto& [text, error] : cases) {
    absl::StatusOr<CheckpointManifest> parsed = ParseManifest(text, "m.json");
    ASSERT_FALSE(parsed.ok()) << error;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << error;
    EXPECT_THAT(parsed.status().message(), HasSubstr(error));
  }
}

TEST(JobConfigHashTest, IgnoresLayoutOrderAndTheBookkeepingSections) {
  const std::string base = R"(name: mlp
model:
  layers:
    - dense: {in: 4, out: 8}
    - relu
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: 1f1b}
)";
  const std::string hash = JobConfigHash(base);
  EXPECT_THAT(hash, MatchesRegex("[0-9a-f]{16}"));
  const std::vector<std::string> same = {
      // Comments and layout.
      R"(# A comment.
name: mlp   # trailing
model:
  layers: [{dense: {in: 4, out: 8}}, relu, {dense: {in: 8, out: 1}}]
optimizer:
  kind: adam
  lr: 0.001
training: {steps: 10, batch_size: 8, microbatches: 2}

pipeline: {schedule: 1f1b}
)",
      // Key order, top level and nested.
      R"(pipeline: {schedule: 1f1b}
training: {microbatches: 2, steps: 10, batch_size: 8}
optimizer: {lr: 0.001, kind: adam}
model:
  layers:
    - dense: {out: 8, in: 4}
    - relu
    - dense: {in: 8, out: 1}
name: mlp
)",
      // Another name, checkpoint policy, resume and restart.
      R"(name: renamed
model:
  layers:
    - dense: {in: 4, out: 8}
    - relu
    - dense: {in: 8, out: 1}
optimizer: {kind: adam, lr: 0.001}
training: {steps: 10, batch_size: 8, microbatches: 2}
pipeline: {schedule: 1f1b}
checkpoint: {dir: /elsewhere, every: 5, keep_latest: 2}
resume: latest
restart: {max_restarts: 3}
)",
  };
  for (const std::string& text : same) {
    EXPECT_EQ(JobConfigHash(text), hash) << text;
  }
}

TEST(JobConfigHashTest, ChangesWithWhatIsTrained) {
  const std::string base =
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n";
  const std::string hash = JobConfigHash(base);
  const std::vector<std::string> different = {
      // lr.
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.002}\n"
      "training: {steps: 10}\n",
      // A layer's width.
      "model: {layers: [{dense: {in: 4, out: 16}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n",
      // Layer order.
      "model: {layers: [relu, {dense: {in: 4, out: 8}}]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n",
      // A pipeline section.
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 10}\n"
      "pipeline: {schedule: gpipe}\n",
      // A value moved between keys must not collide.
      "model: {layers: [{dense: {in: 4, out: 8}}, relu]}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "training: {steps: 1}\n"
      "data: {seed: 0}\n",
  };
  for (const std::string& text : different) {
    EXPECT_NE(JobConfigHash(text), hash) << text;
  }
}

TEST(JobConfigHashTest, HashesUnparseableTextAsIs) {
  const std::string a = JobConfigHash("model: [unclosed");
  EXPECT_THAT(a, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(a, JobConfigHash("model: [unclosed"));
  EXPECT_NE(a, JobConfigHash("model: [unclosed "));
  // A self-referencing alias is cut off by the depth bound, not followed
  // forever.
  EXPECT_THAT(JobConfigHash("a: &x [*x]\n"), MatchesRegex("[0-9a-f]{16}"));
}

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / "checkpoint_manifest_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ckpt_ = dir_.string();
  }

  static void WriteBytes(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  std::string StepDir(int64_t step) const { return StepDirPath(ckpt_, step); }

  // Stage files (distinct contents per step and stage) without a manifest.
  void WriteStageFiles(int64_t step, int num_stages) {
    fs::create_directories(StepDir(step));
    for (int s = 0; s < num_stages; ++s) {
      WriteBytes(StageFilePath(ckpt_, step, s),
                 absl::StrCat("step ", step, " stage ", s, " ",
                              std::string(static_cast<size_t>(s) * 7, 'p')));
    }
  }

  // A complete step: the stage files, then their manifest.
  void WriteCompleteStep(int64_t step, int num_stages = 2) {
    WriteStageFiles(step, num_stages);
    CheckpointManifest m;
    m.job = "mlp";
    m.job_id = "job-1";
    m.step = step;
    m.config_hash = "00000000deadbeef";
    m.num_stages = num_stages;
    for (int s = 0; s < num_stages; ++s) {
      m.stage_begin.push_back(2 * s);
      absl::StatusOr<StageFileDigest> d = DigestStageFile(StepDir(step), s);
      ASSERT_TRUE(d.ok()) << d.status();
      m.stages.push_back(*d);
    }
    m.created_unix_ms = 1000 + step;
    ASSERT_TRUE(WriteManifest(ckpt_, m).ok());
  }

  void FlipByte(const std::string& path, size_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x01));
  }

  std::vector<int64_t> Steps() {
    absl::StatusOr<std::vector<int64_t>> steps = ListCheckpointSteps(ckpt_);
    EXPECT_TRUE(steps.ok()) << steps.status();
    return steps.ok() ? *steps : std::vector<int64_t>{};
  }

  fs::path dir_;
  std::string ckpt_;
};

TEST_F(CheckpointDirTest, DigestStageFileReadsSizeAndCrcInChunks) {
  fs::create_directories(StepDir(1));
  WriteBytes(StageFilePath(ckpt_, 1, 4), "123456789");
  absl::StatusOr<StageFileDigest> d = DigestStageFile(StepDir(1), 4);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, (StageFileDigest{.stage = 4,
                                 .file = "stage-4.safetensors",
                                 .bytes = 9,
                                 .crc32c = 0xE3069283u}));
  // Larger than one read chunk, and not a multiple of it.
  std::string big(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  WriteBytes(StageFilePath(ckpt_, 1, 0), big);
  d = DigestStageFile(StepDir(1), 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bytes, big.size());
  EXPECT_EQ(d->crc32c, CrcOf(big));

  EXPECT_EQ(DigestStageFile(StepDir(1), 9).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, WriteManifestWritesOnlyValidManifests) {
  WriteStageFiles(100, 3);
  CheckpointManifest m = SampleManifest();
  ASSERT_TRUE(WriteManifest(ckpt_, m).ok());
  const std::string path = (fs::path(StepDir(100)) / "manifest.json").string();
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(text, ManifestToJson(m));
  // Only the manifest and the stage files: no temporary left behind.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(StepDir(100))) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 4);

  CheckpointManifest bad = m;
  bad.step = 101;
  bad.stages[1].file = "../stage-1.safetensors";
  absl::Status s = WriteManifest(ckpt_, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("stages[1].file"));

  CheckpointManifest no_dir = m;
  no_dir.step = 7;
  EXPECT_EQ(WriteManifest(ckpt_, no_dir).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(StepDir(7)));
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointAcceptsAGoodStep) {
  WriteCompleteStep(5, 3);
  for (bool verify : {false, true}) {
    absl::StatusOr<CheckpointManifest> m =
        LoadCompleteCheckpoint(ckpt_, 5, verify);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->step, 5);
    EXPECT_EQ(m->num_stages, 3);
    EXPECT_EQ(m->stage_begin, (std::vector<int>{0, 2, 4}));
    ASSERT_EQ(m->stages.size(), 3u);
    EXPECT_EQ(m->stages[2].file, "stage-2.safetensors");
  }
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointMissingStepIsNotFound) {
  absl::StatusOr<CheckpointManifest> m = LoadCompleteCheckpoint(ckpt_, 5, true);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("step-5: no such step"));
  EXPECT_EQ(
      LoadCompleteCheckpoint((dir_ / "nope").string(), 5, true).status().code(),
      absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointWithoutManifestIsIncomplete) {
  WriteStageFiles(5, 2);
  absl::StatusOr<CheckpointManifest> m = LoadCompleteCheckpoint(ckpt_, 5, true);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(),
              HasSubstr("step 5 is incomplete: no manifest"));
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointRefusesAWrongSize) {
  WriteCompleteStep(5, 2);
  const std::string path = StageFilePath(ckpt_, 5, 1);
  const uint64_t size = fs::file_size(path);
  std::ofstream(path, std::ios::binary | std::ios::app) << "x";
  for (bool verify : {false, true}) {
    absl::StatusOr<CheckpointManifest> m =
        LoadCompleteCheckpoint(ckpt_, 5, verify);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(m.status().message(),
                HasSubstr(absl::StrCat("stage-1.safetensors: ", size + 1,
                                       " bytes, the manifest records ", size)));
  }
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointRefusesAFlippedByte) {
  WriteCompleteStep(5, 2);
  const std::string path = StageFilePath(ckpt_, 5, 0);
  std::ifstream in(path, std::ios::binary);
  std::string before((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
  FlipByte(path, 3);
  std::string after = before;
  after[3] ^= 0x01;
  // Sizes alone do not see it.
  EXPECT_TRUE(LoadCompleteCheckpoint(ckpt_, 5, false).ok());
  absl::StatusOr<CheckpointManifest> m = LoadCompleteCheckpoint(ckpt_, 5, true);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(),
              HasSubstr(absl::StrFormat(
                  "stage-0.safetensors: CRC-32C %08x, the manifest records "
                  "%08x",
                  CrcOf(after), CrcOf(before))));
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointRefusesAMissingStageFile) {
  WriteCompleteStep(5, 2);
  fs::remove(StageFilePath(ckpt_, 5, 1));
  for (bool verify : {false, true}) {
    absl::StatusOr<CheckpointManifest> m =
        LoadCompleteCheckpoint(ckpt_, 5, verify);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(
        m.status().message(),
        HasSubstr("stage-1.safetensors: missing; the manifest records"));
  }
}

TEST_F(CheckpointDirTest, LoadCompleteCheckpointRefusesABadManifest) {
  WriteCompleteStep(5, 2);
  WriteCompleteStep(6, 2);
  const fs::path manifest = fs::path(StepDir(6)) / "manifest.json";
  // Step 5's manifest copied into step 6.
  fs::copy_file(fs::path(StepDir(5)) / "manifest.json", manifest,
                fs::copy_options::overwrite_existing);
  absl::StatusOr<CheckpointManifest> m = LoadCompleteCheckpoint(ckpt_, 6, true);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(),
              HasSubstr("step: 5, but the directory is step-6"));
  WriteBytes(manifest, "{\"format\": \"conveyor-checkpoint-v1\"");
  m = LoadCompleteCheckpoint(ckpt_, 6, true);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(),
              HasSubstr("manifest.json: manifest is not valid JSON"));
}

TEST_F(CheckpointDirTest, ListCheckpointStepsIgnoresOtherNames) {
  for (const char* name :
       {"step-10", "step-0", "step-5", "step-01", "step-x", "step-1.tmp",
        "step-", "step--1", "step-+3", "step-1e3", "step-99999999999999999999",
        "Step-4", "other"}) {
    fs::create_directories(dir_ / name);
  }
  WriteBytes(dir_ / "step-7", "a file, not a directory");
  EXPECT_THAT(Steps(), ElementsAre(0, 5, 10));

  absl::StatusOr<std::vector<int64_t>> missing =
      ListCheckpointSteps((dir_ / "nope").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("no such checkpoint directory"));
  EXPECT_EQ(ListCheckpointSteps((dir_ / "step-7").string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointDirTest, FindLatestSkipsNewerUncommittedSteps) {
  WriteCompleteStep(10);
  WriteCompleteStep(20);
  WriteStageFiles(30, 2);  // No manifest: a crash while saving.
  WriteStageFiles(40, 1);
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/true);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->manifest.step, 20);
  ASSERT_EQ(latest->skipped.size(), 2u);
  EXPECT_THAT(latest->skipped[0],
              HasSubstr("step 40 is incomplete: no manifest"));
  EXPECT_THAT(latest->skipped[1],
              HasSubstr("step 30 is incomplete: no manifest"));
}

// A committed step that fails its checks is not passed over: resuming from
// the step before it would redo the steps between and then overwrite it
// (it once did so without a word).
TEST_F(CheckpointDirTest, FindLatestRefusesADamagedCommittedStepNamingIt) {
  WriteCompleteStep(10);
  WriteCompleteStep(20);
  WriteCompleteStep(30);
  WriteStageFiles(40, 2);                    // Uncommitted: passed over.
  FlipByte(StageFilePath(ckpt_, 30, 1), 0);  // Corrupt.
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(latest.status().message(),
              HasSubstr(StepDir(30) +
                        " is a committed checkpoint that fails its checks"));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("step-30/stage-1.safetensors: CRC-32C"));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("the newest intact step before it is " + StepDir(20)));

  // Without checksums the flipped byte goes unseen.
  latest = FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/false);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->manifest.step, 30);

  // Truncated, as a full disk or a bad copy leaves it: sizes catch it too.
  std::filesystem::resize_file(StageFilePath(ckpt_, 30, 0), 1);
  latest = FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/false);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  // With no intact step left, it says so.
  fs::remove_all(StepDir(10));
  fs::remove_all(StepDir(20));
  latest = FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/false);
  EXPECT_THAT(latest.status().message(), HasSubstr("no older step is intact"));
}

TEST_F(CheckpointDirTest, FindLatestWithNothingCompleteSaysWhy) {
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(ckpt_, true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(latest.status().message(),
              HasSubstr("no complete checkpoint (no step-<N> directories)"));

  WriteStageFiles(1, 2);
  WriteStageFiles(2, 1);
  latest = FindLatestCompleteCheckpoint(ckpt_, true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(latest.status().message(), HasSubstr("no complete checkpoint: "));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("step 2 is incomplete: no manifest"));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("step 1 is incomplete: no manifest"));

  // A committed step with a file missing is damaged, not incomplete.
  WriteCompleteStep(3);
  fs::remove(StageFilePath(ckpt_, 3, 0));
  latest = FindLatestCompleteCheckpoint(ckpt_, true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(latest.status().message(),
              HasSubstr("stage-0.safetensors: missing"));
  EXPECT_THAT(latest.status().message(), HasSubstr("no older step is intact"));

  EXPECT_EQ(FindLatestCompleteCheckpoint((dir_ / "nope").string(), true)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, PruneKeepsTheNewestCompleteSteps) {
  for (int64_t step : {1, 2, 3, 4, 5}) WriteCompleteStep(step);
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1, 2, 3));
  EXPECT_THAT(Steps(), ElementsAre(4, 5));
  // Idempotent.
  removed = PruneCheckpoints(ckpt_, 2);
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, IsEmpty());
}

TEST_F(CheckpointDirTest, PruneNeverRemovesTheNewestCompleteStep) {
  WriteCompleteStep(1);
  WriteCompleteStep(2);
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1));
  EXPECT_THAT(Steps(), ElementsAre(2));
}

TEST_F(CheckpointDirTest, PruneLeavesNewerIncompleteStepsAndRemovesOlderOnes) {
  WriteStageFiles(1, 2);  // A crash's leftovers.
  WriteCompleteStep(2);
  WriteCompleteStep(3);
  FlipByte(StageFilePath(ckpt_, 3, 0), 0);  // Sizes still match: complete.
  WriteCompleteStep(4);
  fs::remove(StageFilePath(ckpt_, 4, 1));  // Damaged: incomplete.
  WriteCompleteStep(5);
  WriteStageFiles(6, 1);                    // Being written right now.
  fs::create_directories(StepDir(7));       // Just created.
  fs::create_directories(dir_ / "step-x");  // Not a step.
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1, 2, 4));
  EXPECT_THAT(Steps(), ElementsAre(3, 5, 6, 7));
  EXPECT_TRUE(fs::exists(dir_ / "step-x"));
}

TEST_F(CheckpointDirTest, PruneRemovesNothingWithoutACompleteStep) {
  WriteStageFiles(1, 2);
  WriteStageFiles(2, 2);
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, IsEmpty());
  EXPECT_THAT(Steps(), ElementsAre(1, 2));
}

TEST_F(CheckpointDirTest, PruneWithKeepZeroRemovesNothing) {
  WriteStageFiles(1, 2);
  for (int64_t step : {2, 3, 4}) WriteCompleteStep(step);
  for (int keep : {0, -1}) {
    absl::StatusOr<std::vector<int64_t>> removed =
        PruneCheckpoints(ckpt_, keep);
    ASSERT_TRUE(removed.ok()) << removed.status();
    EXPECT_THAT(*removed, IsEmpty());
  }
  EXPECT_THAT(Steps(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(PruneCheckpoints((dir_ / "nope").string(), 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, WritableCheckCreatesTheDirectoryAndLeavesNothing) {
  const fs::path nested = dir_ / "a" / "b";
  ASSERT_TRUE(CheckCheckpointDirWritable(nested.string()).ok());
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(fs::is_empty(nested));  // The probe is gone.
  // A file where the directory should be: refused, saying what would fail.
  std::ofstream(dir_ / "file") << "x";
  const absl::Status status =
      CheckCheckpointDirWritable((dir_ / "file").string());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("cannot be written (" + (dir_ / "file").string()));
  EXPECT_THAT(status.message(),
              HasSubstr("the job would fail at its first checkpoint"));
  // A directory no file can be created in (even by root), as a read-only
  // mount.
  EXPECT_EQ(CheckCheckpointDirWritable("/proc").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointDirTest, RemoveAllRemovesEveryStepAndNothingElse) {
  WriteStageFiles(1, 2);  // Incomplete.
  WriteCompleteStep(2);
  WriteCompleteStep(10);
  fs::create_directories(dir_ / "step-x");  // Not a step.
  fs::create_directories(dir_ / "step-01");
  std::ofstream(dir_ / "params.safetensors") << "kept";
  absl::StatusOr<std::vector<int64_t>> removed = RemoveAllCheckpoints(ckpt_);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1, 2, 10));
  EXPECT_THAT(Steps(), IsEmpty());
  EXPECT_TRUE(fs::exists(dir_ / "step-x"));
  EXPECT_TRUE(fs::exists(dir_ / "step-01"));
  EXPECT_TRUE(fs::exists(dir_ / "params.safetensors"));
  // Nothing left, and no directory at all: both remove nothing.
  removed = RemoveAllCheckpoints(ckpt_);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, IsEmpty());
  removed = RemoveAllCheckpoints((dir_ / "nope").string());
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, IsEmpty());
  // A file where the directory should be is an error, not a no-op.
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(RemoveAllCheckpoints((dir_ / "file").string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace conveyor::engine
