// Encodes documents on a pool of threads and hands the results back in the
// order they were submitted, so a dataset written from them is the same
// whatever the number of threads. Documents come in batches (a whole text
// file, or some JSON lines of one); a `prepare` function, run on the
// workers, turns each record into the text to encode (a JSON line into its
// field), so parsing scales with the threads too. Each document's ids end
// with the tokenizer's EOS (the end-of-document token).
//
// At most `max_pending_batches` batches are queued or encoding at once:
// Submit blocks past that, which bounds memory whatever the input size.
//
// Thread-safety: Submit and Finish are for one thread, the one that
// created the encoder; the sink runs on that thread, inside them.
#ifndef CONVEYOR_TOKENIZER_PARALLEL_ENCODER_H_
#define CONVEYOR_TOKENIZER_PARALLEL_ENCODER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::tokenizer {

struct DocumentBatch {
  std::vector<std::string> records;
  std::string source;      // The file, for errors.
  int64_t first_line = 0;  // records[i] is line first_line + i; 0: no lines.
  uint64_t bytes = 0;      // Input bytes the batch covers (for progress).
};

struct EncodedBatch {
  std::vector<int64_t> ids;      // The documents' ids, one after another.
  std::vector<int64_t> lengths;  // Each document's number of ids.
  uint64_t bytes = 0;            // The batch's input bytes.
  int64_t empty_documents = 0;   // Records whose text was empty: left out.
};

class ParallelEncoder {
 public:
  struct Options {
    int threads = 1;
    int max_pending_batches = 0;  // 0: 4 per thread.
  };
  // Turns *record into the text to encode; false leaves the record out (a
  // blank line). `line` is 0 when the batch has no lines. Its errors stop
  // the encoder; they should name the source and line.
  using Prepare = std::function<absl::StatusOr<bool>(
      std::string* record, const std::string& source, int64_t line)>;
  // Takes each batch's result, in submission order.
  using Sink = std::function<absl::Status(EncodedBatch& batch)>;

  // FailedPrecondition when the tokenizer has no EOS token;
  // InvalidArgument when threads < 1. `tokenizer` must outlive the encoder;
  // `prepare` may be empty (records are the texts).
  static absl::StatusOr<std::unique_ptr<ParallelEncoder>> Create(
      const Tokenizer& tokenizer, Options options, Prepare prepare, Sink sink);
  // Stops the workers; batches not yet handed to the sink are dropped.
  ~ParallelEncoder();

  // Queues a batch; meanwhile hands finished batches to the sink. The
  // first error in submission order (a prepare's or an encode's, as
  // "<source>:<line>: ..." where there are lines, or the sink's) stops the
  // encoder and is returned, by this call or a later one.
  absl::Status Submit(DocumentBatch batch);
  // Waits for every batch and hands the rest to the sink.
  absl::Status Finish();

 private:
  struct Slot {
    bool done = false;
    absl::Status status;
    EncodedBatch encoded;
  };

  ParallelEncoder(const Tokenizer& tokenizer, int64_t eos, Options options,
                  Prepare prepare, Sink sink);
  void Work();
  absl::Status Encode(DocumentBatch& batch, EncodedBatch* out) const;
  // Hands finished batches to the sink, in order, until fewer than `limit`
  // are pending and the oldest is not finished.
  absl::Status Deliver(size_t limit);
  void Stop();

  const Tokenizer& tokenizer_;
  const int64_t eos_;
  const Options options_;
  const Prepare prepare_;
  const Sink sink_;

  Mutex mu_;
  CondVar work_ready_;
  CondVar batch_done_;
  std::deque<std::pair<uint64_t, DocumentBatch>> queue_ ABSL_GUARDED_BY(mu_);
  // Submitted and not yet delivered, by sequence number.
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // The submitting thread's own.
  uint64_t next_sequence_ = 0;
  absl::Status error_;

  std::vector<std::thread> workers_;
};

}  // namespace conveyor::tokenizer

#endif  // CONVEYOR_TOKENIZER_PARALLEL_ENCODER_H_
