// The safetensors reader (minigrad/nn/serialize.h): load_safetensors on any bytes, then, on
// what it accepts, load_into a fixed model and a round trip through save_safetensors.
// Seeds: make_corpus.cpp (safetensors/); dictionary: dicts/safetensors.dict.
#include <cstring>
#include <map>
#include <memory>

#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>

#include "fuzz_common.h"

namespace {

void check_same(const mg::nn::SafetensorsFile& a, const mg::nn::SafetensorsFile& b) {
  MG_FUZZ_CHECK(a.metadata == b.metadata, "metadata changed in a save/load round trip");
  MG_FUZZ_CHECK(a.tensors.size() == b.tensors.size(), "tensor count changed in a save/load round trip");
  std::map<std::string, const mg::Tensor*> by_name;
  for (const auto& [name, t] : b.tensors) by_name[name] = &t;
  for (const auto& [name, t] : a.tensors) {
    auto it = by_name.find(name);
    MG_FUZZ_CHECK(it != by_name.end(), "tensor '" + name + "' lost in a save/load round trip");
    const mg::Tensor& u = *it->second;
    MG_FUZZ_CHECK(t.shape() == u.shape() && t.dtype() == u.dtype() && t.nbytes() == u.nbytes(),
                  "tensor '" + name + "' changed shape or dtype in a save/load round trip");
    MG_FUZZ_CHECK(t.nbytes() == 0 || std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()) == 0,
                  "tensor '" + name + "' changed bytes in a save/load round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<mg::nn::Sequential> model = mg::nn::make_mlp(mg::fuzz::kModelSizes);
  const std::string path = mg::fuzz::write_input("input.safetensors", data, size);
  mg::nn::SafetensorsFile file;
  if (mg::fuzz::expect_mg_error([&] { file = mg::nn::load_safetensors(path); })) return 0;

  uint64_t total = 0;
  for (const auto& [name, t] : file.tensors) total += t.nbytes();
  MG_FUZZ_CHECK(total <= size, "the tensors hold more bytes than the file");

  mg::fuzz::expect_mg_error([&] { mg::nn::load_into(*model, path); });

  // What the reader accepts, the writer writes back (or refuses with mg::Error: it is stricter
  // about names, e.g. an empty one), and the reader reads the same tensors again.
  const std::string copy = mg::fuzz::scratch_dir() + "/copy.safetensors";
  if (mg::fuzz::expect_mg_error([&] { mg::nn::save_safetensors(copy, file.tensors, file.metadata); })) return 0;
  check_same(file, mg::nn::load_safetensors(copy));
  return 0;
}
