#include "checkpoint/manifest.h"

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
#include "checkpoint/layout.h"
#include "checkpoint_dir_test_base.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

CheckpointManifest SampleManifest() {
  CheckpointManifest m;
  m.job = "mlp";
  m.job_id = "job-7";
  m.step = 100;
  m.config_hash = "0123456789abcdef";
  m.training_hash = "fedcba9876543210";
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

// Manifests written before training hashes were recorded still parse.
TEST(ManifestJsonTest, TheTrainingHashIsOptional) {
  CheckpointManifest m = SampleManifest();
  m.training_hash.clear();
  const std::string json = ManifestToJson(m);
  EXPECT_THAT(json, ::testing::Not(HasSubstr("training_hash")));
  absl::StatusOr<CheckpointManifest> parsed =
      ParseManifest(json, "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, m);
}

// The job file a manifest records comes back byte for byte (quotes,
// newlines, non-ASCII text and all); manifests without it still parse.
TEST(ManifestJsonTest, TheJobFileRoundTripsAndIsOptional) {
  CheckpointManifest m = SampleManifest();
  m.job_yaml =
      "name: mlp  # \"quoted\" \u00e9t\u00e9\n"
      "training: {steps: 10}\n\toptimizer: {lr: 0.1}\n";
  const std::string json = ManifestToJson(m);
  EXPECT_THAT(json, HasSubstr("\"job_yaml\": \"name: mlp"));
  absl::StatusOr<CheckpointManifest> parsed =
      ParseManifest(json, "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->job_yaml, m.job_yaml);
  EXPECT_EQ(*parsed, m);

  m.job_yaml.clear();
  EXPECT_THAT(ManifestToJson(m), ::testing::Not(HasSubstr("job_yaml")));
  parsed = ParseManifest(ManifestToJson(m), "manifest.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->job_yaml.empty());
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
      {"empty training_hash", [](Json& j) { j["training_hash"] = ""; },
       "training_hash: must not be empty when present"},
      {"training_hash as number", [](Json& j) { j["training_hash"] = 7; },
       "training_hash: must be a string"},
      {"empty job_yaml", [](Json& j) { j["job_yaml"] = ""; },
       "job_yaml: must not be empty when present"},
      {"job_yaml as a map", [](Json& j) { j["job_yaml"] = Json::object(); },
       "job_yaml: must be a string"},
      {"job_yaml over the cap",
       [](Json& j) {
         j["job_yaml"] = std::string(kMaxRecordedJobBytes + 1, 'x');
       },
       "job_yaml: must be at most 262144 bytes; got 262145"},
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

}  // namespace
}  // namespace conveyor::checkpoint
