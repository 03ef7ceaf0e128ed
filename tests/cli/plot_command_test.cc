#include "cli/plot_command.h"

#include <sys/stat.h>
#include <sys/types.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "cli/metrics_history.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/cli/fake_coordinator.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Six steps. Step 4 ran twice: its first run (loss 9, the largest loss in
// the file) was lost in a restart and run again with loss 2, so the drawn
// maximum is step 2's 4.0 and the minimum step 6's 1.2. Steps 3 and 5 have
// an evaluation. grad_norm is present only from the restart on (an older
// coordinator's lines lack it); the line after the restart has fields this
// reader does not know.
constexpr char kHistory[] =
    R"({"step":1,"time_unix_ms":1000,"restarts":0,"loss":3.0,"learning_rate":0.0003,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":20000,"bubble_fraction":0.2}
{"step":2,"time_unix_ms":2000,"restarts":0,"loss":4.0,"learning_rate":0.0003,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":21000,"bubble_fraction":0.2}
{"step":3,"time_unix_ms":3000,"restarts":0,"loss":2.5,"learning_rate":0.0003,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":22000,"bubble_fraction":0.2,"eval_loss":2.8,"eval_perplexity":16.4}
{"step":4,"time_unix_ms":4000,"restarts":0,"loss":9.0,"learning_rate":0.0003,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":23000,"bubble_fraction":0.2}
{"step":4,"time_unix_ms":9000,"restarts":1,"loss":2.0,"learning_rate":0.0002,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":23000,"bubble_fraction":0.2,"grad_norm":1.5,"mfu":0.31,"receive_wait_fraction":0.1,"something_new":{"a":[1,2]}}
{"step":5,"time_unix_ms":10000,"restarts":1,"loss":1.5,"learning_rate":0.0001,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":24000,"bubble_fraction":0.2,"eval_loss":2.1,"eval_perplexity":8.2,"grad_norm":1.1}
{"step":6,"time_unix_ms":11000,"restarts":1,"loss":1.2,"learning_rate":0.0001,"step_seconds":0.5,"samples_per_second":16,"tokens_per_second":25000,"bubble_fraction":0.2,"grad_norm":0.9}
)";

// gmock's string matchers here take std::string, not absl::string_view.
std::string Msg(const absl::Status& status) {
  return std::string(status.message());
}

struct Point {
  double x, y;
};

struct Rect {
  double x, y, width, height;
};

// The part of the SVG that draws panel `id`: from its <g> to the next
// panel's or the step axis's.
std::string PanelText(const std::string& svg, const std::string& id) {
  const size_t begin = svg.find(absl::StrCat("<g id=\"panel-", id, "\">"));
  if (begin == std::string::npos) return "";
  size_t end = svg.find("<g id=\"panel-", begin + 1);
  if (end == std::string::npos) end = svg.find("<g id=\"axis\">", begin);
  return svg.substr(begin, end - begin);
}

std::vector<std::string> PanelIds(const std::string& svg) {
  std::vector<std::string> ids;
  const std::regex re("<g id=\"panel-([a-z-]+)\">");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re);
       it != std::sregex_iterator(); ++it) {
    ids.push_back((*it)[1]);
  }
  return ids;
}

Rect PlotRect(const std::string& panel) {
  std::smatch m;
  const std::regex re(
      "<rect class=\"plot\" x=\"([-0-9.]+)\" y=\"([-0-9.]+)\" "
      "width=\"([0-9.]+)\" height=\"([0-9.]+)\"");
  EXPECT_TRUE(std::regex_search(panel, m, re)) << panel;
  if (m.empty()) return {0, 0, 0, 0};
  return {std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), std::stod(m[4])};
}

// The vertices of series `id` and how many segments ("M") it has.
std::vector<Point> SeriesPoints(const std::string& panel, const std::string& id,
                                int* segments = nullptr) {
  std::smatch m;
  const std::regex path_re(absl::StrCat("<path class=\"series\" id=\"series-",
                                        id, "\"[^>]* d=\"([^\"]*)\""));
  if (!std::regex_search(panel, m, path_re)) return {};
  const std::string d = m[1];
  std::vector<Point> points;
  const std::regex vertex_re("([ML])(-?[0-9.]+),(-?[0-9.]+)");
  int moves = 0;
  for (auto it = std::sregex_iterator(d.begin(), d.end(), vertex_re);
       it != std::sregex_iterator(); ++it) {
    moves += (*it)[1] == "M";
    points.push_back({std::stod((*it)[2]), std::stod((*it)[3])});
  }
  if (segments != nullptr) *segments = moves;
  return points;
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

std::vector<std::string> YTickLabels(const std::string& panel) {
  std::vector<std::string> labels;
  const std::regex re("<text class=\"ytick\"[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(panel.begin(), panel.end(), re);
       it != std::sregex_iterator(); ++it) {
    labels.push_back((*it)[1]);
  }
  return labels;
}

class PlotCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / "plot_command_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  std::string Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  std::string Render(const std::string& text, PlotSvgOptions options = {}) {
    absl::StatusOr<MetricsHistory> history =
        ParseMetricsHistory(text, "metrics.jsonl");
    EXPECT_TRUE(history.ok()) << history.status();
    if (!history.ok()) return "";
    absl::StatusOr<std::string> svg = RenderMetricsSvg(*history, options);
    EXPECT_TRUE(svg.ok()) << svg.status();
    return svg.ok() ? *svg : "";
  }

  fs::path dir_;
};

TEST_F(PlotCommandTest, ParseKeepsTheLastLineOfEachStep) {
  absl::StatusOr<MetricsHistory> history =
      ParseMetricsHistory(kHistory, "m.jsonl");
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->points.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(history->points[i].step, i + 1);
  const MetricsPoint& step4 = history->points[3];
  EXPECT_EQ(step4.loss, 2.0);
  EXPECT_EQ(step4.restarts, 1);
  EXPECT_EQ(step4.line, 5);
  EXPECT_EQ(step4.grad_norm, 1.5);
  EXPECT_EQ(step4.mfu, 0.31);
  EXPECT_EQ(step4.receive_wait_fraction, 0.1);
  EXPECT_FALSE(history->points[0].grad_norm.has_value());
  EXPECT_FALSE(history->points[0].eval_loss.has_value());
  EXPECT_EQ(history->points[2].eval_loss, 2.8);
  EXPECT_EQ(history->superseded_lines, 1);
  EXPECT_EQ(history->max_restarts, 1);
  EXPECT_TRUE(history->warnings.empty());
}

TEST_F(PlotCommandTest, NullIsNoValue) {
  // nlohmann-json writes a NaN loss as null.
  absl::StatusOr<MetricsHistory> history = ParseMetricsHistory(
      "{\"step\":1,\"loss\":null,\"learning_rate\":0.1}\n", "m.jsonl");
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_FALSE(history->points[0].loss.has_value());
  EXPECT_EQ(history->points[0].learning_rate, 0.1);
}

TEST_F(PlotCommandTest, LossSeriesFollowsTheStepsAndFillsThePanel) {
  const std::string svg = Render(kHistory);
  const std::string panel = PanelText(svg, "loss");
  ASSERT_FALSE(panel.empty()) << svg;
  const Rect plot = PlotRect(panel);
  const std::vector<Point> loss = SeriesPoints(panel, "loss");
  ASSERT_EQ(loss.size(), 6u) << panel;
  // Monotone in x, at the steps' positions: 1 at the left edge, 6 at the
  // right.
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_NEAR(loss[i].x, plot.x + i * plot.width / 5, 0.01) << i;
    if (i > 0) {
      EXPECT_GT(loss[i].x, loss[i - 1].x);
    }
  }
  // Step 2's 4.0 is the largest drawn loss (step 4's superseded 9.0 is not
  // drawn): at the top of the plot area; step 6's 1.2 at the bottom.
  EXPECT_NEAR(loss[1].y, plot.y, 0.01);
  EXPECT_NEAR(loss[5].y, plot.y + plot.height, 0.01);
  for (const Point& p : loss) {
    EXPECT_GE(p.y, plot.y - 0.01);
    EXPECT_LE(p.y, plot.y + plot.height + 0.01);
  }
  // The repeated step has the value of its last line, 2.0.
  EXPECT_NEAR(loss[3].y, plot.y + (4.0 - 2.0) / (4.0 - 1.2) * plot.height,
              0.01);
}

TEST_F(PlotCommandTest, EvalLossHasAMarkerPerEvalPoint) {
  const std::string panel = PanelText(Render(kHistory), "loss");
  const Rect plot = PlotRect(panel);
  EXPECT_EQ(Count(panel, "<circle class=\"marker\""), 2);
  const std::vector<Point> eval = SeriesPoints(panel, "eval-loss");
  ASSERT_EQ(eval.size(), 2u);
  // Steps 3 and 5, on the same value scale as the training loss.
  EXPECT_NEAR(eval[0].x, plot.x + 2 * plot.width / 5, 0.01);
  EXPECT_NEAR(eval[1].x, plot.x + 4 * plot.width / 5, 0.01);
  EXPECT_NEAR(eval[0].y, plot.y + (4.0 - 2.8) / (4.0 - 1.2) * plot.height,
              0.01);
  EXPECT_THAT(panel, HasSubstr("<title>step 5: eval loss 2.1</title>"));
  EXPECT_THAT(panel, HasSubstr(">eval loss</text>"));  // Legend.
}

TEST_F(PlotCommandTest, PanelsShareTheStepAxis) {
  const std::string svg = Render(kHistory);
  EXPECT_THAT(PanelIds(svg),
              ElementsAre("loss", "learning-rate", "throughput", "grad-norm"));
  const Rect first = PlotRect(PanelText(svg, "loss"));
  double previous_bottom = 0;
  for (const std::string& id : PanelIds(svg)) {
    const std::string panel = PanelText(svg, id);
    const Rect plot = PlotRect(panel);
    EXPECT_EQ(plot.x, first.x) << id;
    EXPECT_EQ(plot.width, first.width) << id;
    EXPECT_GT(plot.y, previous_bottom) << id;  // Stacked, not overlapping.
    previous_bottom = plot.y + plot.height;
  }
  // Series that cover every step span the full width in every panel.
  for (const auto& [panel, series] : std::map<std::string, std::string>{
           {"learning-rate", "learning-rate"},
           {"throughput", "tokens-per-second"}}) {
    const std::vector<Point> points =
        SeriesPoints(PanelText(svg, panel), series);
    ASSERT_EQ(points.size(), 6u) << series;
    EXPECT_NEAR(points.front().x, first.x, 0.01) << series;
    EXPECT_NEAR(points.back().x, first.x + first.width, 0.01) << series;
  }
  // Grad norm starts at the restart (step 4): x of step 4, not the left
  // edge.
  const std::vector<Point> grad =
      SeriesPoints(PanelText(svg, "grad-norm"), "grad-norm");
  ASSERT_EQ(grad.size(), 3u);
  EXPECT_NEAR(grad.front().x, first.x + 3 * first.width / 5, 0.01);
  // The job resumed at step 4 after its restart: marked in every panel.
  const std::regex resume_re("<line class=\"resume\" x1=\"([0-9.]+)\"");
  int resumes = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), resume_re);
       it != std::sregex_iterator(); ++it, ++resumes) {
    EXPECT_NEAR(std::stod((*it)[1]), first.x + 3 * first.width / 5, 0.01);
  }
  EXPECT_EQ(resumes, 4);
  EXPECT_EQ(Count(svg, ">restart 1</text>"), 1);
  // The step axis is labelled once, under the last panel.
  EXPECT_EQ(Count(svg, ">step</text>"), 1);
}

TEST_F(PlotCommandTest, TickLabelsAreShort) {
  const std::string svg = Render(kHistory);
  const std::vector<std::string> tokens =
      YTickLabels(PanelText(svg, "throughput"));
  ASSERT_GE(tokens.size(), 2u);
  for (const std::string& label : tokens) {
    EXPECT_THAT(label, ::testing::EndsWith("k"));  // 20000 reads "20k".
    EXPECT_LE(label.size(), 5u) << label;
  }
  const std::vector<std::string> lr =
      YTickLabels(PanelText(svg, "learning-rate"));
  ASSERT_GE(lr.size(), 2u);
  for (const std::string& label : lr) {
    EXPECT_THAT(label, ::testing::MatchesRegex("[0-9.]+e-4")) << label;
  }
  EXPECT_THAT(PanelText(svg, "throughput"), HasSubstr(">tokens / s</text>"));
}

TEST_F(PlotCommandTest, SamplesPerSecondWhenTheJobHasNoTokens) {
  const std::string svg = Render(
      "{\"step\":1,\"learning_rate\":0.1,\"samples_per_second\":30,"
      "\"tokens_per_second\":0}\n"
      "{\"step\":2,\"learning_rate\":0.1,\"samples_per_second\":32,"
      "\"tokens_per_second\":0}\n");
  // No loss and no grad norm: only the panels with values.
  EXPECT_THAT(PanelIds(svg), ElementsAre("learning-rate", "throughput"));
  const std::string panel = PanelText(svg, "throughput");
  EXPECT_EQ(SeriesPoints(panel, "samples-per-second").size(), 2u);
  EXPECT_TRUE(SeriesPoints(panel, "tokens-per-second").empty());
  EXPECT_THAT(panel, HasSubstr(">samples / s</text>"));
}

// The step line's memory peaks, in MiB: reserved drawn only where it
// differs from allocated (a GPU's caching allocator; on the CPU they match).
TEST_F(PlotCommandTest, MemoryPanelShowsThePeaksInMiB) {
  const std::string gpu = Render(
      "{\"step\":1,\"learning_rate\":0.1,"
      "\"peak_memory_allocated_bytes\":1048576,"
      "\"peak_memory_reserved_bytes\":3145728}\n"
      "{\"step\":2,\"learning_rate\":0.1,"
      "\"peak_memory_allocated_bytes\":2097152,"
      "\"peak_memory_reserved_bytes\":3145728}\n");
  EXPECT_THAT(PanelIds(gpu), ElementsAre("learning-rate", "memory"));
  const std::string panel = PanelText(gpu, "memory");
  const std::vector<Point> allocated = SeriesPoints(panel, "memory-allocated");
  ASSERT_EQ(allocated.size(), 2u);
  EXPECT_GT(allocated[0].y, allocated[1].y);  // 1 MiB below 2 MiB.
  EXPECT_EQ(SeriesPoints(panel, "memory-reserved").size(), 2u);
  EXPECT_THAT(panel, HasSubstr(">peak MiB</text>"));
  const std::string cpu = Render(
      "{\"step\":1,\"peak_memory_allocated_bytes\":1048576,"
      "\"peak_memory_reserved_bytes\":1048576}\n");
  EXPECT_TRUE(
      SeriesPoints(PanelText(cpu, "memory"), "memory-reserved").empty());
}

TEST_F(PlotCommandTest, MissingValuesBreakTheLine) {
  const std::string svg = Render(
      "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n{\"step\":3}\n"
      "{\"step\":4,\"loss\":1}\n");
  int segments = 0;
  const std::vector<Point> loss =
      SeriesPoints(PanelText(svg, "loss"), "loss", &segments);
  EXPECT_EQ(segments, 2);
  // Step 4 alone is drawn as a dot: its vertex twice.
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(loss[2].x, loss[3].x);
  EXPECT_EQ(loss[2].y, loss[3].y);
}

TEST_F(PlotCommandTest, StepRangeSelectsSteps) {
  PlotSvgOptions options;
  options.from_step = 3;
  options.to_step = 5;
  const std::string panel = PanelText(Render(kHistory, options), "loss");
  const Rect plot = PlotRect(panel);
  const std::vector<Point> loss = SeriesPoints(panel, "loss");
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_NEAR(loss.front().x, plot.x, 0.01);
  EXPECT_NEAR(loss.back().x, plot.x + plot.width, 0.01);
  // The range's values set the scale: step 3's eval loss 2.8 is the
  // largest, step 5's loss 1.5 the smallest.
  EXPECT_NEAR(loss.front().y, plot.y + (2.8 - 2.5) / (2.8 - 1.5) * plot.height,
              0.01);
  EXPECT_NEAR(loss.back().y, plot.y + plot.height, 0.01);

  absl::StatusOr<MetricsHistory> history =
      ParseMetricsHistory(kHistory, "m.jsonl");
  ASSERT_TRUE(history.ok());
  options.from_step = 10;
  options.to_step = 0;
  absl::StatusOr<std::string> none = RenderMetricsSvg(*history, options);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(none.status()), HasSubstr("has steps 1 to 6"));
}

TEST_F(PlotCommandTest, LogScaleLeavesOutNonPositiveLosses) {
  absl::StatusOr<MetricsHistory> history = ParseMetricsHistory(
      "{\"step\":1,\"loss\":100}\n{\"step\":2,\"loss\":10}\n"
      "{\"step\":3,\"loss\":1}\n{\"step\":4,\"loss\":0}\n",
      "m.jsonl");
  ASSERT_TRUE(history.ok());
  std::vector<std::string> notes;
  absl::StatusOr<std::string> svg =
      RenderMetricsSvg(*history, {.log_y = true}, &notes);
  ASSERT_TRUE(svg.ok()) << svg.status();
  EXPECT_THAT(notes, ElementsAre(HasSubstr("left out 1 loss values <= 0")));
  const std::string panel = PanelText(*svg, "loss");
  const Rect plot = PlotRect(panel);
  const std::vector<Point> loss = SeriesPoints(panel, "loss");
  ASSERT_EQ(loss.size(), 3u);
  // 100, 10, 1: evenly spaced on a log scale.
  EXPECT_NEAR(loss[0].y, plot.y, 0.01);
  EXPECT_NEAR(loss[1].y, plot.y + plot.height / 2, 0.01);
  EXPECT_NEAR(loss[2].y, plot.y + plot.height, 0.01);
  EXPECT_THAT(YTickLabels(panel), ::testing::Contains("10"));
}

TEST_F(PlotCommandTest, TitleIsEscaped) {
  PlotSvgOptions options;
  options.title = "a<b & \"c\"";
  const std::string svg = Render(kHistory, options);
  EXPECT_THAT(svg, HasSubstr("a&lt;b &amp; &quot;c&quot;: training curves"));
  EXPECT_THAT(svg, HasSubstr("1 restart"));
}

TEST_F(PlotCommandTest, MalformedLineNamesFileAndLine) {
  std::string text = kHistory;
  text.insert(text.find("{\"step\":3"), "{\"step\":2.5,\n");
  absl::StatusOr<MetricsHistory> history =
      ParseMetricsHistory(text, "ckpt/metrics.jsonl");
  EXPECT_EQ(history.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(history.status()),
              StartsWith("ckpt/metrics.jsonl:3: the line is not valid JSON"));
}

TEST_F(PlotCommandTest, BadFieldsAreErrorsNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"step\":1,\"loss\":\"high\"}\n",
       "m.jsonl:2: \"loss\" must be a number or null; got string"},
      {"{\"loss\":1}\n", "m.jsonl:2: \"step\" is missing"},
      {"{\"step\":-1}\n", "m.jsonl:2: \"step\" must be >= 0; got -1"},
      {"{\"step\":1.5}\n", "m.jsonl:2: \"step\" must be an integer"},
      {"{\"step\":1,\"restarts\":\"x\"}\n",
       "m.jsonl:2: \"restarts\" must be an integer; got string"},
      {"[1,2]\n", "m.jsonl:2: expected a JSON object; got array"},
      {"{\"step\":1,\"step\":2}\n", "m.jsonl:2: the line has duplicate key"},
  };
  for (const auto& [line, message] : cases) {
    absl::StatusOr<MetricsHistory> history =
        ParseMetricsHistory(absl::StrCat("{\"step\":0}\n", line), "m.jsonl");
    EXPECT_EQ(history.status().code(), absl::StatusCode::kInvalidArgument)
        << line;
    EXPECT_THAT(Msg(history.status()), StartsWith(message)) << line;
  }
}

TEST_F(PlotCommandTest, TruncatedLastLineIsSkippedWithAWarning) {
  std::string text = kHistory;
  text += "{\"step\":7,\"time_unix_ms\":12000,\"los";  // Killed mid-write.
  absl::StatusOr<MetricsHistory> history = ParseMetricsHistory(text, "m.jsonl");
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->points.size(), 6u);
  EXPECT_THAT(history->warnings,
              ElementsAre(StartsWith("m.jsonl:8: skipped the last line")));
  // With its newline the same line was written whole and is an error.
  EXPECT_FALSE(ParseMetricsHistory(text + "\n", "m.jsonl").ok());
}

TEST_F(PlotCommandTest, EmptyFileIsAnError) {
  const std::string path = Write("metrics.jsonl", "");
  absl::StatusOr<MetricsHistory> history = ReadMetricsHistory(path);
  EXPECT_EQ(history.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(history.status()), HasSubstr("no steps"));
  EXPECT_THAT(Msg(history.status()), HasSubstr("empty"));
  // Blank lines only: no steps either.
  EXPECT_FALSE(ParseMetricsHistory("\n\n", "m.jsonl").ok());
}

TEST_F(PlotCommandTest, DirectoryOrFifoAsTheFileIsAnErrorNotAHang) {
  const fs::path directory = dir_ / "d.jsonl";
  fs::create_directories(directory);
  absl::StatusOr<MetricsHistory> from_dir =
      ReadMetricsHistory(directory.string());
  EXPECT_EQ(from_dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(from_dir.status()), HasSubstr("not a regular file"));

  // No writer ever opens the FIFO: a blocking open would wait forever.
  const std::string fifo = (dir_ / "fifo.jsonl").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<MetricsHistory> from_fifo = ReadMetricsHistory(fifo);
  EXPECT_EQ(from_fifo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(from_fifo.status()), HasSubstr("not a regular file"));

  // Through the command: a ".jsonl" directory is taken as the file, and a
  // checkpoint directory whose metrics.jsonl is a FIFO fails the same way.
  std::ostringstream out, err;
  PlotCommandOptions o;
  o.source = directory.string();
  o.output = (dir_ / "out.svg").string();
  EXPECT_THAT(Msg(RunPlotCommand(o, out, err)),
              HasSubstr("not a regular file"));
  fs::create_directories(dir_ / "ckpt");
  ASSERT_EQ(::mkfifo((dir_ / "ckpt" / "metrics.jsonl").c_str(), 0600), 0);
  o.source = (dir_ / "ckpt").string();
  EXPECT_THAT(Msg(RunPlotCommand(o, out, err)),
              HasSubstr("not a regular file"));
  EXPECT_FALSE(fs::exists(o.output));
}

TEST_F(PlotCommandTest, CommandPlotsACheckpointDirectory) {
  const std::string path =
      Write("ckpt/metrics.jsonl", std::string(kHistory) + "{\"step\":7,\"lo");
  PlotCommandOptions o;
  o.source = fs::path(path).parent_path().string();
  o.output = (dir_ / "curves.svg").string();
  std::ostringstream out, err;
  const absl::Status status = RunPlotCommand(o, out, err);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(out.str(),
            absl::StrCat("wrote ", o.output, ": steps 1 to 6 of ", o.source,
                         " (loss, learning rate, throughput, "
                         "gradient norm)\n"));
  EXPECT_THAT(err.str(), HasSubstr(absl::StrCat("warning: ", path,
                                                ":8: skipped the last line")));
  std::ifstream in(o.output);
  std::stringstream svg;
  svg << in.rdbuf();
  EXPECT_THAT(svg.str(), StartsWith("<?xml"));
  EXPECT_THAT(svg.str(),
              HasSubstr(absl::StrCat(o.source, ": training curves")));
  EXPECT_EQ(SeriesPoints(PanelText(svg.str(), "loss"), "loss").size(), 6u);

  // "-": the SVG itself on standard output, and no summary.
  o.output = "-";
  std::ostringstream to_stdout;
  ASSERT_TRUE(RunPlotCommand(o, to_stdout, err).ok());
  EXPECT_EQ(to_stdout.str(), svg.str());
}

TEST_F(PlotCommandTest, CommandErrors) {
  std::ostringstream out, err;
  PlotCommandOptions o;
  o.output = (dir_ / "out.svg").string();

  o.source = dir_.string();  // A directory without a metrics.jsonl.
  absl::Status status = RunPlotCommand(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(status), HasSubstr("metrics.jsonl"));
  EXPECT_THAT(Msg(status), HasSubstr("checkpoint directory"));

  o.source = (dir_ / "missing" / "m.jsonl").string();
  EXPECT_EQ(RunPlotCommand(o, out, err).code(), absl::StatusCode::kNotFound);

  o.source = Write("bad.jsonl", "{\"step\":1}\nnot json\n");
  status = RunPlotCommand(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(status), StartsWith(absl::StrCat(o.source, ":2: ")));

  o.source = Write("good.jsonl", kHistory);
  o.from_step = 5;
  o.to_step = 4;
  EXPECT_EQ(RunPlotCommand(o, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  o.from_step = 0;
  o.to_step = 0;
  o.output = "";
  EXPECT_THAT(Msg(RunPlotCommand(o, out, err)), HasSubstr("--output"));
  EXPECT_FALSE(fs::exists(dir_ / "out.svg"));
}

// JOB_OR_DIR as a job id: the coordinator names the checkpoint.dir.
class PlotJobTest : public PlotCommandTest {
 protected:
  void SetUp() override {
    PlotCommandTest::SetUp();
    fake_ = std::make_unique<testing::FakeCoordinator>();
    fake_->AddWorker("w0");
    fake_->AddWorker("w1");
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(
        static_cast<v1::Coordinator::Service*>(fake_.get()));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }

  // Submits a job checkpointing to `checkpoint_dir`; returns its id.
  std::string Submit(const std::string& checkpoint_dir) {
    const std::string yaml = absl::StrCat(R"(name: tiny
model:
  input_shape: [4]
  init: {seed: 0}
  layers:
    - dense: {features: 8}
    - boundary
    - dense: {features: 4}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 6, batch_size: 8, microbatches: 2}
optimizer: {kind: sgd, lr: 0.1}
checkpoint: {dir: ")",
                                          checkpoint_dir, "\"}\n");
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
        CoordinatorClient::Create(Address(), absl::Seconds(5));
    EXPECT_TRUE(client.ok());
    v1::SubmitJobRequest request;
    request.set_yaml(yaml);
    request.set_file_name("job.yaml");
    request.set_base_dir(dir_.string());
    absl::StatusOr<v1::Job> job = (*client)->SubmitJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  int port_ = 0;
  std::unique_ptr<testing::FakeCoordinator> fake_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(PlotJobTest, PlotsTheJobsCheckpointDirectory) {
  const std::string ckpt = (dir_ / "ckpt").string();
  Write("ckpt/metrics.jsonl", kHistory);
  PlotCommandOptions o;
  o.source = Submit(ckpt);
  ASSERT_EQ(o.source, "job-1");
  o.coordinator = Address();
  o.output = "-";
  std::ostringstream out, err;
  const absl::Status status = RunPlotCommand(o, out, err);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(out.str(), HasSubstr("job-1 (tiny): training curves"));
  EXPECT_EQ(SeriesPoints(PanelText(out.str(), "loss"), "loss").size(), 6u);
}

TEST_F(PlotJobTest, SaysWhenTheFileIsNotReadableHere) {
  PlotCommandOptions o;
  o.source = Submit((dir_ / "elsewhere").string());
  o.coordinator = Address();
  o.output = (dir_ / "out.svg").string();
  std::ostringstream out, err;
  absl::Status status = RunPlotCommand(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(status), HasSubstr(absl::StrCat("job-1 (tiny)'s history is ",
                                                  (dir_ / "elsewhere").string(),
                                                  "/metrics.jsonl")));
  EXPECT_THAT(Msg(status), HasSubstr("cannot be read on this machine"));

  o.source = "job-9";
  status = RunPlotCommand(o, out, err);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(status), HasSubstr("nor a job the coordinator"));
}

}  // namespace
}  // namespace conveyor::cli
