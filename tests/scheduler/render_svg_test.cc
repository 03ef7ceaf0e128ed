#include "scheduler/render_svg.h"

#include <cstdint>
#include <iterator>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/generators.h"
#include "scheduler/simulator.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A minimal XML checker: tags balance and nest, one root element, '<' never
// appears inside a tag, every '&' starts a known entity, and no text sits
// outside the root. Returns "" when the document passes, else the problem.
std::string CheckWellFormed(std::string_view xml) {
  auto entity_ok = [&](size_t i) {
    for (std::string_view e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
      if (xml.substr(i, e.size()) == e) return true;
    }
    return false;
  };
  std::vector<std::string> stack;
  bool root_closed = false;
  size_t i = 0;
  if (xml.substr(0, 5) == "<?xml") {
    const size_t end = xml.find("?>");
    if (end == std::string_view::npos) return "unterminated XML declaration";
    i = end + 2;
  }
  while (i < xml.size()) {
    const char c = xml[i];
    if (c == '<') {
      size_t end = i + 1;
      char quote = 0;
      for (; end < xml.size(); ++end) {
        const char d = xml[end];
        if (quote != 0) {
          if (d == quote) quote = 0;
          if (d == '<') return absl::StrCat("'<' in attribute at ", end);
          if (d == '&' && !entity_ok(end)) {
            return absl::StrCat("bad entity in attribute at ", end);
          }
        } else if (d == '"' || d == '\'') {
          quote = d;
        } else if (d == '>') {
          break;
        } else if (d == '<') {
          return absl::StrCat("'<' inside tag at ", end);
        }
      }
      if (end >= xml.size()) return "unterminated tag";
      std::string_view tag = xml.substr(i + 1, end - i - 1);
      if (root_closed) return "element after the root";
      if (!tag.empty() && tag[0] == '/') {
        const std::string name(tag.substr(1));
        if (stack.empty() || stack.back() != name) {
          return absl::StrCat("</", name, "> does not match <",
                              stack.empty() ? "" : stack.back(), ">");
        }
        stack.pop_back();
        if (stack.empty()) root_closed = true;
      } else {
        const bool self_closing = !tag.empty() && tag.back() == '/';
        const std::string name(tag.substr(0, tag.find_first_of(" /")));
        if (name.empty()) return absl::StrCat("empty tag name at ", i);
        if (!self_closing) {
          stack.push_back(name);
        } else if (stack.empty()) {
          root_closed = true;
        }
      }
      i = end + 1;
    } else {
      if (c == '&' && !entity_ok(i)) return absl::StrCat("bad entity at ", i);
      if (c == '>') return absl::StrCat("unescaped '>' in text at ", i);
      if (stack.empty() && c != '\n' && c != ' ') {
        return absl::StrCat("text outside the root at ", i);
      }
      ++i;
    }
  }
  if (!stack.empty()) return absl::StrCat("<", stack.back(), "> not closed");
  if (!root_closed) return "no root element";
  return "";
}

TEST(CheckWellFormedTest, CatchesWhatItClaimsTo) {
  EXPECT_EQ(CheckWellFormed("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t</a>\n"),
            "");
  EXPECT_NE(CheckWellFormed("<a><b></a></b>"), "");
  EXPECT_NE(CheckWellFormed("<a>"), "");
  EXPECT_NE(CheckWellFormed("<a>x & y</a>"), "");
  EXPECT_NE(CheckWellFormed("<a>x < y</a>"), "");
  EXPECT_NE(CheckWellFormed("<a t=\"<\"/>"), "");
  EXPECT_NE(CheckWellFormed("<a/><b/>"), "");
}

// The part of `svg` drawing rank r: its <g id="rank-r"> group.
std::string RankGroup(const std::string& svg, int r) {
  const std::string open = absl::StrCat("<g id=\"rank-", r, "\">");
  const size_t begin = svg.find(open);
  if (begin == std::string::npos) return "";
  return svg.substr(begin, svg.find("</g>", begin) - begin);
}

struct Box {
  std::string cls;
  double x, y, width, height;
};

std::vector<Box> Boxes(const std::string& group) {
  static const std::regex kRect(
      "<rect class=\"([A-Z]+[0-9]+)\" x=\"([^\"]+)\" y=\"([^\"]+)\" "
      "width=\"([^\"]+)\" height=\"([^\"]+)\"");
  std::vector<Box> boxes;
  for (std::sregex_iterator it(group.begin(), group.end(), kRect), end;
       it != end; ++it) {
    boxes.push_back({(*it)[1], std::stod((*it)[2]), std::stod((*it)[3]),
                     std::stod((*it)[4]), std::stod((*it)[5])});
  }
  return boxes;
}

// The microbatch numbers drawn in a group, in order.
std::vector<std::string> Labels(const std::string& group) {
  static const std::regex kLabel(
      "<text class=\"mb[^\"]*\" x=\"[^\"]+\" y=\"[^\"]+\">([^<]*)</text>");
  std::vector<std::string> labels;
  for (std::sregex_iterator it(group.begin(), group.end(), kLabel), end;
       it != end; ++it) {
    labels.push_back((*it)[1]);
  }
  return labels;
}

// The fill the style sheet gives a box class, e.g. "F0" -> "#4c78a8".
std::string Fill(const std::string& svg, const std::string& cls) {
  const std::regex fill(absl::StrCat("\\.", cls, "\\{fill:(#[0-9a-f]{6})\\}"));
  std::smatch match;
  if (!std::regex_search(svg, match, fill)) return "";
  return match[1];
}

size_t Count(std::string_view text, std::string_view needle) {
  size_t n = 0;
  for (size_t i = text.find(needle); i != std::string_view::npos;
       i = text.find(needle, i + needle.size())) {
    ++n;
  }
  return n;
}

// P=2, M=2 1F1B with F=10, B=20 and free communication, timed by hand:
//   rank 0: F0.0 [0,10)  F0.1 [10,20)  B0.0 [40,60)  B0.1 [70,90)
//   rank 1: F1.0 [10,20) B1.0 [20,40)  F1.1 [40,50)  B1.1 [50,70)
// makespan 90, busy 60 each, bubble 60 / 180.
Schedule TwoByTwo() {
  Schedule s;
  s.kind = ScheduleKind::k1F1B;
  s.ranks = 2;
  s.microbatches = 2;
  s.actions = {{{Op::kForward, 0, 0},
                {Op::kForward, 0, 1},
                {Op::kBackward, 0, 0},
                {Op::kBackward, 0, 1}},
               {{Op::kForward, 1, 0},
                {Op::kBackward, 1, 0},
                {Op::kForward, 1, 1},
                {Op::kBackward, 1, 1}}};
  return s;
}

SimulationResult<int64_t> TwoByTwoTimes() {
  SimulationResult<int64_t> r;
  r.makespan = 90;
  r.busy = {60, 60};
  r.idle = {30, 30};
  r.peak_inflight = {2, 1};
  r.peak_pending_weight_grads = {0, 0};
  r.timings = {{{0, 10}, {10, 20}, {40, 60}, {70, 90}},
               {{10, 20}, {20, 40}, {40, 50}, {50, 70}}};
  return r;
}

TEST(RenderSvgTest, IsWellFormed) {
  EXPECT_EQ(CheckWellFormed(RenderSvg(TwoByTwo(), TwoByTwoTimes())), "");
}

TEST(RenderSvgTest, OneRectPerActionAtItsScaledTime) {
  const Schedule s = TwoByTwo();
  const SimulationResult<int64_t> t = TwoByTwoTimes();
  // 900 px for a makespan of 90: 10 px per time unit.
  const std::string svg = RenderSvg(s, t, {.width = 900, .row_height = 22});
  const double x0 = Boxes(RankGroup(svg, 0)).at(0).x;  // F0.0 starts at 0.
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const std::vector<Box> boxes = Boxes(RankGroup(svg, r));
    ASSERT_EQ(boxes.size(), s.actions[r].size());
    for (size_t i = 0; i < boxes.size(); ++i) {
      SCOPED_TRACE(ToString(s.actions[r][i]));
      EXPECT_NEAR(boxes[i].x, x0 + 10.0 * t.timings[r][i].start, 0.006);
      EXPECT_NEAR(boxes[i].width,
                  10.0 * (t.timings[r][i].end - t.timings[r][i].start), 0.006);
      EXPECT_THAT(boxes[i].cls,
                  StartsWith(std::string(OpName(s.actions[r][i].op))));
      // Rows stack one row height apart, boxes inside their row.
      EXPECT_GE(boxes[i].y, boxes[0].y);
      EXPECT_LE(boxes[i].y + boxes[i].height, boxes[0].y + 22);
    }
  }
  EXPECT_DOUBLE_EQ(
      Boxes(RankGroup(svg, 1))[0].y - Boxes(RankGroup(svg, 0))[0].y, 22);
}

TEST(RenderSvgTest, IdleTimeIsLeftBlank) {
  const std::string svg =
      RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.width = 900});
  const std::vector<Box> boxes = Boxes(RankGroup(svg, 0));
  ASSERT_EQ(boxes.size(), 4u);
  const double x0 = boxes[0].x;
  // Rank 0 idles over [20, 40) and [60, 70): nothing may be drawn there.
  for (const Box& b : boxes) {
    const double lo = b.x - x0, hi = lo + b.width;
    EXPECT_FALSE(lo < 400 - 0.01 && hi > 200 + 0.01) << lo << ".." << hi;
    EXPECT_FALSE(lo < 700 - 0.01 && hi > 600 + 0.01) << lo << ".." << hi;
  }
}

TEST(RenderSvgTest, WideBoxesShowTheirMicrobatchNumberCentred) {
  const std::string svg =
      RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.width = 900});
  EXPECT_THAT(Labels(RankGroup(svg, 0)), ElementsAre("0", "1", "0", "1"));
  EXPECT_THAT(Labels(RankGroup(svg, 1)), ElementsAre("0", "0", "1", "1"));
  // F0.1 spans x0+100 .. x0+200, so its number sits at x0+150.
  const double x0 = Boxes(RankGroup(svg, 0))[0].x;
  EXPECT_THAT(RankGroup(svg, 0),
              HasSubstr(absl::StrCat("x=\"", x0 + 150, "\"")));
}

TEST(RenderSvgTest, NarrowBoxesGetNoNumber) {
  // 100 px for 90 units: F boxes are 11.1 px, too narrow for a 12 px digit
  // with padding; B boxes are 22.2 px and keep theirs.
  const std::string narrow =
      RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.width = 100});
  EXPECT_THAT(Labels(RankGroup(narrow, 0)), ElementsAre("0", "1"));
  EXPECT_EQ(Boxes(RankGroup(narrow, 0)).size(), 4u);
  // Rows too short for a readable number drop them all, boxes stay.
  const std::string flat =
      RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.width = 900, .row_height = 8});
  EXPECT_THAT(Labels(RankGroup(flat, 0)), ElementsAre());
  EXPECT_EQ(Boxes(RankGroup(flat, 0)).size(), 4u);
}

TEST(RenderSvgTest, MultiDigitNumbersNeedWiderBoxes) {
  Schedule s;
  s.ranks = 1;
  s.microbatches = 1000;
  s.actions = {{{Op::kForward, 0, 7}, {Op::kForward, 0, 123}}};
  SimulationResult<int64_t> t;
  t.makespan = 100;
  t.busy = {24};
  t.idle = {76};
  t.timings = {{{0, 12}, {50, 62}}};  // 12 px each at width 100.
  const std::string svg = RenderSvg(s, t, {.width = 100});
  // "7" fits in 12 px; "123" needs about 26 px.
  EXPECT_THAT(Labels(RankGroup(svg, 0)), ElementsAre("7"));
}

TEST(RenderSvgTest, TitleSaysWhatAndHowWell) {
  const std::string svg = RenderSvg(TwoByTwo(), TwoByTwoTimes());
  EXPECT_THAT(svg, HasSubstr(">1f1b, P=2 V=1 M=2, makespan 90, bubble "
                             "33.33%</text>"));
  EXPECT_THAT(svg, HasSubstr(">rank 0</text>"));
  EXPECT_THAT(svg, HasSubstr(">rank 1</text>"));
}

TEST(RenderSvgTest, EscapesTheUserTitle) {
  const std::string svg =
      RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.title = "<job & \"x's\">\x01"});
  EXPECT_THAT(svg,
              HasSubstr(">&lt;job &amp; &quot;x&apos;s&quot;&gt;?: 1f1b,"));
  EXPECT_THAT(svg, Not(HasSubstr("<job")));
  EXPECT_EQ(CheckWellFormed(svg), "");
}

TEST(RenderSvgTest, OpsAndChunksHaveDistinctColours) {
  Schedule s;
  s.kind = ScheduleKind::kZeroBubbleH1;
  s.ranks = 1;
  s.actions = {{{Op::kForward, 0, 0},
                {Op::kBackward, 0, 0},
                {Op::kBackwardInput, 0, 0},
                {Op::kBackwardWeight, 0, 0}}};
  SimulationResult<int64_t> t;
  t.makespan = 4;
  t.busy = {4};
  t.idle = {0};
  t.timings = {{{0, 1}, {1, 2}, {2, 3}, {3, 4}}};
  const std::string svg = RenderSvg(s, t);
  const std::vector<std::string> fills = {Fill(svg, "F0"), Fill(svg, "B0"),
                                          Fill(svg, "BI0"), Fill(svg, "BW0")};
  for (size_t i = 0; i < fills.size(); ++i) {
    ASSERT_NE(fills[i], "") << i;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(fills[i], fills[j]);
  }
  EXPECT_THAT(svg, HasSubstr(">BI backward, input grad</text>"));
  EXPECT_THAT(svg, HasSubstr(">BW backward, weight grad</text>"));
}

SimulationResult<int64_t> SimulateOrDie(const Schedule& s) {
  absl::StatusOr<SimulationResult<int64_t>> r =
      Simulate(s, SimulationCosts<int64_t>::UniformSplit(1, 1, 1));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : SimulationResult<int64_t>{};
}

TEST(RenderSvgTest, VirtualChunksAreShadedApart) {
  absl::StatusOr<Schedule> s =
      GenerateSchedule(ScheduleKind::kInterleaved1F1B,
                       {.ranks = 2, .microbatches = 4, .virtual_stages = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string svg = RenderSvg(*s, SimulateOrDie(*s));
  EXPECT_NE(Fill(svg, "F0"), "");
  EXPECT_NE(Fill(svg, "F0"), Fill(svg, "F1"));
  EXPECT_NE(Fill(svg, "B0"), Fill(svg, "B1"));
  // Stage 3 is rank 1's second chunk.
  const std::vector<Box> boxes = Boxes(RankGroup(svg, 1));
  ASSERT_EQ(boxes.size(), s->actions[1].size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Action& a = s->actions[1][i];
    EXPECT_EQ(boxes[i].cls, absl::StrCat(OpName(a.op), a.stage / 2));
  }
  EXPECT_THAT(svg, HasSubstr("shade: virtual chunk 0 (light) to 1 (dark)"));
  // Only the ops used appear in the legend.
  EXPECT_THAT(svg, HasSubstr(">F forward</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("input grad")));
}

TEST(RenderSvgTest, StyleSheetHoldsOnlyTheClassesInUse) {
  // V comes from the caller (maybe a hand-written JSON file); a huge V must
  // not mean a huge style sheet.
  Schedule s;
  s.ranks = 1;
  s.virtual_stages = 1000000;
  s.actions = {{{Op::kForward, 5, 0}}};
  SimulationResult<int64_t> t;
  t.makespan = 1;
  t.busy = {1};
  t.idle = {0};
  t.timings = {{{0, 1}}};
  const std::string svg = RenderSvg(s, t);
  EXPECT_NE(Fill(svg, "F5"), "");
  EXPECT_EQ(Fill(svg, "F0"), "");
  const std::regex box_rule("\\n\\.[A-Z]+[0-9]+\\{fill:");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(svg.begin(), svg.end(), box_rule),
                    std::sregex_iterator()),
      1);
  EXPECT_LT(svg.size(), 8000u);
  EXPECT_EQ(CheckWellFormed(svg), "");
}

TEST(RenderSvgTest, TooltipsOnlyWhenAskedAndSmall) {
  const std::string with = RenderSvg(TwoByTwo(), TwoByTwoTimes());
  EXPECT_EQ(Count(with, "<title>"), 8u);
  EXPECT_THAT(with, HasSubstr("<title>F0.1: 10 to 20</title>"));
  EXPECT_EQ(Count(RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.tooltips = false}),
                  "<title>"),
            0u);
  EXPECT_EQ(
      Count(RenderSvg(TwoByTwo(), TwoByTwoTimes(), {.max_tooltip_actions = 7}),
            "<title>"),
      0u);
}

TEST(RenderSvgTest, AxisTicksAreRoundNumbers) {
  const std::string svg = RenderSvg(TwoByTwo(), TwoByTwoTimes());
  // Makespan 90: ticks every 10, the last at 90.
  EXPECT_THAT(svg, HasSubstr("class=\"tick\""));
  EXPECT_THAT(svg, HasSubstr(">40</text>"));
  EXPECT_THAT(svg, HasSubstr(">90</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">100</text>")));
  EXPECT_EQ(Count(svg, "<text class=\"tick\""), 11u);  // 0..90 and "time".
  EXPECT_THAT(svg, HasSubstr(">time</text>"));
  // With a unit, the axis says it.
  SvgOptions options;
  options.time_unit = "ms";
  EXPECT_THAT(RenderSvg(TwoByTwo(), TwoByTwoTimes(), options),
              HasSubstr(">time (ms)</text>"));
}

TEST(RenderSvgTest, DoubleTimesScaleAndTick) {
  Schedule s;
  s.ranks = 1;
  s.actions = {{{Op::kForward, 0, 0}, {Op::kBackward, 0, 0}}};
  SimulationResult<double> t;
  t.makespan = 1.5;
  t.busy = {1.25};
  t.idle = {0.25};
  t.timings = {{{0.0, 0.5}, {0.75, 1.5}}};
  const std::string svg = RenderSvg(s, t, {.width = 600});
  const std::vector<Box> boxes = Boxes(RankGroup(svg, 0));
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_NEAR(boxes[1].x - boxes[0].x, 300, 0.006);
  EXPECT_NEAR(boxes[0].width, 200, 0.006);
  EXPECT_NEAR(boxes[1].width, 300, 0.006);
  EXPECT_THAT(svg, HasSubstr("makespan 1.5, bubble 16.67%"));
  // Steps of 0.2, printed without floating-point noise.
  EXPECT_THAT(svg, HasSubstr(">0.6</text>"));
  EXPECT_THAT(svg, HasSubstr(">1.4</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">1.6</text>")));
  EXPECT_EQ(CheckWellFormed(svg), "");
}

TEST(RenderSvgTest, MissingTimingsAreNotDrawn) {
  SimulationResult<int64_t> t = TwoByTwoTimes();
  t.timings.resize(1);
  t.timings[0].resize(3);
  const std::string svg = RenderSvg(TwoByTwo(), t);
  EXPECT_EQ(Boxes(RankGroup(svg, 0)).size(), 3u);
  EXPECT_EQ(Boxes(RankGroup(svg, 1)).size(), 0u);
  EXPECT_EQ(CheckWellFormed(svg), "");
}

TEST(RenderSvgTest, EmptyResultDoesNotDivideByZero) {
  const std::string svg = RenderSvg(TwoByTwo(), SimulationResult<int64_t>{});
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));
  EXPECT_EQ(CheckWellFormed(svg), "");
}

TEST(RenderSvgTest, IsDeterministic) {
  EXPECT_EQ(RenderSvg(TwoByTwo(), TwoByTwoTimes()),
            RenderSvg(TwoByTwo(), TwoByTwoTimes()));
}

TEST(RenderSvgTest, EveryGeneratedKindRendersEveryAction) {
  struct Case {
    ScheduleKind kind;
    ScheduleOptions options;
  };
  for (const Case& c : std::vector<Case>{
           {ScheduleKind::kGPipe, {.ranks = 4, .microbatches = 6}},
           {ScheduleKind::k1F1B, {.ranks = 4, .microbatches = 6}},
           {ScheduleKind::kInterleaved1F1B,
            {.ranks = 4, .microbatches = 8, .virtual_stages = 2}},
           {ScheduleKind::kZeroBubbleH1, {.ranks = 4, .microbatches = 6}}}) {
    SCOPED_TRACE(ScheduleKindName(c.kind));
    absl::StatusOr<Schedule> s = GenerateSchedule(c.kind, c.options);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::string svg = RenderSvg(*s, SimulateOrDie(*s));
    EXPECT_EQ(CheckWellFormed(svg), "");
    size_t boxes = 0;
    for (int r = 0; r < s->ranks; ++r) boxes += Boxes(RankGroup(svg, r)).size();
    EXPECT_EQ(boxes, s->TotalActions());
  }
}

TEST(RenderSvgTest, HugeScheduleStaysLegibleAndBounded) {
  absl::StatusOr<Schedule> s = GenerateSchedule(
      ScheduleKind::k1F1B, {.ranks = 64, .microbatches = 1024});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string svg = RenderSvg(*s, SimulateOrDie(*s));
  // Every action still has its box...
  EXPECT_EQ(Count(svg, "<rect class="), s->TotalActions());
  // ...but sub-pixel boxes carry no numbers and no tooltips,
  EXPECT_EQ(Count(svg, "<text class=\"mb"), 0u);
  EXPECT_EQ(Count(svg, "<title>"), 0u);
  // so the file stays around 60 bytes per action.
  EXPECT_LT(svg.size(), 70 * s->TotalActions());
  EXPECT_EQ(CheckWellFormed(svg), "");
}

}  // namespace
}  // namespace conveyor::scheduler
