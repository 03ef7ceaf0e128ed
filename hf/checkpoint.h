// A HuggingFace Llama-family checkpoint directory, read and written in
// Conveyor's parameter names:
//
//   DIR/config.json                    hf/config.h
//   DIR/model.safetensors              all tensors in one file, or
//   DIR/model.safetensors.index.json   {"weight_map": {tensor: shard file}}
//   DIR/<shard>.safetensors            with the shards beside it
//
// The files are untrusted input. Open validates the config, the index and
// every shard (engine/safetensors.h), and refuses an index that could make
// it read outside DIR or that disagrees with the shards; every error names
// the file and, where there is one, the tensor.
//
// Memory: a shard is held in memory whole while it is read (the safetensors
// reader's design). Open reads each shard once to validate it and keeps only
// the last; ReadConveyorTensor keeps the shard it last read, so reading the
// tensors in layer order loads each shard about once, and at most one shard
// is resident at a time.
//
// Thread-safety: an HfCheckpoint's const methods may be called from several
// threads; reads of tensors are serialized by an internal lock.
// WriteHfCheckpoint may run concurrently for different directories.
#ifndef CONVEYOR_HF_CHECKPOINT_H_
#define CONVEYOR_HF_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/dtype.h"
#include "hf/config.h"
#include "hf/names.h"

namespace conveyor::hf {

inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";

class HfCheckpoint {
 public:
  // Reads DIR/config.json (ParseHfLlamaConfig) and the weights: either
  // DIR/model.safetensors or DIR/model.safetensors.index.json with its
  // shards. Returns
  //   NotFound if DIR, config.json, the weights or a shard does not exist;
  //   FailedPrecondition if DIR is not a directory;
  //   InvalidArgument if a file is not what it should be: config.json or
  //     the index is not a regular file or is malformed, both weight layouts
  //     are present, a shard name holds '/' or "..", a shard is not a valid
  //     safetensors file, a tensor is in a shard other than the one the
  //     weight_map names, or a tensor the weight_map names is missing;
  //   the errno-derived code for other I/O errors.
  // The tensors themselves are checked by ReadConveyorTensor and
  // CheckComplete, so a partial checkpoint can still be inspected.
  static absl::StatusOr<HfCheckpoint> Open(const std::string& dir);

  HfCheckpoint(HfCheckpoint&&) noexcept;
  HfCheckpoint& operator=(HfCheckpoint&&) noexcept;
  ~HfCheckpoint();

  const std::string& dir() const { return dir_; }
  const HfLlamaConfig& config() const { return config_; }

  // The HF names of every tensor stored, sorted.
  std::vector<std::string> TensorNames() const;

  // The tensor Conveyor calls `conveyor_name`, converted to float (F32, F16
  // and BF16 are accepted; BF16 and F16 convert exactly). For a tied model
  // the lm_head (layers.<N+2>.weight) is the embedding. Returns
  //   InvalidArgument if the name is not a parameter of this config, or the
  //     stored tensor has another dtype or a shape other than the config's;
  //   NotFound if the checkpoint does not store it;
  //   the errors of reloading its shard (the file changed since Open:
  //     FailedPrecondition if the tensor is no longer there).
  absl::StatusOr<std::vector<float>> ReadConveyorTensor(
      const std::string& conveyor_name) const;

  // OK when every tensor of ExpectedLlamaTensors(config()) is stored with
  // its shape and a float dtype, and nothing else is stored but ignorable
  // tensors (IsIgnorableHfTensor). Otherwise InvalidArgument listing the
  // missing, mismatched and unexpected tensors (a bounded number of each).
  absl::Status CheckComplete() const;

 private:
  struct StoredTensor {
    size_t shard = 0;  // Index into shard_files_.
    engine::DType dtype = engine::DType::kF32;
    std::vector<int64_t> shape;
  };
  struct ShardCache;

  HfCheckpoint();

  std::string ShardPath(size_t shard) const;
  // Checks a stored tensor's dtype and shape against `expected`.
  absl::Status CheckStored(const std::string& hf_name,
                           const StoredTensor& stored,
                           const std::vector<int64_t>& expected) const;
  absl::Status LoadIndex(const std::string& index_path);
  absl::Status AddShard(const std::string& file,
                        const std::map<std::string, std::string>* weight_map);

  std::string dir_;
  HfLlamaConfig config_;
  std::vector<std::string> shard_files_;  // Relative to dir_.
  std::map<std::string, StoredTensor, std::less<>> tensors_;  // By HF name.
  // ExpectedLlamaTensors(config_), by Conveyor name.
  std::map<std::string, std::vector<int64_t>, std::less<>> expected_;
  // The shard last read; behind a pointer so that the checkpoint can move.
  std::unique_ptr<ShardCache> cache_;
};

// Called once per tensor with its Conveyor name; returns its values in
// row-major order.
using HfTensorSource = std::function<absl::StatusOr<std::vector<float>>(
    const std::string& conveyor_name)>;

struct HfWriteOptions {
  // The stored dtype. kBF16 rounds to nearest even (NaN stays NaN, values
  // beyond bf16's range become infinities); kF32 stores the values as is.
  HfDType dtype = HfDType::kBF16;
  // Replace config.json and model.safetensors if DIR already holds them.
  // Without it an existing checkpoint is never touched.
  bool overwrite = false;
};

// Writes a checkpoint of `config` into `dir` (created, with its parents,
// if missing): model.safetensors with the HF names of
// ExpectedLlamaTensors(config) (no lm_head.weight when tied) and
// "__metadata__": {"format": "pt"}, which transformers requires, then
// config.json (HfLlamaConfigJson). Each file is replaced atomically, so a
// reader sees the old file or the new one; the weights go first, so a new
// config.json never describes the old weights. `tensor` is called once per
// tensor, in layer order. Returns
//   InvalidArgument if `config` fails ValidateHfLlamaConfig or `tensor`
//     returns the wrong number of values;
//   AlreadyExists if `dir` holds config.json or model.safetensors and
//     options.overwrite is false;
//   FailedPrecondition if `dir` is not a directory or holds a sharded
//     checkpoint (model.safetensors.index.json): overwriting would leave
//     its shards behind;
//   the status of `tensor`, prefixed with the tensor's name, if it fails;
//   the errno-derived code if a file cannot be written.
absl::Status WriteHfCheckpoint(const std::string& dir,
                               const HfLlamaConfig& config,
                               const HfTensorSource& tensor,
                               const HfWriteOptions& options = {});

}  // namespace conveyor::hf

#endif  // CONVEYOR_HF_CHECKPOINT_H_
