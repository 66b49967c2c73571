// safetensors, as specified by https://github.com/huggingface/safetensors (README, "Format"):
//
//   [8 bytes: N, u64 little-endian] [N bytes: JSON header, space-padded] [byte buffer]
//   header: {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
//
// The reader enforces what the reference implementation (safetensors/src/tensor.rs) enforces:
// the header starts with '{' and is at most 100 MB; names are unique; every tensor's byte range
// is exactly numel * dtype size; the ranges, in offset order, tile the byte buffer from 0 to its
// end with no hole and no overlap (so trailing bytes after the last tensor are an error: the spec
// calls it an incomplete buffer, and it is how a polyglot or truncated file shows up).
#include <minigrad/nn/serialize.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include <minigrad/core/autograd.h>

#include "nn/load_report.h"
#include "util/file.h"

namespace mg::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; this build writes host bytes as they are");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit
constexpr const char* kMetadataKey = "__metadata__";
constexpr int kMaxHeaderDepth = 4;

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
  }
  return "?";
}

bool st_dtype_from_name(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::f32;
  else if (s == "BF16") *out = DType::bf16;
  else if (s == "I64") *out = DType::i64;
  else if (s == "F64") *out = DType::f64;
  else if (s == "F16") *out = DType::f16;
  else return false;
  return true;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  std::set<std::string> seen;
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MG_CHECK(!name.empty(), "save_safetensors('" << path << "'): empty tensor name");
    MG_CHECK(name != kMetadataKey, "save_safetensors('" << path << "'): '" << kMetadataKey
                                                        << "' is reserved and cannot name a tensor");
    MG_CHECK(seen.insert(name).second, "save_safetensors('" << path << "'): duplicate tensor name '" << name << "'");
    MG_CHECK(t.defined(), "save_safetensors('" << path << "'): tensor '" << name << "' is undefined");
    Tensor h = t.is_cuda() ? t.cpu() : t;
    const uint64_t nbytes = h.nbytes();
    header[name] = {{"dtype", st_dtype_name(h.dtype())},
                    {"shape", h.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    host.push_back(std::move(h));
  }
  std::string json = header.dump();
  // Pad with spaces so the byte buffer starts 8-aligned (as the reference writer does).
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  write_atomic(path, [&](const auto& write) {
    if (int e = write(&n, sizeof n)) return e;
    if (int e = write(json.data(), json.size())) return e;
    for (const Tensor& h : host) {
      if (h.nbytes() == 0) continue;
      if (int e = write(h.raw_data(), h.nbytes())) return e;
    }
    return 0;
  });
}

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

namespace {

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// A header's metadata and tensor entries (in header order), validated; `order` lists the entries
// in offset order, the order of their bytes in the file.
struct Header {
  Metadata metadata;
  std::vector<Entry> entries;
  std::vector<size_t> order;
};

// The header's JSON: an object, no key twice in any of its objects, nested at most
// kMaxHeaderDepth levels.
nlohmann::json parse_header(const std::string& json, const std::string& where) {
  MG_CHECK(json[0] == '{', where << ": the header must start with '{', got byte 0x" << std::hex
                                 << static_cast<int>(static_cast<unsigned char>(json[0])));
  // nlohmann keeps the last of duplicate keys silently; a callback sees every key. Keys are
  // unique in each object: tensor names, an entry's fields (the reference reader refuses a
  // duplicate field too), metadata keys.
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open_objects;  // the keys of each object being parsed
  std::string entry_name, duplicate, duplicate_in;  // entry_name: the entry being parsed
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json, [&](int depth, Event ev, nlohmann::json& parsed) {
      // A safetensors header nests three deep ({name: {shape: [..]}}). Anything deeper is refused
      // as it opens, before it is built: a value nested thousands deep would overflow the stack
      // when printed or freed recursively.
      MG_CHECK(depth <= kMaxHeaderDepth, where << ": the header nests deeper than " << kMaxHeaderDepth
                                              << " levels (a safetensors header has 3)");
      if (ev == Event::object_start) open_objects.emplace_back();
      if (ev == Event::object_end) open_objects.pop_back();
      if (ev == Event::key && parsed.is_string()) {
        const std::string k = parsed.get<std::string>();
        if (depth == 1) entry_name = k;
        if (!open_objects.back().insert(k).second && duplicate.empty()) {
          duplicate = k;
          duplicate_in = depth == 1 ? "" : entry_name;
        }
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    MG_FAIL(where << ": the header is not valid JSON: " << e.what());
  }
  MG_CHECK(duplicate.empty() || !duplicate_in.empty(),
           where << ": tensor name '" << duplicate << "' appears twice in the header");
  MG_CHECK(duplicate.empty(), where << ": key '" << duplicate << "' appears twice in the header entry of '"
                                    << duplicate_in << "'");
  MG_CHECK(header.is_object(), where << ": the header must be a JSON object, got " << header.type_name());
  return header;
}

// One tensor's entry: a known dtype, a shape, and data_offsets spanning exactly numel * dtype
// size bytes.
Entry parse_entry(const std::string& name, const nlohmann::json& info, const std::string& where) {
  const std::string tw = where + ", tensor '" + name + "'";
  MG_CHECK(info.is_object(), tw << ": entry must be an object, got " << info.type_name());
  MG_CHECK(info.contains("dtype") && info["dtype"].is_string(), tw << ": missing string field 'dtype'");
  MG_CHECK(info.contains("shape") && info["shape"].is_array(), tw << ": missing array field 'shape'");
  MG_CHECK(info.contains("data_offsets") && info["data_offsets"].is_array() && info["data_offsets"].size() == 2,
           tw << ": 'data_offsets' must be an array [begin, end]");
  Entry e;
  e.name = name;
  const std::string dt = info["dtype"].get<std::string>();
  MG_CHECK(st_dtype_from_name(dt, &e.dtype),
           tw << ": dtype '" << dt << "' is not supported (this library reads F32, F64, BF16, F16, I64)");
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : info["shape"]) {
    MG_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
             tw << ": shape entries must be non-negative integers, got " << info["shape"].dump());
    const uint64_t v = d.get<uint64_t>();
    MG_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), tw << ": shape entry " << v << " too large");
    if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) overflow = true;
    numel *= v;
    e.shape.push_back(static_cast<int64_t>(v));
  }
  MG_CHECK(!overflow && numel <= std::numeric_limits<uint64_t>::max() / dtype_size(e.dtype),
           tw << ": shape " << info["shape"].dump() << " overflows");
  for (const auto& o : info["data_offsets"]) {
    MG_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
             tw << ": data_offsets must be non-negative integers, got " << info["data_offsets"].dump());
  }
  e.begin = info["data_offsets"][0].get<uint64_t>();
  e.end = info["data_offsets"][1].get<uint64_t>();
  MG_CHECK(e.begin <= e.end, tw << ": data_offsets [" << e.begin << ", " << e.end << "] end before they begin");
  const uint64_t want = numel * dtype_size(e.dtype);
  MG_CHECK(e.end - e.begin == want, tw << ": data_offsets [" << e.begin << ", " << e.end << "] span "
                                       << e.end - e.begin << " bytes, but shape " << shape_str(e.shape)
                                       << " of " << dt << " needs " << want);
  return e;
}

// The metadata and the entries, whose byte ranges must tile the data buffer of buffer_size bytes.
Header validate_header(const nlohmann::json& header, uint64_t buffer_size, const std::string& where) {
  Header h;
  std::vector<Entry>& entries = h.entries;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      MG_CHECK(info.is_object(), where << ": '" << kMetadataKey << "' must be an object of strings, got "
                                       << info.type_name());
      for (const auto& [k, v] : info.items()) {
        MG_CHECK(v.is_string(), where << ": metadata value of '" << k << "' must be a string, got " << v.type_name());
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(name, info, where));
  }

  // The byte ranges must tile the buffer exactly, in offset order.
  std::vector<size_t>& order = h.order;
  order.resize(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries[a].begin != entries[b].begin ? entries[a].begin < entries[b].begin : entries[a].end < entries[b].end;
  });
  uint64_t pos = 0;
  for (size_t i : order) {
    const Entry& e = entries[i];
    MG_CHECK(e.end <= buffer_size, where << ", tensor '" << e.name << "': data_offsets [" << e.begin << ", "
                                         << e.end << "] run past the end of the " << buffer_size
                                         << "-byte data buffer (file truncated?)");
    MG_CHECK(e.begin >= pos, where << ", tensor '" << e.name << "': data_offsets [" << e.begin << ", " << e.end
                                   << "] overlap the previous tensor, which ends at " << pos);
    MG_CHECK(e.begin == pos, where << ", tensor '" << e.name << "': data_offsets [" << e.begin << ", " << e.end
                                   << "] leave a hole of " << e.begin - pos << " bytes after offset " << pos);
    pos = e.end;
  }
  MG_CHECK(pos == buffer_size, where << ": tensors cover " << pos << " bytes of the " << buffer_size
                                     << "-byte data buffer; the format allows no trailing bytes");
  return h;
}

// The whole reader; with read_data false it stops once the header is validated (metadata only).
SafetensorsFile read_safetensors(const std::string& path, bool read_data) {
  const std::string where = "safetensors file '" + path + "'";
  const ReadOnlyFile f = open_regular_file(path, where);  // Note [opening regular files]
  const uint64_t file_size = f.size;
  MG_CHECK(file_size >= 8, where << " is too short: " << file_size
                                 << " bytes, expected at least the 8-byte header length");
  auto read_exact = [&](void* dst, size_t n, const std::string& what) {
    const size_t got = read_up_to(f, dst, n, where);
    MG_CHECK(got == n, "reading " << where << ": short read of " << what << " (" << got << " of " << n
                                  << " bytes; did the file shrink?)");
  };
  uint64_t n = 0;
  read_exact(&n, 8, "the header length");
  MG_CHECK(n <= kMaxHeaderBytes, where << ": header length " << n << " exceeds the format's limit of "
                                       << kMaxHeaderBytes << " bytes (corrupt or not a safetensors file)");
  MG_CHECK(n <= file_size - 8, where << ": header length " << n << " is larger than the "
                                     << file_size - 8 << " bytes after the length field (file truncated?)");
  MG_CHECK(n >= 2, where << ": header length " << n << " is too small for a JSON object");
  std::string json(n, '\0');
  read_exact(json.data(), n, "the JSON header");
  Header h = validate_header(parse_header(json, where), file_size - 8 - n, where);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  if (!read_data) return out;

  // Read in offset order (one sequential pass), store in header order.
  std::vector<Tensor> loaded(h.entries.size());
  for (size_t i : h.order) {
    const Entry& e = h.entries[i];
    loaded[i] = Tensor::empty(e.shape, TensorOptions{e.dtype});
    read_exact(loaded[i].raw_data(), loaded[i].nbytes(), "tensor '" + e.name + "'");
  }
  // File order: the order of the data, which is how we (and the reference writer) lay them out.
  for (size_t i : h.order) out.tensors.emplace_back(h.entries[i].name, std::move(loaded[i]));
  return out;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) { return read_safetensors(path, true); }

Metadata read_safetensors_metadata(const std::string& path) { return read_safetensors(path, false).metadata; }

void throw_if_mismatched(const std::string& what, const std::vector<std::string>& missing,
                         const std::vector<std::string>& unexpected, const char* mismatched_title,
                         const std::vector<std::string>& mismatched) {
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return;
  std::ostringstream os;
  os << what;
  auto list = [&](const char* title, const std::vector<std::string>& v) {
    if (v.empty()) return;
    os << "\n  " << title << " (" << v.size() << "):";
    for (const auto& s : v) os << "\n    " << s;
  };
  list("missing from the file", missing);
  list("unexpected in the file", unexpected);
  list(mismatched_title, mismatched);
  MG_FAIL(os.str());
}

void load_into(Module& module, const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name[name] = &t;

  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> wanted;
  auto params = module.state_dict();  // parameters and buffers
  for (const auto& [name, p] : params) {
    wanted.insert(name);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name + " " + shape_str(p.shape()) + " " + dtype_name(p.dtype()));
      continue;
    }
    const Tensor& t = *it->second;
    if (t.shape() != p.shape() || t.dtype() != p.dtype()) {
      mismatched.push_back(name + ": model " + shape_str(p.shape()) + " " + dtype_name(p.dtype()) + ", file " +
                           shape_str(t.shape()) + " " + dtype_name(t.dtype()));
    }
  }
  for (const auto& [name, t] : file.tensors) {
    if (!wanted.count(name)) unexpected.push_back(name + " " + shape_str(t.shape()) + " " + dtype_name(t.dtype()));
  }
  throw_if_mismatched("load_into: safetensors file '" + path + "' does not match the model", missing, unexpected,
                      "shape/dtype mismatch", mismatched);
  // Everything checked before anything is written: a failed load leaves the model untouched.
  NoGradGuard no_grad;
  for (auto& [name, p] : params) {
    Tensor dst = p;  // shares storage: the parameter keeps its identity and device
    dst.copy_(*by_name.at(name));
  }
}

}  // namespace mg::nn
