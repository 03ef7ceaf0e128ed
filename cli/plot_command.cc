#include "cli/plot_command.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cli/internal/history_source.h"
#include "cli/internal/plot_ticks.h"
#include "common/auth_token.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "scheduler/svg_text.h"

namespace conveyor::cli {
namespace {

using plot_internal::ExplainReadError;
using plot_internal::HistorySource;
using plot_internal::LinearTicks;
using plot_internal::LocateHistory;
using plot_internal::LogTicks;
using plot_internal::NiceStep;
using plot_internal::Range;
using plot_internal::Tick;
using plot_internal::TickLabel;

// Layout, in pixels; fonts as in scheduler/render_svg.cc.
constexpr int kMargin = 10;
constexpr int kTitleBaseline = 22;
constexpr int kSummaryBaseline = 40;
constexpr int kFirstPanelTop = 52;
constexpr int kPanelHeaderHeight = 24;  // Panel name and legend.
constexpr int kPanelGap = 14;
constexpr int kAxisHeight = 44;  // Step tick labels and the axis label.
constexpr int kYLabelWidth = 20;
constexpr double kTickCharWidth = 6.6;    // 11 px sans-serif, generous.
constexpr double kLegendCharWidth = 6.2;  // 11 px sans-serif.
constexpr double kHeaderCharWidth = 7.5;  // 12 px bold sans-serif.
constexpr double kTitleCharWidth = 8.5;   // 14 px bold sans-serif.
constexpr int kMinWidth = 200;
constexpr int kMaxWidth = 20000;

// Tableau-like hues, the first two as the schedule SVG's forward and
// backward (blue against orange stays distinct for colour blindness).
constexpr char kBlue[] = "#4c78a8";
constexpr char kOrange[] = "#f58518";
constexpr char kGreen[] = "#54a24b";
constexpr char kPurple[] = "#b279a2";
constexpr char kRed[] = "#e45756";

std::string Num(double v) { return scheduler::SvgNumber(v); }
std::string Escape(absl::string_view text) {
  return scheduler::SvgEscape(text);
}

struct Series {
  std::string id;     // series-<id>
  std::string label;  // In the legend.
  const char* colour;
  // Eval points: a marker each, and connected across the steps between
  // evaluations rather than broken there.
  bool markers = false;
  // Parallel to the drawn points; nullopt where the step has no value.
  std::vector<std::optional<double>> values;
};

struct Panel {
  std::string id;  // panel-<id>
  std::string name;
  std::string y_label;
  bool log = false;
  std::vector<Series> series;
};

double ToPlot(const Panel& panel, double v) {
  return panel.log ? std::log10(v) : v;
}

// The panels the history has values for, over `points`.
std::vector<Panel> BuildPanels(const std::vector<MetricsPoint>& points,
                               bool log_y, int64_t* dropped_for_log) {
  auto series = [&](std::string id, std::string label, const char* colour,
                    std::optional<double> MetricsPoint::*member,
                    bool markers = false) {
    Series s{std::move(id), std::move(label), colour, markers, {}};
    s.values.reserve(points.size());
    for (const MetricsPoint& p : points) s.values.push_back(p.*member);
    return s;
  };
  std::vector<Panel> panels;
  Panel loss{"loss", "loss", log_y ? "loss (log scale)" : "loss", log_y, {}};
  loss.series.push_back(
      series("loss", "train loss", kBlue, &MetricsPoint::loss));
  loss.series.push_back(series("eval-loss", "eval loss", kOrange,
                               &MetricsPoint::eval_loss, /*markers=*/true));
  if (log_y) {
    for (Series& s : loss.series) {
      for (std::optional<double>& v : s.values) {
        if (v.has_value() && !(*v > 0)) {
          v.reset();
          ++*dropped_for_log;
        }
      }
    }
  }
  panels.push_back(std::move(loss));
  panels.push_back({"learning-rate",
                    "learning rate",
                    "learning rate",
                    false,
                    {series("learning-rate", "learning rate", kGreen,
                            &MetricsPoint::learning_rate)}});
  // Tokens when the job has them; the coordinator writes 0 tokens/s for
  // jobs without tokens (regression, classification).
  const bool tokens =
      std::any_of(points.begin(), points.end(), [](const MetricsPoint& p) {
        return p.tokens_per_second.has_value() && *p.tokens_per_second > 0;
      });
  panels.push_back({"throughput",
                    "throughput",
                    tokens ? "tokens / s" : "samples / s",
                    false,
                    {tokens ? series("tokens-per-second", "tokens/s", kPurple,
                                     &MetricsPoint::tokens_per_second)
                            : series("samples-per-second", "samples/s", kPurple,
                                     &MetricsPoint::samples_per_second)}});
  panels.push_back(
      {"grad-norm",
       "gradient norm",
       "grad norm (L2)",
       false,
       {series("grad-norm", "grad norm", kRed, &MetricsPoint::grad_norm)}});
  // The step's memory peak on the job's fullest device, in MiB (the step
  // line's "mem"); reserved only where a caching allocator holds more.
  Panel memory{"memory",
               "device memory",
               "peak MiB",
               false,
               {series("memory-allocated", "allocated", kBlue,
                       &MetricsPoint::peak_memory_allocated_bytes),
                series("memory-reserved", "reserved", kOrange,
                       &MetricsPoint::peak_memory_reserved_bytes)}};
  for (Series& s : memory.series) {
    for (std::optional<double>& v : s.values) {
      if (v.has_value()) *v /= 1024.0 * 1024.0;
    }
  }
  if (memory.series[0].values == memory.series[1].values) {
    memory.series.pop_back();  // The CPU: nothing cached.
  }
  panels.push_back(std::move(memory));
  // Only panels with something to draw; within them only series that have.
  std::vector<Panel> drawn;
  for (Panel& panel : panels) {
    std::erase_if(panel.series, [](const Series& s) {
      return std::none_of(s.values.begin(), s.values.end(),
                          [](const auto& v) { return v.has_value(); });
    });
    if (!panel.series.empty()) drawn.push_back(std::move(panel));
  }
  return drawn;
}

Range ValueRange(const Panel& panel) {
  Range r{std::numeric_limits<double>::infinity(),
          -std::numeric_limits<double>::infinity()};
  for (const Series& s : panel.series) {
    for (const std::optional<double>& v : s.values) {
      if (!v.has_value()) continue;
      r.lo = std::min(r.lo, ToPlot(panel, *v));
      r.hi = std::max(r.hi, ToPlot(panel, *v));
    }
  }
  if (r.hi <= r.lo) {
    // One value (a constant learning rate): a band around it, so it draws
    // as a line in the middle with ticks around it.
    const double pad =
        panel.log ? 0.05 : (r.lo != 0 ? std::abs(r.lo) * 0.1 : 1.0);
    r.lo -= pad;
    r.hi += pad;
  }
  return r;
}

struct Rendered {
  std::string svg;
  std::vector<std::string> panel_names;
  int64_t first_step = 0;
  int64_t last_step = 0;
  size_t steps = 0;
};

absl::StatusOr<Rendered> Render(const MetricsHistory& history,
                                const PlotSvgOptions& options,
                                std::vector<std::string>* notes) {
  const int width = std::clamp(options.width, kMinWidth, kMaxWidth);
  const int plot_height = std::max(options.panel_height, 60);
  const int64_t from = options.from_step;
  const int64_t to = options.to_step > 0 ? options.to_step
                                         : std::numeric_limits<int64_t>::max();
  std::vector<MetricsPoint> points;
  for (const MetricsPoint& p : history.points) {
    if (p.step >= from && p.step <= to) points.push_back(p);
  }
  if (points.empty()) {
    if (history.points.empty()) {
      return absl::InvalidArgumentError("the history has no steps");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "no steps from step ", from, " to ",
        options.to_step > 0 ? absl::StrCat("step ", options.to_step)
                            : "the end",
        "; the history has steps ", history.points.front().step, " to ",
        history.points.back().step));
  }
  int64_t dropped_for_log = 0;
  std::vector<Panel> panels =
      BuildPanels(points, options.log_y, &dropped_for_log);
  if (dropped_for_log > 0 && notes != nullptr) {
    notes->push_back(absl::StrCat("left out ", dropped_for_log,
                                  " loss values <= 0, which a log scale "
                                  "cannot show"));
  }
  if (panels.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps ", points.front().step, " to ", points.back().step,
                     " have no values to draw"));
  }

  // The shared step axis: the step range maps exactly onto the width.
  double x_lo = static_cast<double>(points.front().step);
  double x_hi = static_cast<double>(points.back().step);
  if (x_hi <= x_lo) {
    x_lo -= 1;
    x_hi += 1;
  }
  std::vector<Tick> x_ticks;
  {
    const double step =
        std::max(1.0, NiceStep((x_hi - x_lo) / std::max(2, width / 90)));
    const double first = std::ceil(x_lo / step);
    for (int k = 0; k <= 1000; ++k) {
      const double v = (first + k) * step;
      if (v > x_hi + 1e-9) break;
      x_ticks.push_back(
          {v, TickLabel(v, step, std::max(std::abs(x_lo), std::abs(x_hi)))});
    }
  }

  // Each panel's value range and ticks; the widest label sets the left
  // margin, the same for every panel so their plot areas line up.
  const int target_ticks = std::max(2, plot_height / 40);
  std::vector<Range> ranges;
  std::vector<std::vector<Tick>> y_ticks;
  size_t label_chars = 1;
  for (const Panel& panel : panels) {
    ranges.push_back(ValueRange(panel));
    y_ticks.push_back(panel.log ? LogTicks(ranges.back(), target_ticks)
                                : LinearTicks(ranges.back(), target_ticks,
                                              /*log_positions=*/false));
    for (const Tick& t : y_ticks.back()) {
      label_chars = std::max(label_chars, t.label.size());
    }
  }
  const double x0 =
      kMargin + kYLabelWidth + std::ceil(label_chars * kTickCharWidth) + 8;
  auto x_of = [&](double step) {
    return x0 + (step - x_lo) / (x_hi - x_lo) * width;
  };

  // Title and summary.
  const std::string title =
      options.title.empty() ? "training curves"
                            : absl::StrCat(options.title, ": training curves");
  std::string summary = absl::StrCat(
      "steps ", points.front().step, " to ", points.back().step, " (",
      points.size(), points.size() == 1 ? " step" : " steps", ")");
  if (history.max_restarts > 0 || history.superseded_lines > 0) {
    absl::StrAppend(&summary, ", ", history.max_restarts,
                    history.max_restarts == 1 ? " restart" : " restarts");
    if (history.superseded_lines > 0) {
      absl::StrAppend(&summary, ", ", history.superseded_lines,
                      history.superseded_lines == 1 ? " step" : " steps",
                      " run again: each step's last run is drawn");
    }
  }
  if (options.log_y) absl::StrAppend(&summary, "; loss on a log scale");

  // Restarts: where the restart count goes up from one drawn step to the
  // next, the job resumed (from a checkpoint) at that step.
  std::vector<std::pair<int64_t, int64_t>> resumes;  // step, restarts
  for (size_t i = 1; i < points.size(); ++i) {
    if (points[i].restarts > points[i - 1].restarts) {
      resumes.emplace_back(points[i].step, points[i].restarts);
    }
  }

  const int panel_stride = kPanelHeaderHeight + plot_height + kPanelGap;
  const int panels_bottom = kFirstPanelTop +
                            static_cast<int>(panels.size()) * panel_stride -
                            kPanelGap;
  const double total_height = panels_bottom + kAxisHeight;
  const double total_width = std::max(
      x0 + width + 3 * kMargin,
      2 * kMargin + std::ceil(std::max(title.size() * kTitleCharWidth,
                                       summary.size() * kLegendCharWidth)));

  std::string out;
  out.reserve(8192 + points.size() * panels.size() * 32);
  absl::StrAppend(&out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" ",
                  "width=\"", Num(total_width), "\" height=\"",
                  Num(total_height), "\" viewBox=\"0 0 ", Num(total_width), " ",
                  Num(total_height), "\">\n");
  absl::StrAppend(
      &out, "<style>\n", "text{font-family:sans-serif;fill:#222}\n",
      ".title{font-size:14px;font-weight:bold}\n",
      ".summary{font-size:11px;fill:#555}\n",
      ".panel{font-size:12px;font-weight:bold}\n",
      ".tick{font-size:11px;text-anchor:middle}\n",
      ".ytick{font-size:11px;text-anchor:end}\n",
      ".axis{font-size:12px;text-anchor:middle}\n", ".legend{font-size:11px}\n",
      ".restart{font-size:10px;fill:#888}\n",
      ".plot{fill:#fcfcfc;stroke:#bbb}\n", ".grid{stroke:#e6e6e6}\n",
      ".series{fill:none;stroke-width:1.5;stroke-linejoin:round;"
      "stroke-linecap:round}\n",
      ".marker{fill:#fff;stroke-width:1.5}\n",
      ".resume{stroke:#999;stroke-dasharray:4,3}\n", "</style>\n");
  absl::StrAppend(&out,
                  "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n");
  absl::StrAppend(&out, "<text class=\"title\" x=\"", kMargin, "\" y=\"",
                  kTitleBaseline, "\">", Escape(title), "</text>\n");
  absl::StrAppend(&out, "<text class=\"summary\" x=\"", kMargin, "\" y=\"",
                  kSummaryBaseline, "\">", Escape(summary), "</text>\n");

  Rendered rendered;
  for (size_t pi = 0; pi < panels.size(); ++pi) {
    const Panel& panel = panels[pi];
    const Range& range = ranges[pi];
    rendered.panel_names.push_back(panel.name);
    const int top = kFirstPanelTop + static_cast<int>(pi) * panel_stride;
    const double plot_top = top + kPanelHeaderHeight;
    const double plot_bottom = plot_top + plot_height;
    auto y_of = [&](double v) {
      return plot_top + (range.hi - ToPlot(panel, v)) / (range.hi - range.lo) *
                            plot_height;
    };
    absl::StrAppend(&out, "<g id=\"panel-", panel.id, "\">\n");

    // Header: the panel's name, then its legend.
    absl::StrAppend(&out, "<text class=\"panel\" x=\"", Num(x0), "\" y=\"",
                    top + 16, "\">", Escape(panel.name), "</text>\n");
    double legend_x = x0 + std::ceil(panel.name.size() * kHeaderCharWidth) + 20;
    for (const Series& s : panel.series) {
      // A lone series named as its panel needs no legend.
      if (panel.series.size() == 1 && s.label == panel.name) break;
      const double mid_y = top + 12;
      absl::StrAppend(&out, "<line x1=\"", Num(legend_x), "\" y1=\"",
                      Num(mid_y), "\" x2=\"", Num(legend_x + 20), "\" y2=\"",
                      Num(mid_y), "\" stroke=\"", s.colour,
                      "\" stroke-width=\"2\"/>\n");
      if (s.markers) {
        absl::StrAppend(&out, "<circle cx=\"", Num(legend_x + 10), "\" cy=\"",
                        Num(mid_y), "\" r=\"3\" fill=\"#fff\" stroke=\"",
                        s.colour, "\" stroke-width=\"1.5\"/>\n");
      }
      absl::StrAppend(&out, "<text class=\"legend\" x=\"", Num(legend_x + 25),
                      "\" y=\"", Num(mid_y + 4), "\">", Escape(s.label),
                      "</text>\n");
      legend_x += 25 + std::ceil(s.label.size() * kLegendCharWidth) + 16;
    }

    // Plot area, grid and ticks.
    absl::StrAppend(&out, "<rect class=\"plot\" x=\"", Num(x0), "\" y=\"",
                    Num(plot_top), "\" width=\"", width, "\" height=\"",
                    plot_height, "\"/>\n");
    for (const Tick& t : y_ticks[pi]) {
      const double y = y_of(t.value);
      absl::StrAppend(
          &out, "<line class=\"grid\" x1=\"", Num(x0), "\" y1=\"", Num(y),
          "\" x2=\"", Num(x0 + width), "\" y2=\"", Num(y), "\"/><line x1=\"",
          Num(x0 - 4), "\" y1=\"", Num(y), "\" x2=\"", Num(x0), "\" y2=\"",
          Num(y), "\" stroke=\"#222\"/><text class=\"ytick\" x=\"", Num(x0 - 7),
          "\" y=\"", Num(y + 4), "\">", Escape(t.label), "</text>\n");
    }
    for (const Tick& t : x_ticks) {
      const double x = x_of(t.value);
      absl::StrAppend(&out, "<line class=\"grid\" x1=\"", Num(x), "\" y1=\"",
                      Num(plot_top), "\" x2=\"", Num(x), "\" y2=\"",
                      Num(plot_bottom), "\"/>\n");
    }
    const double label_y = plot_top + plot_height / 2.0;
    absl::StrAppend(&out, "<text class=\"axis\" x=\"", kMargin + 12, "\" y=\"",
                    Num(label_y), "\" transform=\"rotate(-90 ", kMargin + 12,
                    " ", Num(label_y), ")\">", Escape(panel.y_label),
                    "</text>\n");
    for (const auto& [step, restarts] : resumes) {
      const double x = x_of(static_cast<double>(step));
      absl::StrAppend(&out, "<line class=\"resume\" x1=\"", Num(x), "\" y1=\"",
                      Num(plot_top), "\" x2=\"", Num(x), "\" y2=\"",
                      Num(plot_bottom), "\"/>\n");
      if (pi == 0) {
        absl::StrAppend(&out, "<text class=\"restart\" x=\"", Num(x + 3),
                        "\" y=\"", Num(plot_top + 10), "\">restart ", restarts,
                        "</text>\n");
      }
    }

    // Series, then eval markers on top of the lines.
    for (const Series& s : panel.series) {
      std::string d;
      std::string segment_start;  // The open segment's first vertex.
      int segment_points = 0;
      // A segment of one point is drawn as a dot ("Mx,yLx,y" with round
      // caps); "Mx,y" alone would draw nothing.
      auto close_segment = [&] {
        if (segment_points == 1) absl::StrAppend(&d, "L", segment_start);
        segment_points = 0;
      };
      for (size_t i = 0; i < points.size(); ++i) {
        if (!s.values[i].has_value()) {
          if (!s.markers) close_segment();
          continue;
        }
        const std::string vertex =
            absl::StrCat(Num(x_of(static_cast<double>(points[i].step))), ",",
                         Num(y_of(*s.values[i])));
        if (segment_points == 0) {
          absl::StrAppend(&d, "M", vertex);
          segment_start = vertex;
        } else {
          absl::StrAppend(&d, "L", vertex);
        }
        ++segment_points;
      }
      close_segment();
      absl::StrAppend(&out, "<path class=\"series\" id=\"series-", s.id,
                      "\" stroke=\"", s.colour, "\" d=\"", d, "\"/>\n");
    }
    for (const Series& s : panel.series) {
      if (!s.markers) continue;
      absl::StrAppend(&out, "<g id=\"markers-", s.id, "\">\n");
      for (size_t i = 0; i < points.size(); ++i) {
        if (!s.values[i].has_value()) continue;
        absl::StrAppend(
            &out, "<circle class=\"marker\" stroke=\"", s.colour, "\" cx=\"",
            Num(x_of(static_cast<double>(points[i].step))), "\" cy=\"",
            Num(y_of(*s.values[i])), "\" r=\"3\"><title>step ", points[i].step,
            ": ", Escape(s.label), " ", absl::StrCat(*s.values[i]),
            "</title></circle>\n");
      }
      absl::StrAppend(&out, "</g>\n");
    }
    absl::StrAppend(&out, "</g>\n");
  }

  // The step axis under the last panel.
  absl::StrAppend(&out, "<g id=\"axis\">\n");
  for (const Tick& t : x_ticks) {
    const double x = x_of(t.value);
    absl::StrAppend(&out, "<line x1=\"", Num(x), "\" y1=\"", panels_bottom,
                    "\" x2=\"", Num(x), "\" y2=\"", panels_bottom + 5,
                    "\" stroke=\"#222\"/><text class=\"tick\" x=\"", Num(x),
                    "\" y=\"", panels_bottom + 17, "\">", Escape(t.label),
                    "</text>\n");
  }
  absl::StrAppend(&out, "<text class=\"axis\" x=\"", Num(x0 + width / 2.0),
                  "\" y=\"", panels_bottom + 35, "\">step</text>\n</g>\n");
  absl::StrAppend(&out, "</svg>\n");

  rendered.svg = std::move(out);
  rendered.first_step = points.front().step;
  rendered.last_step = points.back().step;
  rendered.steps = points.size();
  return rendered;
}

}  // namespace

CLI::App* AddPlotCommand(CLI::App& app, PlotCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "plot",
      "Draw a job's training curves (loss, eval loss, learning rate, "
      "throughput, grad norm) from its metrics.jsonl as an SVG");
  cmd->add_option("job_or_dir", o.source,
                  "A job id (job-3; its checkpoint.dir must be readable "
                  "here), a checkpoint directory, or a metrics .jsonl file")
      ->required();
  cmd->add_option("-o,--output", o.output,
                  "SVG file to write (- for standard output)")
      ->required();
  cmd->add_option("--from-step", o.from_step,
                  "First step to draw (default: the first)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--to-step", o.to_step,
                  "Last step to draw (default: the last)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--log-y", o.log_y, "Draw the loss on a log scale");
  cmd->add_option("--width", o.width, "Pixels of the step axis")
      ->check(CLI::Range(kMinWidth, kMaxWidth))
      ->capture_default_str();
  AddCoordinatorFlags(cmd, o);
  return cmd;
}

absl::StatusOr<std::string> RenderMetricsSvg(const MetricsHistory& history,
                                             const PlotSvgOptions& options,
                                             std::vector<std::string>* notes) {
  ASSIGN_OR_RETURN(Rendered rendered, Render(history, options, notes));
  return std::move(rendered.svg);
}

absl::Status RunPlotCommand(const PlotCommandOptions& o, std::ostream& out,
                            std::ostream& err) {
  if (o.source.empty()) {
    return absl::InvalidArgumentError(
        "JOB_OR_DIR is required: a job id, a checkpoint directory or a "
        "metrics .jsonl file");
  }
  if (o.output.empty()) {
    return absl::InvalidArgumentError(
        "-o/--output is required: an SVG file, or - for standard output");
  }
  if (o.from_step < 0 || o.to_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from-step and --to-step must be >= 0; got ",
                     o.from_step, " and ", o.to_step));
  }
  if (o.to_step > 0 && o.from_step > o.to_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from-step (", o.from_step,
                     ") must not be after --to-step (", o.to_step, ")"));
  }
  if (o.width < kMinWidth || o.width > kMaxWidth) {
    return absl::InvalidArgumentError(absl::StrCat("--width must be in [",
                                                   kMinWidth, ", ", kMaxWidth,
                                                   "]; got ", o.width));
  }
  ASSIGN_OR_RETURN(HistorySource source, LocateHistory(o, err));
  // Read, then parse: only a failure to read needs explaining in terms of
  // where the file came from; a parse error names file:line already.
  absl::StatusOr<std::string> text =
      ReadFile(source.path, kMaxMetricsHistoryBytes);
  if (!text.ok()) return ExplainReadError(source, text.status());
  ASSIGN_OR_RETURN(MetricsHistory history,
                   ParseMetricsHistory(*text, source.path));
  std::vector<std::string> notes = history.warnings;
  ASSIGN_OR_RETURN(Rendered rendered, Render(history,
                                             {.title = source.title,
                                              .log_y = o.log_y,
                                              .width = o.width,
                                              .from_step = o.from_step,
                                              .to_step = o.to_step},
                                             &notes));
  for (const std::string& note : notes) {
    err << "conveyorctl: warning: " << note << "\n";
  }
  if (o.output == "-") {
    out << rendered.svg;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(WriteFileAtomically(o.output, rendered.svg));
  out << "wrote " << o.output << ": steps " << rendered.first_step << " to "
      << rendered.last_step << " of " << source.title << " ("
      << absl::StrJoin(rendered.panel_names, ", ") << ")\n";
  return absl::OkStatus();
}

}  // namespace conveyor::cli
