// Weights and training state on disk, in the safetensors format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw bytes.
// PyTorch's safetensors.torch.load_file reads what we write, and parameter names are PyTorch's
// for the same nn.Sequential ("1.weight", ...).
//
//   mg::nn::save_safetensors("epoch_3.safetensors", model.state_dict(), {{"epoch", "3"}});
//   mg::nn::load_into(model, "epoch_3.safetensors");   // checks names, shapes, dtypes
//
// Every write goes to a temporary file in the same folder, is flushed to disk, and is renamed
// over the target: a crash leaves the old file or the new one, never half of one
// (mg::write_file_atomic, <minigrad/util/file.h>).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/module.h>

namespace mg::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// Writes tensors (any device; copied to host) atomically. Names must be unique.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // CPU tensors, in file order
  Metadata metadata;
  const Tensor* find(const std::string& name) const;
};

// Reads and validates a file as the reference implementation does: header length within the file
// and at most 100 MB, a JSON object without duplicate names, known dtypes (F32, F64, BF16, I64), each
// tensor's byte range exactly numel * dtype size, and the ranges tiling the data buffer with no
// hole, overlap or trailing byte. Throws mg::Error naming the file and the problem.
SafetensorsFile load_safetensors(const std::string& path);
// The metadata alone, after the same validation of the header (the tensors' bytes are not read).
Metadata read_safetensors_metadata(const std::string& path);

// Copies the file's tensors into the module's parameters (keeping their devices). Every
// parameter must be present with the same shape and dtype, and the file must hold nothing else;
// the error lists what is missing, unexpected or mismatched.
void load_into(Module& module, const std::string& path);

}  // namespace mg::nn
