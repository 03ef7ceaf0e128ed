#include "tokenizer/parallel_encoder.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace conveyor::tokenizer {

absl::StatusOr<std::unique_ptr<ParallelEncoder>> ParallelEncoder::Create(
    const Tokenizer& tokenizer, Options options, Prepare prepare, Sink sink) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads is ", options.threads, "; at least 1"));
  }
  const std::optional<int64_t> eos = tokenizer.eos_id();
  if (!eos.has_value()) {
    return absl::FailedPreconditionError(
        "the tokenizer has no EOS (end-of-text) token to end each document "
        "with; name it in tokenizer_config.json (\"eos_token\")");
  }
  if (options.max_pending_batches <= 0) {
    options.max_pending_batches = 4 * options.threads;
  }
  auto encoder = std::unique_ptr<ParallelEncoder>(new ParallelEncoder(
      tokenizer, *eos, options, std::move(prepare), std::move(sink)));
  for (int i = 0; i < options.threads; ++i) {
    encoder->workers_.emplace_back([e = encoder.get()] { e->Work(); });
  }
  return encoder;
}

ParallelEncoder::ParallelEncoder(const Tokenizer& tokenizer, int64_t eos,
                                 Options options, Prepare prepare, Sink sink)
    : tokenizer_(tokenizer),
      eos_(eos),
      options_(options),
      prepare_(std::move(prepare)),
      sink_(std::move(sink)) {}

ParallelEncoder::~ParallelEncoder() {
  Stop();
  for (std::thread& worker : workers_) worker.join();
}

void ParallelEncoder::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  work_ready_.NotifyAll();
}

absl::Status ParallelEncoder::Submit(DocumentBatch batch) {
  if (!error_.ok()) return error_;
  {
    MutexLock lock(mu_);
    slots_.emplace(next_sequence_, Slot());
    queue_.emplace_back(next_sequence_, std::move(batch));
  }
  ++next_sequence_;
  work_ready_.NotifyOne();
  return Deliver(static_cast<size_t>(options_.max_pending_batches));
}

absl::Status ParallelEncoder::Finish() {
  if (!error_.ok()) return error_;
  return Deliver(1);
}

absl::Status ParallelEncoder::Deliver(size_t limit) {
  while (true) {
    Slot slot;
    {
      MutexLock lock(mu_);
      batch_done_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return slots_.empty() || slots_.begin()->second.done ||
               slots_.size() < limit;
      });
      if (slots_.empty() || !slots_.begin()->second.done) {
        return absl::OkStatus();
      }
      slot = std::move(slots_.begin()->second);
      slots_.erase(slots_.begin());
    }
    absl::Status status = slot.status;
    if (status.ok()) status = sink_(slot.encoded);
    if (!status.ok()) {
      error_ = status;
      Stop();
      return error_;
    }
  }
}

void ParallelEncoder::Work() {
  while (true) {
    std::pair<uint64_t, DocumentBatch> job;
    {
      MutexLock lock(mu_);
      work_ready_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    EncodedBatch encoded;
    absl::Status status;
    try {
      status = Encode(job.second, &encoded);
    } catch (const std::exception& e) {  // std::bad_alloc, on a huge batch.
      status = absl::ResourceExhaustedError(
          absl::StrCat(job.second.source, ": ", e.what()));
    }
    {
      MutexLock lock(mu_);
      const auto it = slots_.find(job.first);
      if (it != slots_.end()) {
        it->second.done = true;
        it->second.status = std::move(status);
        it->second.encoded = std::move(encoded);
      }
    }
    batch_done_.NotifyAll();
  }
}

absl::Status ParallelEncoder::Encode(DocumentBatch& batch,
                                     EncodedBatch* out) const {
  out->bytes = batch.bytes;
  out->lengths.reserve(batch.records.size());
  for (size_t i = 0; i < batch.records.size(); ++i) {
    std::string& record = batch.records[i];
    const int64_t line =
        batch.first_line > 0 ? batch.first_line + static_cast<int64_t>(i) : 0;
    if (prepare_) {
      absl::StatusOr<bool> keep = prepare_(&record, batch.source, line);
      if (!keep.ok()) return keep.status();
      if (!*keep) continue;
    }
    if (record.empty()) {
      ++out->empty_documents;
      continue;
    }
    absl::StatusOr<std::vector<int64_t>> ids = tokenizer_.Encode(record);
    if (!ids.ok()) {
      const std::string where =
          line > 0 ? absl::StrCat(batch.source, ":", line) : batch.source;
      return absl::Status(ids.status().code(),
                          absl::StrCat(where, ": ", ids.status().message()));
    }
    out->ids.insert(out->ids.end(), ids->begin(), ids->end());
    out->ids.push_back(eos_);
    out->lengths.push_back(static_cast<int64_t>(ids->size()) + 1);
    // The text is no longer needed; a batch may be large.
    std::string().swap(record);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::tokenizer
