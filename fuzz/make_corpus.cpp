// Writes the fuzz targets' seed corpus: valid files, made by the library's own writers where it
// has them (save_safetensors, save_train_state, write_idx), by stb_image_write and by a small
// PNG writer below for images, and short texts for the parsers. One folder per target:
//
//   fuzz_make_corpus OUT   ->  OUT/safetensors/ OUT/train_state/ OUT/idx/ OUT/idx_gz/ OUT/image/
//                              OUT/checkpoint_plan/ OUT/parse_bytes/
//
// scripts/fuzz.sh runs it before every campaign; nothing binary is kept in the repository.
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <minigrad/data/idx.h>
#include <minigrad/data/tokens.h>
#include <minigrad/nn/models.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/ops/ops.h>
#include <minigrad/optim/train_state.h>

#include "fuzz_common.h"

namespace fs = std::filesystem;

namespace {

std::string out_dir;

std::string file(const std::string& target, const std::string& name) {
  fs::create_directories(fs::path(out_dir) / target);
  return (fs::path(out_dir) / target / name).string();
}

void write_text(const std::string& target, const std::string& name, const std::string& bytes) {
  std::ofstream(file(target, name), std::ios::binary | std::ios::trunc) << bytes;
}

// Bytes that are a distinct function of their position (never all zeros).
std::vector<uint8_t> pattern(size_t n, unsigned salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 37 + (i / 7) * 11 + salt * 71) % 251);
  return v;
}

// A tensor of `dtype` and `shape` holding pattern bytes (bf16 and f64 bits as they come).
mg::Tensor pattern_tensor(const mg::Shape& shape, mg::DType dtype, unsigned salt) {
  mg::Tensor t = mg::Tensor::empty(shape, mg::TensorOptions{dtype});
  const std::vector<uint8_t> b = pattern(t.nbytes(), salt);
  if (!b.empty()) std::memcpy(t.raw_data(), b.data(), b.size());
  return t;
}

void safetensors_seeds() {
  mg::Generator gen(1);
  auto model = mg::nn::make_mlp(mg::fuzz::kModelSizes);
  mg::nn::save_safetensors(file("safetensors", "mlp.safetensors"), model->named_parameters(), {{"epoch", "3"}});
  mg::nn::save_safetensors(file("safetensors", "dtypes.safetensors"),
                           {{"f32", pattern_tensor({2, 3}, mg::DType::f32, 1)},
                            {"f64", pattern_tensor({3}, mg::DType::f64, 2)},
                            {"bf16", pattern_tensor({2, 2}, mg::DType::bf16, 3)},
                            {"i64", pattern_tensor({4}, mg::DType::i64, 4)},
                            {"scalar", mg::Tensor::uniform({}, -1.0f, 1.0f, gen)},
                            {"empty", mg::Tensor::empty({0, 3})}},
                           {{"format", "pt"}, {"note", "every dtype, a scalar, an empty tensor"}});
  mg::nn::save_safetensors(file("safetensors", "nothing.safetensors"), {});
  mg::nn::save_safetensors(file("safetensors", "metadata_only.safetensors"), {}, {{"a", "b"}, {"c", ""}});
}

void train_state_seeds() {
  mg::manual_seed(7);
  auto model = mg::nn::make_mlp(mg::fuzz::kModelSizes);
  mg::optim::SGD sgd(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  mg::optim::Adam adam(model->parameters(), {});
  mg::Generator gen(2);
  const mg::Tensor x = mg::Tensor::uniform({5, 4}, -1.0f, 1.0f, gen);
  const mg::Tensor y = mg::Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0, 1}, {5});
  for (mg::optim::Optimizer* opt : {static_cast<mg::optim::Optimizer*>(&sgd), static_cast<mg::optim::Optimizer*>(&adam)}) {
    opt->zero_grad();
    mg::cross_entropy(model->forward(x), y).backward();
    opt->step();  // state tensors that are not zeros
  }
  mg::optim::save_train_state(file("train_state", "sgd.state.safetensors"), *model, sgd,
                              {.epoch = 2, .batches_done = 5, .extra = {{"config", "--lr 0.1"}}});
  mg::optim::save_train_state(file("train_state", "adam.state.safetensors"), *model, adam, {.epoch = 1});
}

void idx_seeds() {
  const mg::data::IdxDataset synthetic = mg::data::make_synthetic(2, 3);
  std::vector<uint8_t> labels = {7, 2, 1, 0, 4, 1, 4, 9, 5, 9};
  for (const auto& [target, ext] : {std::pair{"idx", ""}, std::pair{"idx_gz", ".gz"}}) {
    const std::string e = ext;
    mg::data::write_idx(file(target, "labels-idx1-ubyte" + e), {10}, labels.data());
    mg::data::write_idx(file(target, "images-idx3-ubyte" + e), {2, 28, 28}, synthetic.pixels().data());
    mg::data::write_idx(file(target, "small-idx3-ubyte" + e), {3, 4, 5}, pattern(60, 1).data());
    mg::data::write_idx(file(target, "matrix-idx2-ubyte" + e), {2, 3}, pattern(6, 2).data());
  }
}

// ---- images ----------------------------------------------------------------------------------

void be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>(v >> s));
}

void png_chunk(std::string& out, const char* type, const std::string& body) {
  be32(out, static_cast<uint32_t>(body.size()));
  const std::string typed = type + body;
  out += typed;
  be32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(typed.data()), static_cast<uInt>(typed.size()))));
}

// A PNG stb_image_write cannot make: any bit depth and colour type, Adam7 interlacing, a
// palette with transparency. Pixel bytes come from pattern(); each row cycles through the five
// filter types.
std::string png(int w, int h, int depth, int color, bool interlace) {
  const int channels = color == 0 || color == 3 ? 1 : color == 4 ? 2 : color == 2 ? 3 : 4;
  std::string raw;
  unsigned row = 0;
  auto add_rows = [&](int pw, int ph) {
    if (pw == 0 || ph == 0) return;
    const size_t row_bytes = (static_cast<size_t>(pw) * channels * depth + 7) / 8;
    for (int y = 0; y < ph; ++y, ++row) {
      raw.push_back(static_cast<char>(row % 5));
      const std::vector<uint8_t> b = pattern(row_bytes, row);
      raw.append(b.begin(), b.end());
    }
  };
  if (!interlace) {
    add_rows(w, h);
  } else {
    const int x0[] = {0, 4, 0, 2, 0, 1, 0}, y0[] = {0, 0, 4, 0, 2, 0, 1};
    const int dx[] = {8, 8, 4, 4, 2, 2, 1}, dy[] = {8, 8, 8, 4, 4, 2, 2};
    for (int p = 0; p < 7; ++p) add_rows((w - x0[p] + dx[p] - 1) / dx[p], (h - y0[p] + dy[p] - 1) / dy[p]);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  compress2(reinterpret_cast<Bytef*>(z.data()), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
            static_cast<uLong>(raw.size()), 9);
  z.resize(zlen);
  std::string out = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  be32(ihdr, static_cast<uint32_t>(w));
  be32(ihdr, static_cast<uint32_t>(h));
  ihdr += {static_cast<char>(depth), static_cast<char>(color), 0, 0, static_cast<char>(interlace ? 1 : 0)};
  png_chunk(out, "IHDR", ihdr);
  if (color == 3) {
    const std::vector<uint8_t> pal = pattern(3 * (1 << depth), 9);
    png_chunk(out, "PLTE", std::string(pal.begin(), pal.end()));
    png_chunk(out, "tRNS", std::string("\x00\x80\xff", 3));
  }
  if (color == 0) png_chunk(out, "tRNS", std::string("\x00\x01", 2));  // white is transparent
  png_chunk(out, "IDAT", z);
  png_chunk(out, "IEND", "");
  return out;
}

void image_seeds() {
  struct Stb {
    const char* name;
    int w, h, channels, quality;  // quality 0: PNG
  };
  for (const Stb& s : {Stb{"grey.png", 7, 5, 1, 0}, Stb{"grey_alpha.png", 6, 4, 2, 0}, Stb{"rgb.png", 16, 9, 3, 0},
                       Stb{"rgba.png", 5, 11, 4, 0}, Stb{"rgb_q95.jpg", 17, 11, 3, 95},
                       Stb{"rgb_q50.jpg", 33, 20, 3, 50}, Stb{"grey_q75.jpg", 8, 8, 1, 75}}) {
    const std::vector<uint8_t> px = pattern(static_cast<size_t>(s.w) * s.h * s.channels, 5);
    const std::string path = file("image", s.name);
    const int ok = s.quality == 0 ? stbi_write_png(path.c_str(), s.w, s.h, s.channels, px.data(), s.w * s.channels)
                                  : stbi_write_jpg(path.c_str(), s.w, s.h, s.channels, px.data(), s.quality);
    MG_FUZZ_CHECK(ok != 0, std::string("stb_image_write failed on ") + s.name);
  }
  write_text("image", "rgb16.png", png(5, 3, 16, 2, false));
  write_text("image", "palette4_trns.png", png(9, 4, 4, 3, false));
  write_text("image", "grey1_trns.png", png(11, 3, 1, 0, false));
  write_text("image", "rgba_adam7.png", png(10, 9, 8, 6, true));
  write_text("image", "grey_alpha16_adam7.png", png(3, 5, 16, 4, true));
}

void text_seeds() {
  int i = 0;
  for (const char* spec : {"none", "sqrt", "min", "segments=1", "segments=3", "segments=8", "budget=12MB",
                           "budget=30MiB", "budget=1.5GB", "[0,3)@host [3,5)", "[1,2)/2 [4,9)@host"}) {
    write_text("checkpoint_plan", "spec" + std::to_string(i++), spec);
  }
  // A spec and a chain of its own (fuzz_checkpoint_plan.cpp reads the bytes after the newline).
  for (const char* spec : {"min", "budget=5TB", "segments=4", "sqrt", "budget=2TB", "[0,2)@host"}) {
    const std::vector<uint8_t> chain = pattern(48 + 16 * i, static_cast<unsigned>(i));
    write_text("checkpoint_plan", "spec" + std::to_string(i++), spec + std::string("\n") + std::string(chain.begin(), chain.end()));
  }
  i = 0;
  for (const char* size : {"512MB", "1.5GiB", "100000", "64 KiB", " 7 b ", ".5k", "12.TB", "3t", "1tib",
                           "18000000000000000000", "0.0000001GB"}) {
    write_text("parse_bytes", "size" + std::to_string(i++), size);
  }
}

// llm.c token files: a few tokens, none, the largest token value; and a header only.
void token_seeds() {
  mg::data::save_token_file(file("tokens", "small.bin"), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  mg::data::save_token_file(file("tokens", "empty.bin"), {});
  mg::data::save_token_file(file("tokens", "max.bin"), {65535, 0, 50256, 50256, 7, 7, 7, 1});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (writes the seed corpus of every fuzz target there)\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  try {
    safetensors_seeds();
    train_state_seeds();
    idx_seeds();
    image_seeds();
    text_seeds();
    token_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_corpus: %s\n", e.what());
    return 1;
  }
  for (const auto& d : fs::directory_iterator(out_dir)) {
    size_t n = 0;
    for (const auto& f : fs::directory_iterator(d.path())) n += f.is_regular_file();
    std::printf("%s: %zu seeds\n", d.path().string().c_str(), n);
  }
  return 0;
}
