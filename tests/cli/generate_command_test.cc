// `conveyorctl generate`: from a HuggingFace checkpoint and from a Conveyor
// checkpoint with its job file, the command prints exactly what the
// generator gives for the same weights (ids, or escaped bytes for a
// byte-level model); bad flags, a missing or wrong job file and prompts the
// model cannot take are refused before anything runs.
#include "cli/generate_command.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/manifest.h"
#include "checkpoint/stage_file.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/generate.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/checkpoint.h"
#include "hf/model.h"
#include "hf/names.h"
#include "job/config_hash.h"
#include "job/job_spec.h"
#include "tests/cli/committed_checkpoint.h"
#include "tests/engine/test_util.h"
#include "tests/testing/test_dir.h"
#include "tests/tokenizer/tokenizer_json_builder.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

hf::HfLlamaConfig TinyConfig(int64_t vocab) {
  hf::HfLlamaConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rope_theta = 1000;
  c.vocab_size = vocab;
  c.max_position_embeddings = 32;
  return c;
}

// Random weights, large enough that the logits differ clearly.
std::vector<float> Values(const std::string& name, int64_t n) {
  std::mt19937 gen(static_cast<uint32_t>(std::hash<std::string>()(name)));
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

class MapSource final : public engine::ParameterSource {
 public:
  explicit MapSource(std::map<std::string, std::vector<float>> values)
      : values_(std::move(values)) {}
  absl::StatusOr<std::vector<float>> Read(const std::string& name,
                                          const engine::Shape&) const override {
    auto it = values_.find(name);
    if (it == values_.end()) return absl::NotFoundError(name);
    return it->second;
  }

 private:
  std::map<std::string, std::vector<float>> values_;
};

// What the generator gives for `model` and `source` directly.
std::vector<int64_t> Expected(const engine::ModelSpec& model,
                              const engine::ParameterSource& source,
                              const std::vector<int64_t>& prompt,
                              int64_t tokens,
                              const engine::SamplingOptions& sampling) {
  auto g =
      engine::Generator::Create(engine::CpuBackend::Get(), model, source, 64);
  EXPECT_TRUE(g.ok()) << g.status();
  auto ids = (*g)->Generate(prompt, tokens, sampling);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return *ids;
}

// Options with --prompt-ids `ids` (or, with `text`, --prompt `ids`).
GenerateCommandOptions Options(const std::string& source,
                               const std::string& ids, int64_t tokens = 2,
                               bool text = false) {
  GenerateCommandOptions o;
  o.source = source;
  (text ? o.prompt : o.prompt_ids) = ids;
  o.tokens = tokens;
  return o;
}

class GenerateCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = conveyor::testing_util::FreshTestDir("generate_command_test");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An fp32 HF checkpoint of TinyConfig(vocab) in dir_/<name>.
  std::string WriteHf(int64_t vocab, const std::string& name = "hf") {
    const std::string path = (dir_ / name).string();
    const absl::Status s = hf::WriteHfCheckpoint(
        path, TinyConfig(vocab),
        [&](const std::string& tensor) -> absl::StatusOr<std::vector<float>> {
          for (const auto& [n, shape] :
               hf::ExpectedLlamaTensors(TinyConfig(vocab))) {
            if (n == tensor) return Values(n, engine::NumElements(shape));
          }
          return absl::NotFoundError(tensor);
        },
        {.dtype = hf::HfDType::kF32});
    EXPECT_TRUE(s.ok()) << s;
    return path;
  }

  // What the generator gives for the HF checkpoint in `path`.
  std::vector<int64_t> ExpectedFromHf(const std::string& path,
                                      const std::vector<int64_t>& prompt,
                                      int64_t tokens,
                                      const engine::SamplingOptions& sampling) {
    auto checkpoint = hf::HfCheckpoint::Open(path);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
    engine::ModelSpec model;
    model.from_hf = path;
    model.input_shape = {8};
    EXPECT_TRUE(hf::ExpandHfModel(checkpoint->config(), &model).ok());
    const hf::HfParameterSource source(*checkpoint);
    return Expected(model, source, prompt, tokens, sampling);
  }

  absl::Status Run(const GenerateCommandOptions& o) {
    out_.str("");
    err_.str("");
    return RunGenerateCommand(o, out_, err_);
  }

  fs::path dir_;
  std::ostringstream out_, err_;
};

TEST_F(GenerateCommandTest, PrintsTheGeneratorsIdsForAnHfCheckpoint) {
  const std::string hf = WriteHf(40);
  for (const engine::SamplingOptions& sampling :
       {engine::SamplingOptions{.temperature = 0.0},
        engine::SamplingOptions{.temperature = 0.8, .top_k = 5, .seed = 7}}) {
    GenerateCommandOptions o = Options(hf, "3, 1,4", 6);
    o.temperature = sampling.temperature;
    o.top_k = sampling.top_k;
    o.seed = sampling.seed;
    ASSERT_TRUE(Run(o).ok()) << Run(o);
    const std::vector<int64_t> want =
        ExpectedFromHf(hf, {3, 1, 4}, 6, sampling);
    ASSERT_EQ(want.size(), 6u);
    EXPECT_EQ(out_.str(), absl::StrCat(absl::StrJoin(want, ","), "\n"));
  }
}

// --prompt TEXT through the tokenizer.json beside the HF weights (its BOS
// first), the new ids decoded; --tokenizer names one elsewhere; a tokenizer
// larger than the model's vocabulary is not the model's.
TEST_F(GenerateCommandTest, PromptTextGoesThroughTheTokenizer) {
  // The model's vocabulary is the tokenizer's 261 ids.
  const std::string hf = WriteHf(261);
  tokenizer::testing::TokenizerJsonBuilder builder;
  builder.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}};
  builder.added_tokens = {{.content = "<|begin_of_text|>", .id = 260}};
  const std::string json = builder.Json().dump();
  tokenizer::testing::WriteText(hf + "/tokenizer.json", json);
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::Load(hf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ((*tok)->bos_id(), 260);
  absl::StatusOr<std::vector<int64_t>> ids = (*tok)->Encode("hello w", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // <|begin_of_text|>, "hell", "o", " w": the merges, by hand.
  ASSERT_EQ(*ids, (std::vector<int64_t>{260, 258, 'o', 259}));
  const engine::SamplingOptions greedy{.temperature = 0.0};
  const std::vector<int64_t> want = ExpectedFromHf(hf, *ids, 4, greedy);
  absl::StatusOr<std::string> text = (*tok)->Decode(want);
  ASSERT_TRUE(text.ok()) << text.status();

  GenerateCommandOptions o = Options(hf, "hello w", 4, /*text=*/true);
  o.temperature = 0.0;
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  EXPECT_EQ(out_.str(), *text + "\n");
  EXPECT_THAT(err_.str(), HasSubstr("tokenizer from " + hf));

  // The same tokenizer named explicitly, from another directory.
  const std::string elsewhere = (dir_ / "tok.json").string();
  tokenizer::testing::WriteText(elsewhere, json);
  fs::remove(hf + "/tokenizer.json");
  o.tokenizer = elsewhere;
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  EXPECT_EQ(out_.str(), *text + "\n");

  // Without one, text is refused for a vocabulary of 261.
  o.tokenizer.clear();
  absl::Status s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("needs a tokenizer"));

  // A tokenizer of 261 tokens is not a 40-token model's.
  o.source = WriteHf(40, "small");
  o.tokenizer = elsewhere;
  s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("not this model's tokenizer"));
}

// validate and the workers refuse a checkpoint holding a tensor its config
// does not explain; generate once read it all the same.
TEST_F(GenerateCommandTest, RefusesACheckpointWithAnUnexplainedTensor) {
  const std::string hf = WriteHf(40);
  const std::string weights = (fs::path(hf) / hf::kHfWeightsFile).string();
  absl::StatusOr<engine::SafetensorsReader> reader =
      engine::SafetensorsReader::Open(weights);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<engine::TensorToWrite> tensors;
  for (const engine::TensorInfo& info : reader->tensors()) {
    const std::span<const uint8_t> bytes = reader->RawBytes(info);
    tensors.push_back(
        {info.name, info.dtype, info.shape, bytes.data(), bytes.size()});
  }
  const std::vector<float> extra(4, 1.0f);
  tensors.push_back({"model.extra.weight",
                     engine::DType::kF32,
                     {4},
                     extra.data(),
                     extra.size() * sizeof(float)});
  ASSERT_TRUE(engine::WriteSafetensors(weights + ".new", tensors).ok());
  fs::rename(weights + ".new", weights);
  const absl::Status s = Run(Options(hf, "3, 1,4", 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("unexpected 1 tensor(s)"));
  EXPECT_THAT(s.message(), HasSubstr("model.extra.weight"));
}

TEST_F(GenerateCommandTest, PrintsBytesAsTextForAByteLevelModel) {
  const std::string hf = WriteHf(256);
  GenerateCommandOptions o = Options(hf, "hi", 10, /*text=*/true);
  o.seed = 3;
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  const std::vector<int64_t> want =
      ExpectedFromHf(hf, {'h', 'i'}, 10, {.seed = 3});
  EXPECT_EQ(out_.str(), absl::StrCat(BytesAsText(want), "\n"));
}

TEST(BytesAsTextTest, EscapesWhatIsNotPrintable) {
  const std::vector<int64_t> bytes = {'a', '\\', '\n', 0, 200, '\t', '~', 127};
  EXPECT_EQ(BytesAsText(bytes), "a\\\\\n\\x00\\xc8\t~\\x7f");
}

TEST(ParsePromptIdsTest, ParsesCommaSeparatedIds) {
  EXPECT_EQ(*ParsePromptIds(" 5, 17,42 "), (std::vector<int64_t>{5, 17, 42}));
  for (const char* bad : {"", "5,,6", "x", "5;6", "1.5"}) {
    absl::StatusOr<std::vector<int64_t>> r = ParsePromptIds(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--prompt-ids")) << bad;
  }
}

TEST_F(GenerateCommandTest, RefusesBadFlags) {
  const std::string hf = WriteHf(40);
  auto expect_refused = [&](const GenerateCommandOptions& o,
                            const std::string& why) {
    const absl::Status s = Run(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << why << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(why));
    EXPECT_EQ(out_.str(), "");
  };
  GenerateCommandOptions both = Options(hf, "1");
  both.prompt = "ab";
  expect_refused(both, "exactly one of --prompt");
  GenerateCommandOptions neither = Options(hf, "1");
  neither.prompt_ids.reset();
  expect_refused(neither, "exactly one of --prompt");
  expect_refused(Options(hf, "ab", 2, /*text=*/true),
                 "or token ids with --prompt-ids");
  expect_refused(Options(hf, "3,x"), "'x') is not an integer");
  expect_refused(Options(hf, "3,40"),
                 "id 40 is outside the model's vocabulary [0, 40)");
  expect_refused(Options(hf, "-1"), "id -1 is outside");
  GenerateCommandOptions with_job = Options(hf, "1");
  with_job.job = "job.yaml";
  expect_refused(with_job,
                 "--job, --set and --step are for a Conveyor checkpoint");
  GenerateCommandOptions with_set = Options(hf, "1");
  with_set.overrides = {"training.steps=2"};
  expect_refused(with_set, "--job, --set and --step are for a Conveyor");
  expect_refused(Options(hf, "1", -1), "--tokens must be >= 0");
  GenerateCommandOptions cold = Options(hf, "1");
  cold.temperature = -1;
  expect_refused(cold, "--temperature");
  GenerateCommandOptions top = Options(hf, "1");
  top.top_k = -3;
  expect_refused(top, "--top-k");
  expect_refused(Options(hf, "1", 40), "max_position_embeddings (32)");
  EXPECT_EQ(Run(Options((dir_ / "absent").string(), "1")).code(),
            absl::StatusCode::kNotFound);
}

class ConveyorCheckpointTest : public GenerateCommandTest {
 protected:
  std::string WriteJob(const std::string& name, const std::string& lr,
                       const std::string& steps = "1",
                       const std::string& model = testing_util::kLlamaModel) {
    std::ofstream(dir_ / "tokens.bin") << std::string(100, 'a');
    const std::string yaml =
        absl::StrCat("name: llama\n", model,
                     "data: {source: tokens, path: tokens.bin, seq_len: 8}\n"
                     "training: {steps: ",
                     steps,
                     ", batch_size: 2}\n"
                     "optimizer: {kind: sgd, lr: ",
                     lr, "}\n");
    std::ofstream(dir_ / name) << yaml;
    job_yaml_ = yaml;
    return (dir_ / name).string();
  }

  // Step 3 of a two-stage job's checkpoint, committed by its manifest, with
  // random values; returns them.
  std::map<std::string, std::vector<float>> WriteCheckpoint(
      const std::string& job_path, bool record_job = false) {
    auto job = job::LoadJobSpec(job_path);
    EXPECT_TRUE(job.ok()) << job.status();
    model_ = job->model;
    std::map<std::string, std::vector<float>> values;
    for (const engine::ParamSpec* p : model_.Params()) {
      values[p->name] = Values(p->name, p->NumElements());
    }
    testing_util::WriteCommittedStep(ckpt(), model_, 3,
                                     job::JobConfigHash(job_yaml_), values,
                                     record_job ? job_yaml_ : "");
    return values;
  }

  std::string ckpt() const { return (dir_ / "ckpt").string(); }

  std::string job_yaml_;
  engine::ModelSpec model_;
};

TEST_F(ConveyorCheckpointTest, PrintsTheGeneratorsIdsWithTheJobThatWroteIt) {
  const std::string job = WriteJob("job.yaml", "0.1");
  const MapSource source(WriteCheckpoint(job));
  GenerateCommandOptions o = Options(ckpt(), "7,8", 5);
  o.job = job;
  o.temperature = 0.7;
  o.seed = 11;
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  const std::vector<int64_t> want =
      Expected(model_, source, {7, 8}, 5, {.temperature = 0.7, .seed = 11});
  EXPECT_EQ(out_.str(), absl::StrCat(absl::StrJoin(want, ","), "\n"));
  o.step = 3;
  ASSERT_TRUE(Run(o).ok());
  EXPECT_EQ(out_.str(), absl::StrCat(absl::StrJoin(want, ","), "\n"));
}

TEST_F(ConveyorCheckpointTest, RefusesAMissingOrAnotherJob) {
  WriteCheckpoint(WriteJob("job.yaml", "0.1"));
  GenerateCommandOptions o = Options(ckpt(), "7,8");
  absl::Status s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--job JOB.yaml"));
  // Another learning rate: the same tensors, but not this checkpoint's job.
  o.job = WriteJob("other.yaml", "0.2");
  s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not the job that wrote this "
                                     "checkpoint"));
  EXPECT_EQ(out_.str(), "");
}

// The README's path after `run --steps`: the checkpoint's manifest records
// its job, so generate needs no --job; the job file itself, whose
// training.steps differs, gives the same tokens with a note; a job of
// another model is refused naming the key; --set applies, within the model
// it may not change.
TEST_F(ConveyorCheckpointTest, UsesTheRecordedJobOrOneOfTheSameModel) {
  const std::string job = WriteJob("job.yaml", "0.1");
  const MapSource source(WriteCheckpoint(job, /*record_job=*/true));
  const std::vector<int64_t> want =
      Expected(model_, source, {7, 8}, 5, {.temperature = 0.7, .seed = 11});
  const std::string printed = absl::StrCat(absl::StrJoin(want, ","), "\n");
  GenerateCommandOptions o = Options(ckpt(), "7,8", 5);
  o.temperature = 0.7;
  o.seed = 11;
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  EXPECT_EQ(out_.str(), printed);

  o.job = WriteJob("longer.yaml", "0.1", /*steps=*/"60");
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  EXPECT_EQ(out_.str(), printed);
  EXPECT_THAT(err_.str(),
              HasSubstr("longer.yaml differs from the job that wrote the "
                        "checkpoint only outside its model (training.steps)"));

  std::string wide_model = testing_util::kLlamaModel;
  wide_model.replace(wide_model.find("mlp_features: 24"), 16,
                     "mlp_features: 32");
  o.job = WriteJob("wide.yaml", "0.1", "1", wide_model);
  absl::Status s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("model.layers[1].llama_block.mlp_features differs "
                        "(24 in the checkpoint, 32 in this job)"));
  EXPECT_EQ(out_.str(), "");

  o.job.clear();
  o.overrides = {"training.steps=9", "optimizer.lr=0.5"};
  ASSERT_TRUE(Run(o).ok()) << Run(o);
  EXPECT_EQ(out_.str(), printed);
  o.overrides = {"model.layers.0.embedding.vocab_size=41"};
  s = Run(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--set changes the model of the job "
                                     "recorded in"));
  EXPECT_THAT(s.message(), HasSubstr("model.layers[0].embedding.vocab_size"));
}

}  // namespace
}  // namespace conveyor::cli
