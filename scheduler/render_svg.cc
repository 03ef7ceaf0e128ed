#include "scheduler/render_svg.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "scheduler/svg_text.h"

namespace conveyor::scheduler {
namespace {

constexpr int kMargin = 10;
constexpr int kTitleHeight = 32;  // Title baseline at 22, plot below it.
constexpr int kAxisHeight = 34;   // Axis line, ticks and their labels.
constexpr int kLegendRowHeight = 20;
constexpr double kRankCharWidth = 7.0;    // 12 px sans-serif, generous.
constexpr double kLegendCharWidth = 6.2;  // 11 px sans-serif.
constexpr double kTitleCharWidth = 8.5;   // 14 px bold sans-serif.
constexpr double kDigitWidth = 0.62;  // Digit advance / font size, generous.
constexpr int kMinLabelFont = 7;      // Smaller numbers are unreadable.
constexpr int kMaxLabelFont = 12;

constexpr std::array<Op, 4> kOps = {Op::kForward, Op::kBackward,
                                    Op::kBackwardInput, Op::kBackwardWeight};

struct Rgb {
  double r, g, b;
};

// Base colours: Tableau-like hues that stay distinct for the common forms of
// colour blindness (blue against orange is the safest pair, so the forward
// and the full backward get those).
Rgb BaseColour(Op op) {
  switch (op) {
    case Op::kForward:
      return {0x4c, 0x78, 0xa8};  // Blue.
    case Op::kBackward:
      return {0xf5, 0x85, 0x18};  // Orange.
    case Op::kBackwardInput:
      return {0x54, 0xa2, 0x4b};  // Green.
    case Op::kBackwardWeight:
      return {0xb2, 0x79, 0xa2};  // Purple.
  }
  return {0x80, 0x80, 0x80};
}

absl::string_view OpDescription(Op op) {
  switch (op) {
    case Op::kForward:
      return "forward";
    case Op::kBackward:
      return "backward";
    case Op::kBackwardInput:
      return "backward, input grad";
    case Op::kBackwardWeight:
      return "backward, weight grad";
  }
  return "?";
}

Rgb Mix(Rgb a, Rgb b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

// Chunk 0 is the base colour lightened, chunk V-1 the base darkened, and the
// chunks between step evenly, so "later chunk" reads as "darker" at a glance.
Rgb ChunkColour(Op op, int chunk, int chunks) {
  const Rgb base = BaseColour(op);
  if (chunks <= 1) return base;
  const Rgb light = Mix(base, {255, 255, 255}, 0.5);
  const Rgb dark = Mix(base, {0, 0, 0}, 0.35);
  return Mix(light, dark, static_cast<double>(chunk) / (chunks - 1));
}

std::string Hex(Rgb c) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "#";
  for (double v : {c.r, c.g, c.b}) {
    const int byte = std::clamp(static_cast<int>(std::lround(v)), 0, 255);
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 15]);
  }
  return out;
}

// White numbers on dark boxes, black on light ones.
bool IsDark(Rgb c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b < 140; }

std::string Num(double v) { return scheduler::SvgNumber(v); }
std::string Escape(absl::string_view text) {
  return scheduler::SvgEscape(text);
}

// Time as text: integers exactly, doubles to six significant digits.
template <typename T>
std::string TimeText(T t) {
  return absl::StrCat(t);
}

// A 1, 2 or 5 times a power of ten step giving about eight ticks, whole for
// integer time.
template <typename T>
double TickStep(double makespan) {
  if (!(makespan > 0)) return 1;
  const double raw = makespan / 8;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
  if (std::is_integral_v<T>) step = std::max(1.0, std::round(step));
  return step;
}

int ChunkOf(const Schedule& s, const Action& a) {
  if (s.ranks <= 0) return 0;
  return std::clamp(a.stage / s.ranks, 0, std::max(0, s.virtual_stages - 1));
}

std::string ClassName(Op op, int chunk) {
  return absl::StrCat(OpName(op), chunk);
}

}  // namespace

template <typename T>
std::string RenderSvg(const Schedule& schedule,
                      const SimulationResult<T>& result,
                      const SvgOptions& options) {
  const int width = std::max(options.width, 100);
  const int row_height = std::max(options.row_height, 2);
  const int ranks = static_cast<int>(schedule.actions.size());
  const int chunks = std::max(schedule.virtual_stages, 1);
  // A non-finite or negative makespan (a broken result) draws as empty rather
  // than producing NaN coordinates or an endless tick loop.
  double makespan = static_cast<double>(result.makespan);
  if (!std::isfinite(makespan) || makespan < 0) makespan = 0;
  const double scale = makespan > 0 ? width / makespan : 0;

  // Geometry. The rank labels are right-aligned against the plot.
  const int rank_font = std::clamp(row_height - 4, 6, 12);
  const int label_chars =
      static_cast<int>(absl::StrCat("rank ", std::max(ranks - 1, 0)).size());
  const double x0 =
      kMargin + std::ceil(label_chars * kRankCharWidth * rank_font / 12) + 8;
  const int plot_top = kTitleHeight;
  const int gap = row_height >= 12 ? 2 : row_height >= 6 ? 1 : 0;
  const int box_height = row_height - 2 * gap;
  const int label_font = std::min(box_height - 4, kMaxLabelFont);
  const int axis_y = plot_top + ranks * row_height + 2;

  // Title line.
  std::string title;
  if (!options.title.empty()) absl::StrAppend(&title, options.title, ": ");
  const double bubble = result.bubble_fraction();
  // Commas, not runs of spaces: SVG collapses whitespace in text.
  absl::StrAppend(&title, ScheduleKindName(schedule.kind),
                  ", P=", schedule.ranks, " V=", schedule.virtual_stages,
                  " M=", schedule.microbatches, ", makespan ",
                  TimeText(result.makespan), ", bubble ",
                  std::isfinite(bubble) ? absl::StrCat(Num(bubble * 100), "%")
                                        : std::string("n/a"));
  // Wide enough for the title too, so a narrow timeline does not clip it.
  const double total_width =
      std::max(x0 + width + 2 * kMargin,
               2 * kMargin + std::ceil(title.size() * kTitleCharWidth));

  // Which ops and chunks appear: the style sheet defines only the classes in
  // use (V comes from the caller and may be large), the legend only the ops.
  std::set<std::pair<Op, int>> used_classes;
  std::array<bool, kOps.size()> used{};
  for (const auto& program : schedule.actions) {
    for (const Action& a : program) {
      used_classes.emplace(a.op, ChunkOf(schedule, a));
      used[static_cast<size_t>(a.op)] = true;
    }
  }

  // Legend layout, wrapped to the drawing width.
  struct LegendItem {
    Op op;
    double x;
    int row;
  };
  std::vector<LegendItem> legend;
  const int swatches = std::min(chunks, 8);  // Chunks shown per op in legend.
  const double swatch_width = chunks > 1 ? 8 : 12;
  double legend_x = kMargin;
  int legend_rows = 1;
  auto place = [&](double item_width) {
    if (legend_x > kMargin && legend_x + item_width > total_width - kMargin) {
      legend_x = kMargin;
      ++legend_rows;
    }
    const double x = legend_x;
    legend_x += item_width + 18;
    return x;
  };
  for (Op op : kOps) {
    if (!used[static_cast<size_t>(op)]) continue;
    const std::string text = absl::StrCat(OpName(op), " ", OpDescription(op));
    const double item_width =
        swatches * swatch_width + 6 + text.size() * kLegendCharWidth;
    const double x = place(item_width);
    legend.push_back({op, x, legend_rows - 1});
  }
  const std::string chunk_note =
      chunks > 1 ? absl::StrCat("shade: virtual chunk 0 (light) to ",
                                chunks - 1, " (dark)")
                 : "";
  const std::string gap_note = "blank: idle (bubble)";
  double chunk_note_x = 0, gap_note_x = 0;
  int chunk_note_row = 0, gap_note_row = 0;
  if (!chunk_note.empty()) {
    chunk_note_x = place(chunk_note.size() * kLegendCharWidth);
    chunk_note_row = legend_rows - 1;
  }
  gap_note_x = place(gap_note.size() * kLegendCharWidth);
  gap_note_row = legend_rows - 1;
  const int legend_top = axis_y + kAxisHeight;
  const double total_height = legend_top + legend_rows * kLegendRowHeight + 4;

  const bool tooltips = options.tooltips &&
                        schedule.TotalActions() <= options.max_tooltip_actions;

  std::string out;
  // Roughly 64 bytes per box, double with tooltips.
  out.reserve(4096 + schedule.TotalActions() * (tooltips ? 128 : 64));

  absl::StrAppend(&out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" ",
                  "width=\"", Num(total_width), "\" height=\"",
                  Num(total_height), "\" viewBox=\"0 0 ", Num(total_width), " ",
                  Num(total_height), "\">\n");

  // Shared styling in one sheet rather than per element: it is most of the
  // bytes when every box repeats it.
  absl::StrAppend(&out, "<style>\n", "text{font-family:sans-serif;fill:#222}\n",
                  ".title{font-size:14px;font-weight:bold}\n",
                  ".rank{font-size:", rank_font, "px;text-anchor:end}\n",
                  ".mb{font-size:", std::max(label_font, 1),
                  "px;text-anchor:middle}\n", ".mb.dark{fill:#fff}\n",
                  ".tick{font-size:11px;text-anchor:middle}\n",
                  ".legend{font-size:11px}\n");
  for (const auto& [op, chunk] : used_classes) {
    absl::StrAppend(&out, ".", ClassName(op, chunk),
                    "{fill:", Hex(ChunkColour(op, chunk, chunks)), "}\n");
  }
  absl::StrAppend(&out, "</style>\n");
  absl::StrAppend(&out,
                  "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n");

  absl::StrAppend(&out, "<text class=\"title\" x=\"", kMargin, "\" y=\"22\">",
                  Escape(title), "</text>\n");

  // One group per rank: its label, then a box (and maybe a number) per action.
  for (int r = 0; r < ranks; ++r) {
    const int row_y = plot_top + r * row_height;
    const int box_y = row_y + gap;
    absl::StrAppend(&out, "<g id=\"rank-", r, "\">\n<text class=\"rank\" x=\"",
                    Num(x0 - 6), "\" y=\"",
                    Num(row_y + row_height / 2.0 + rank_font * 0.35),
                    "\">rank ", r, "</text>\n");
    const auto& program = schedule.actions[r];
    const size_t drawn =
        r < static_cast<int>(result.timings.size())
            ? std::min(program.size(), result.timings[r].size())
            : 0;
    for (size_t i = 0; i < drawn; ++i) {
      const Action& action = program[i];
      const ActionTiming<T>& timing = result.timings[r][i];
      const double x = x0 + static_cast<double>(timing.start) * scale;
      const double w =
          std::max(0.0, static_cast<double>(timing.end - timing.start) * scale);
      const int chunk = ChunkOf(schedule, action);
      absl::StrAppend(&out, "<rect class=\"", ClassName(action.op, chunk),
                      "\" x=\"", Num(x), "\" y=\"", box_y, "\" width=\"",
                      Num(w), "\" height=\"", box_height, "\"");
      if (tooltips) {
        absl::StrAppend(&out, "><title>", Escape(ToString(action)), ": ",
                        TimeText(timing.start), " to ", TimeText(timing.end),
                        "</title></rect>\n");
      } else {
        absl::StrAppend(&out, "/>\n");
      }
      // The number only where it fits with a little padding; otherwise it
      // would spill over neighbours and make a dense schedule unreadable.
      const std::string number = absl::StrCat(action.microbatch);
      if (label_font >= kMinLabelFont &&
          w >= number.size() * kDigitWidth * label_font + 4) {
        const bool dark = IsDark(ChunkColour(action.op, chunk, chunks));
        absl::StrAppend(&out, "<text class=\"mb", dark ? " dark" : "",
                        "\" x=\"", Num(x + w / 2), "\" y=\"",
                        Num(box_y + box_height / 2.0 + label_font * 0.35),
                        "\">", number, "</text>\n");
      }
    }
    absl::StrAppend(&out, "</g>\n");
  }

  // Time axis with "nice" ticks (0, step, 2 step, ...).
  absl::StrAppend(&out, "<g id=\"axis\">\n<line x1=\"", Num(x0), "\" y1=\"",
                  axis_y, "\" x2=\"", Num(x0 + width), "\" y2=\"", axis_y,
                  "\" stroke=\"#222\"/>\n");
  const double step = TickStep<T>(makespan);
  for (int k = 0; k <= 100; ++k) {
    const double t = k * step;
    if (t > makespan * (1 + 1e-9) || (k > 0 && makespan == 0)) break;
    const double x = x0 + t * scale;
    const std::string label = std::is_integral_v<T>
                                  ? absl::StrCat(static_cast<int64_t>(t))
                                  : absl::StrCat(t);
    absl::StrAppend(&out, "<line x1=\"", Num(x), "\" y1=\"", axis_y, "\" x2=\"",
                    Num(x), "\" y2=\"", axis_y + 5,
                    "\" stroke=\"#222\"/><text class=\"tick\" x=\"", Num(x),
                    "\" y=\"", axis_y + 17, "\">", Escape(label), "</text>\n");
  }
  absl::StrAppend(&out, "<text class=\"tick\" x=\"", Num(x0 + width / 2.0),
                  "\" y=\"", axis_y + 31, "\">",
                  Escape(options.time_unit.empty()
                             ? std::string("time")
                             : absl::StrCat("time (", options.time_unit, ")")),
                  "</text>\n</g>\n");

  // Legend: a swatch per op (one per chunk shade with V > 1), then notes.
  absl::StrAppend(&out, "<g id=\"legend\">\n");
  auto legend_y = [&](int row) { return legend_top + row * kLegendRowHeight; };
  for (const LegendItem& item : legend) {
    double x = item.x;
    for (int s = 0; s < swatches; ++s) {
      // Spread the shown shades over all chunks when V > 8.
      const int chunk =
          swatches > 1
              ? static_cast<int>(int64_t{s} * (chunks - 1) / (swatches - 1))
              : 0;
      // An inline fill, not a class: the chunk may be unused, and only
      // action boxes carry classes (tests count them by it).
      absl::StrAppend(&out, "<rect fill=\"",
                      Hex(ChunkColour(item.op, chunk, chunks)), "\" x=\"",
                      Num(x), "\" y=\"", legend_y(item.row), "\" width=\"",
                      Num(swatch_width), "\" height=\"12\"/>\n");
      x += swatch_width;
    }
    absl::StrAppend(
        &out, "<text class=\"legend\" x=\"", Num(x + 6), "\" y=\"",
        legend_y(item.row) + 10, "\">",
        Escape(absl::StrCat(OpName(item.op), " ", OpDescription(item.op))),
        "</text>\n");
  }
  if (!chunk_note.empty()) {
    absl::StrAppend(&out, "<text class=\"legend\" x=\"", Num(chunk_note_x),
                    "\" y=\"", legend_y(chunk_note_row) + 10, "\">",
                    Escape(chunk_note), "</text>\n");
  }
  absl::StrAppend(&out, "<text class=\"legend\" x=\"", Num(gap_note_x),
                  "\" y=\"", legend_y(gap_note_row) + 10, "\">",
                  Escape(gap_note), "</text>\n</g>\n</svg>\n");
  return out;
}

template std::string RenderSvg(const Schedule&,
                               const SimulationResult<int64_t>&,
                               const SvgOptions&);
template std::string RenderSvg(const Schedule&, const SimulationResult<double>&,
                               const SvgOptions&);

}  // namespace conveyor::scheduler
