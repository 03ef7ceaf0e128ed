#include "cli/internal/plot_ticks.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace conveyor::cli::plot_internal {

double NiceStep(double raw) {
  if (!(raw > 0) || !std::isfinite(raw)) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
}

std::string TickLabel(double v, double resolution, double magnitude) {
  if (!(resolution > 0)) resolution = std::max(std::abs(v), 1e-300);
  if (std::abs(v) < resolution * 1e-6) return "0";
  double scale = 1;
  std::string suffix;
  if (magnitude >= 1e9) {
    scale = 1e9;
    suffix = "G";
  } else if (magnitude >= 1e6) {
    scale = 1e6;
    suffix = "M";
  } else if (magnitude >= 1e4) {
    scale = 1e3;
    suffix = "k";
  } else if (magnitude > 0 && magnitude < 1e-3) {
    const int exponent = static_cast<int>(std::floor(std::log10(magnitude)));
    scale = std::pow(10.0, exponent);
    suffix = absl::StrCat("e", exponent);
  }
  const int decimals = std::clamp(
      static_cast<int>(std::ceil(-std::log10(resolution / scale) - 1e-9)), 0,
      12);
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v / scale,
                                 std::chars_format::fixed, decimals);
  if (ec != std::errc()) return absl::StrCat(v);
  std::string out(buf, end);
  // "2.50" reads as "2.5"; the digits needed are there either way.
  if (out.find('.') != std::string::npos) {
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
  }
  if (out == "-0" || out == "0") return "0";
  return out + suffix;
}

std::vector<Tick> LinearTicks(Range r, int target, bool log_positions) {
  // For a log panel whose range is too narrow for powers of ten, linear
  // ticks in data units, placed on the log scale.
  const double lo = log_positions ? std::pow(10.0, r.lo) : r.lo;
  const double hi = log_positions ? std::pow(10.0, r.hi) : r.hi;
  const double step = NiceStep((hi - lo) / std::max(target, 1));
  const double magnitude = std::max(std::abs(lo), std::abs(hi));
  std::vector<Tick> ticks;
  if (!std::isfinite(hi - lo) || (hi - lo) / step > 1000) {
    // Values near the limits of a double: just the ends.
    return {{lo, absl::StrCat(lo)}, {hi, absl::StrCat(hi)}};
  }
  const double first = std::ceil(lo / step - 1e-9);
  for (int k = 0; k <= 100; ++k) {
    const double v = (first + k) * step;
    if (v > hi + step * 1e-9) break;
    if (log_positions && !(v > 0)) continue;
    ticks.push_back({v, TickLabel(v, step, magnitude)});
  }
  return ticks;
}

std::vector<Tick> LogTicks(Range r, int target) {
  // 1, 2, 5 times powers of ten; over many decades the powers alone (every
  // k-th of them over very many); within under one decade 3 joins in.
  auto ticks = [&](std::initializer_list<double> mantissas) {
    std::vector<Tick> out;
    for (double e = std::floor(r.lo); e <= std::ceil(r.hi); ++e) {
      for (double m : mantissas) {
        const double v = m * std::pow(10.0, e);
        const double p = std::log10(v);
        if (p < r.lo - 1e-9 || p > r.hi + 1e-9) continue;
        // Each label as precise as its own decade needs.
        out.push_back({v, TickLabel(v, std::pow(10.0, e), v)});
      }
    }
    return out;
  };
  if (r.hi - r.lo > 2.0 * target) {
    std::vector<Tick> decades = ticks({1.0}), thinned;
    const size_t every = decades.size() / (2 * target) + 1;
    for (size_t i = 0; i < decades.size(); i += every) {
      thinned.push_back(decades[i]);
    }
    return thinned;
  }
  std::vector<Tick> all = ticks({1.0, 2.0, 5.0});
  if (static_cast<int>(all.size()) > 2 * target) return ticks({1.0});
  if (all.size() < 3) all = ticks({1.0, 2.0, 3.0, 5.0});
  if (all.size() >= 2) return all;
  return LinearTicks(r, target, /*log_positions=*/true);
}

}  // namespace conveyor::cli::plot_internal
