// The windows of token streams (engine/internal/data_token_windows.h): what
// the tokens, llmc and megatron kinds share once their files are open.
#include "engine/internal/data_token_windows.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/host_upload.h"
#include "engine/internal/data_blend.h"
#include "engine/internal/data_sources.h"

namespace conveyor::engine::data_internal {
namespace {

int64_t WindowCount(const TokenComponent& c, int64_t seq_len) {
  return (c.stream.size() - 1) / seq_len;
}

class TokenWindowsSource final : public IndexedDataSource {
 public:
  TokenWindowsSource(const DataConfig& config, int64_t seq_len,
                     std::vector<TokenComponent> components,
                     std::optional<BlendSchedule> blend)
      : IndexedDataSource(
            blend.has_value() ? 0 : WindowCount(components[0], seq_len),
            config.shuffle && !blend.has_value(), config.seed),
        seq_len_(seq_len),
        documents_(config.documents),
        components_(std::move(components)),
        blend_(std::move(blend)) {
    if (blend_.has_value()) {
      for (size_t k = 0; k < components_.size(); ++k) {
        orders_.push_back(std::make_unique<SampleOrder>(
            WindowCount(components_[k], seq_len), config.shuffle, config.seed,
            absl::StrCat("data.shuffle.blend.", k, ".")));
      }
    }
  }

 protected:
  absl::StatusOr<Tensor> GatherInputs(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    RETURN_IF_ERROR(CheckFiles());
    const int64_t rows = static_cast<int64_t>(samples.size());
    std::vector<int64_t> out(rows * seq_len_);
    std::vector<int64_t> window(seq_len_ + 1);
    for (int64_t r = 0; r < rows; ++r) {
      RETURN_IF_ERROR(ReadWindow(Locate(samples[r]), window.data()));
      std::copy(window.begin(), window.end() - 1, out.begin() + r * seq_len_);
    }
    return UploadVector(backend, {rows, seq_len_}, out);
  }

  absl::StatusOr<Tensor> GatherTargets(
      Backend* backend, const std::vector<int64_t>& samples) const override {
    RETURN_IF_ERROR(CheckFiles());
    const int64_t rows = static_cast<int64_t>(samples.size());
    std::vector<int64_t> out(rows * seq_len_);
    std::vector<int64_t> window(seq_len_ + 1);
    std::vector<uint8_t> starts(seq_len_ + 1);
    for (int64_t r = 0; r < rows; ++r) {
      const Window w = Locate(samples[r]);
      RETURN_IF_ERROR(ReadWindow(w, window.data()));
      int64_t* row = out.data() + r * seq_len_;
      std::copy(window.begin() + 1, window.end(), row);
      if (documents_.eod_mask_loss) {
        DocumentStarts(w, window.data(), starts.data());
        // Target t is token t + 1; predicting it from token t crosses into
        // a new document exactly when token t + 1 starts one.
        for (int64_t t = 0; t < seq_len_; ++t) {
          if (starts[t + 1]) row[t] = kIgnoredTarget;
        }
      }
    }
    return UploadVector(backend, {rows, seq_len_}, out);
  }

  absl::StatusOr<DocumentLayout> GatherDocuments(
      const std::vector<int64_t>& samples) const override {
    if (!documents_.enabled()) return DocumentLayout{};
    RETURN_IF_ERROR(CheckFiles());
    const int64_t rows = static_cast<int64_t>(samples.size());
    DocumentLayout layout;
    layout.rows = rows;
    layout.seq_len = seq_len_;
    layout.positions.resize(rows * seq_len_);
    layout.segments.resize(rows * seq_len_);
    std::vector<int64_t> window(seq_len_ + 1);
    std::vector<uint8_t> starts(seq_len_ + 1);
    for (int64_t r = 0; r < rows; ++r) {
      const Window w = Locate(samples[r]);
      RETURN_IF_ERROR(ReadWindow(w, window.data()));
      DocumentStarts(w, window.data(), starts.data());
      int64_t position = 0;
      int32_t segment = 0;
      for (int64_t t = 0; t < seq_len_; ++t) {
        if (t > 0 && starts[t]) {
          position = 0;
          ++segment;
        }
        layout.positions[r * seq_len_ + t] =
            documents_.reset_position_ids ? position : t;
        layout.segments[r * seq_len_ + t] =
            documents_.document_mask ? segment : 0;
        ++position;
      }
    }
    return layout;
  }

 private:
  struct Window {
    size_t component = 0;
    int64_t index = 0;  // Window w covers stream tokens [w L, w L + L].
  };

  Window Locate(int64_t sample) const {
    if (!blend_.has_value()) return {0, sample};
    const auto [k, n] = blend_->Locate(sample);
    int64_t window = 0;
    orders_[k]->Samples(n, 1, &window);
    return {static_cast<size_t>(k), window};
  }

  absl::Status ReadWindow(const Window& w, int64_t* out) const {
    return components_[w.component].stream.Read(w.index * seq_len_,
                                                seq_len_ + 1, out);
  }

  // starts[t], t in [1, seq_len]: window token t begins a new document.
  void DocumentStarts(const Window& w, const int64_t* window,
                      uint8_t* starts) const {
    starts[0] = 1;
    if (documents_.eod_token >= 0) {
      // The EOD ends its document; the next token starts one.
      for (int64_t t = 1; t <= seq_len_; ++t) {
        starts[t] = window[t - 1] == documents_.eod_token;
      }
      return;
    }
    // From the .idx (CheckDocuments allows no eod_token only for megatron).
    const MegatronIndex& index = *components_[w.component].index;
    const int64_t base = w.index * seq_len_;
    const int64_t documents = index.document_count();
    int64_t d = index.DocumentAt(base);
    for (int64_t t = 1; t <= seq_len_; ++t) {
      const int64_t u = base + t;
      starts[t] = 0;
      // Past every document that starts by u; empty ones share a start.
      while (d + 1 < documents && index.DocumentStart(d + 1) <= u) {
        if (index.DocumentStart(d + 1) == u) starts[t] = 1;
        ++d;
      }
    }
  }

  absl::Status CheckFiles() const {
    for (const TokenComponent& c : components_) {
      RETURN_IF_ERROR(c.stream.file().CheckNotShrunk());
      if (c.index != nullptr) RETURN_IF_ERROR(c.index->CheckNotShrunk());
    }
    return absl::OkStatus();
  }

  const int64_t seq_len_;
  const DocumentsConfig documents_;
  const std::vector<TokenComponent> components_;
  const std::optional<BlendSchedule> blend_;
  // Blends: each data set's own order of windows. Locked inside.
  std::vector<std::unique_ptr<SampleOrder>> orders_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> CreateTokenWindows(
    const DataConfig& config, const SampleShapes& shapes,
    std::vector<TokenComponent> components) {
  const int64_t seq_len =
      config.seq_len == 0 ? shapes.input[0] : config.seq_len;
  std::optional<BlendSchedule> blend;
  if (!config.blend.empty()) {
    std::vector<double> weights;
    for (const DataBlendEntry& e : config.blend) weights.push_back(e.weight);
    ASSIGN_OR_RETURN(blend, BlendSchedule::Create(weights));
  }
  for (const TokenComponent& c : components) {
    const TokenStream& s = c.stream;
    if (s.size() < seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          s.file().path(), ": ", s.size(),
          " tokens are too few for one window of seq_len + 1 = ", seq_len + 1,
          " tokens"));
    }
    if (s.bytes() <= kFullCheckBytes) RETURN_IF_ERROR(s.CheckAll());
    if (config.documents.eod_token >= s.vocab().limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.documents.eod_token ", config.documents.eod_token,
                       " is not below ", s.vocab().what, " ", s.vocab().limit,
                       " of ", s.file().path()));
    }
    // Shuffled windows are scattered reads: read-ahead would fetch pages
    // no window wants.
    s.file().Advise(config.shuffle ? MappedFile::Access::kRandom
                                   : MappedFile::Access::kNormal);
  }
  return std::make_unique<TokenWindowsSource>(
      config, seq_len, std::move(components), std::move(blend));
}

}  // namespace conveyor::engine::data_internal
