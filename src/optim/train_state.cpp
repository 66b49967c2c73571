#include <minigrad/optim/train_state.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include <minigrad/core/rng.h>
#include <minigrad/util/file.h>

namespace mg::optim {

namespace {

constexpr const char* kFormat = "minigrad-train-state-1";
constexpr const char* kWeightsMeta = "minigrad.weights.";  // the weights file's metadata, kept in the state
constexpr const char* kStateSuffix = ".state.safetensors";
constexpr const char* kWeightsSuffix = ".safetensors";

// A non-negative decimal integer, digits only (std::stoull would take "-5" as 2^64 - 5).
uint64_t meta_u64(const nn::Metadata& m, const std::string& key, const std::string& path,
                  uint64_t max = std::numeric_limits<uint64_t>::max()) {
  auto it = m.find(key);
  MG_CHECK(it != m.end(), path << ": not a training-state file (metadata \"" << key << "\" missing)");
  const std::string& v = it->second;
  uint64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  MG_CHECK(!v.empty() && ec == std::errc() && end == v.data() + v.size() && x <= max,
           path << ": metadata \"" << key << "\" = \"" << v << "\" is not an integer in [0, " << max << "]");
  return x;
}

int64_t meta_count(const nn::Metadata& m, const std::string& key, const std::string& path) {
  return static_cast<int64_t>(meta_u64(m, key, path, std::numeric_limits<int64_t>::max()));
}

// The first element that no run can have saved, or -1: NaN or infinite anywhere, negative in a
// second moment (a running mean of squares).
template <typename T>
int64_t first_bad(const T* p, int64_t n, bool non_negative) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i]) || (non_negative && p[i] < 0)) return i;
  }
  return -1;
}

// A loaded tensor's values (its name, shape and dtype already match the run's).
void check_values(const std::string& path, const std::string& key, const Tensor& t) {
  const std::string_view suffix = ".exp_avg_sq";  // Adam's second moment (Adam::state_tensors)
  const bool second_moment = key.size() > suffix.size() && key.ends_with(suffix);
  double value = 0;
  int64_t i = -1;
  if (t.dtype() == DType::f32) {
    i = first_bad(t.data<float>(), t.numel(), second_moment);
    if (i >= 0) value = t.data<float>()[i];
  } else if (t.dtype() == DType::f64) {
    i = first_bad(t.data<double>(), t.numel(), second_moment);
    if (i >= 0) value = t.data<double>()[i];
  }
  MG_CHECK(i < 0, path << ": tensor \"" << key << "\" holds " << value << " at element " << i << " (of "
                       << t.numel() << ", row-major): "
                       << (std::isfinite(value) ? "a second moment (a mean of squares) cannot be negative"
                                                : "a run resumes only from finite parameters and optimizer state")
                       << "; the file is damaged, or the run had diverged when it was saved");
}

}  // namespace

void save_train_state(const std::string& path, const nn::Module& model, const Optimizer& opt,
                      TrainState state) {
  nn::NamedTensors tensors;
  for (auto& [name, p] : model.state_dict()) tensors.emplace_back("param." + name, p);
  for (auto& [name, t] : opt.state_tensors()) tensors.emplace_back("optim." + name, t);
  nn::Metadata meta = state.extra;
  meta["minigrad.format"] = kFormat;
  meta["minigrad.epoch"] = std::to_string(state.epoch);
  meta["minigrad.batches_done"] = std::to_string(state.batches_done);
  meta["minigrad.step_count"] = std::to_string(opt.step_count());
  meta["minigrad.generator_seed"] = std::to_string(default_generator().seed());
  meta["minigrad.generator_offset"] = std::to_string(default_generator().offset());
  const std::vector<Generator*> gens = model.generators();
  meta["minigrad.model_generators"] = std::to_string(gens.size());
  for (size_t k = 0; k < gens.size(); ++k) {
    meta["minigrad.model_generator." + std::to_string(k) + ".seed"] = std::to_string(gens[k]->seed());
    meta["minigrad.model_generator." + std::to_string(k) + ".offset"] = std::to_string(gens[k]->offset());
  }
  nn::save_safetensors(path, tensors, meta);
}

TrainState load_train_state(const std::string& path, nn::Module& model, Optimizer& opt) {
  nn::SafetensorsFile f = nn::load_safetensors(path);
  auto fmt = f.metadata.find("minigrad.format");
  MG_CHECK(fmt != f.metadata.end() && fmt->second == kFormat,
           path << ": not a libminigrad training-state file (metadata minigrad.format = \""
                << (fmt == f.metadata.end() ? std::string("<missing>") : fmt->second) << "\", expected \""
                << kFormat << "\"); pass the epoch_K.state.safetensors written by --save-dir");
  // Everything is checked before anything is changed: a bad file leaves the run as it was.
  TrainState st;
  st.epoch = meta_count(f.metadata, "minigrad.epoch", path);
  st.batches_done = meta_count(f.metadata, "minigrad.batches_done", path);
  st.step_count = meta_count(f.metadata, "minigrad.step_count", path);
  st.generator_seed = meta_u64(f.metadata, "minigrad.generator_seed", path);
  st.generator_offset = meta_u64(f.metadata, "minigrad.generator_offset", path);
  // The model's own generators (Module::generators), in the same order; files written before
  // they were kept have no count, and leave them as they are.
  const std::vector<Generator*> gens = model.generators();
  std::vector<std::pair<uint64_t, uint64_t>> gen_states;
  if (f.metadata.count("minigrad.model_generators")) {
    const int64_t saved = meta_count(f.metadata, "minigrad.model_generators", path);
    MG_CHECK(saved == static_cast<int64_t>(gens.size()),
             path << ": the file keeps the positions of " << saved << " generator(s) of the model's own, the run's "
                  << "model draws from " << gens.size() << " (a Dropout given its own Generator); different model?");
    for (size_t k = 0; k < gens.size(); ++k) {
      const std::string key = "minigrad.model_generator." + std::to_string(k);
      gen_states.push_back({meta_u64(f.metadata, key + ".seed", path), meta_u64(f.metadata, key + ".offset", path)});
    }
  }
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  std::set<std::string> used;
  auto take = [&](const std::string& key, const Tensor& dst) {
    const Tensor* src = f.find(key);
    MG_CHECK(src != nullptr, path << ": tensor \"" << key << "\" is missing (different model or optimizer?)");
    MG_CHECK(src->shape() == dst.shape() && src->dtype() == dst.dtype(),
             path << ": tensor \"" << key << "\" is " << dtype_name(src->dtype()) << shape_str(src->shape())
                  << ", the run expects " << dtype_name(dst.dtype()) << shape_str(dst.shape()));
    check_values(path, key, *src);
    copies.emplace_back(dst, src);
    used.insert(key);
  };
  for (auto& [name, p] : model.state_dict()) take("param." + name, p);
  for (auto& [name, t] : opt.state_tensors()) take("optim." + name, t);
  for (auto& [name, t] : f.tensors) {
    MG_CHECK(used.count(name), path << ": unexpected tensor \"" << name
                                    << "\" (saved from a different model or optimizer?)");
  }
  for (auto& [dst, src] : copies) dst.copy_(*src);
  opt.set_step_count(st.step_count);
  default_generator().manual_seed(st.generator_seed);
  default_generator().set_offset(st.generator_offset);
  for (size_t k = 0; k < gen_states.size(); ++k) {
    gens[k]->manual_seed(gen_states[k].first);
    gens[k]->set_offset(gen_states[k].second);
  }
  for (auto& [k, v] : f.metadata) {
    if (k.rfind("minigrad.", 0) != 0) st.extra[k] = v;
  }
  return st;
}

// Note [a pair of files as one unit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An epoch's state and weights are two files, each written
// atomically (Note [atomic write] in src/util/file.h); what makes the pair one unit is the
// order. The state goes first and holds everything the weights file does (the parameters, and the
// weights file's metadata under "minigrad.weights.*"); the weights file goes last and so marks the
// pair complete. A kill before the state's rename leaves the previous pair as it was (and a
// temporary, removed by the next start); a kill between the two renames leaves a complete state
// without its weights, which latest_checkpoint passes over and repair_checkpoints completes.
void save_checkpoint(const std::string& base, const nn::Module& model, const Optimizer& opt,
                     TrainState state, const nn::Metadata& weights_metadata) {
  for (auto& [k, v] : weights_metadata) state.extra[kWeightsMeta + k] = v;
  save_train_state(base + kStateSuffix, model, opt, std::move(state));
  nn::save_safetensors(base + kWeightsSuffix, model.state_dict(), weights_metadata);
}

namespace {

// The bases "<dir>/<name>" of the training states in dir ("<name>.state.safetensors").
std::vector<std::string> state_bases(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  MG_CHECK(fs::is_directory(dir, ec), "checkpoint folder '" << dir << "' does not exist or is not a folder");
  std::vector<std::string> bases;
  const std::string suffix = kStateSuffix;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.size() <= suffix.size() || f.compare(f.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    if (!e.is_regular_file(ec)) continue;
    bases.push_back((fs::path(dir) / f.substr(0, f.size() - suffix.size())).string());
  }
  MG_CHECK(!ec, "cannot list checkpoint folder '" << dir << "': " << ec.message());
  std::sort(bases.begin(), bases.end());
  return bases;
}

void check_format(const nn::Metadata& meta, const std::string& path) {
  auto fmt = meta.find("minigrad.format");
  MG_CHECK(fmt != meta.end() && fmt->second == kFormat,
           path << ": not a libminigrad training-state file (metadata minigrad.format = \""
                << (fmt == meta.end() ? std::string("<missing>") : fmt->second) << "\", expected \""
                << kFormat << "\")");
}

}  // namespace

std::string latest_checkpoint(const std::string& dir) {
  std::string best;
  std::tuple<int64_t, int64_t> best_pos{-1, -1};
  for (const std::string& base : state_bases(dir)) {
    if (!std::filesystem::exists(base + kWeightsSuffix)) continue;  // incomplete: written before its weights
    const std::string path = base + kStateSuffix;
    const nn::Metadata meta = nn::read_safetensors_metadata(path);
    check_format(meta, path);
    const std::tuple<int64_t, int64_t> pos{meta_count(meta, "minigrad.epoch", path),
                                           meta_count(meta, "minigrad.batches_done", path)};
    if (pos > best_pos) best_pos = pos, best = base;  // ties: the first name in sorted order
  }
  return best;
}

CheckpointRepair repair_checkpoints(const std::string& dir) {
  CheckpointRepair r;
  const std::vector<std::string> bases = state_bases(dir);  // checks that dir is a folder
  r.temporaries_removed = mg::remove_stale_temporaries(dir);
  for (const std::string& base : bases) {
    const std::string weights = base + kWeightsSuffix;
    if (std::filesystem::exists(weights)) continue;
    const std::string path = base + kStateSuffix;
    nn::SafetensorsFile f = nn::load_safetensors(path);
    check_format(f.metadata, path);
    nn::NamedTensors params;
    for (auto& [name, t] : f.tensors) {
      if (name.rfind("param.", 0) == 0) params.emplace_back(name.substr(6), t);
    }
    nn::Metadata meta;
    const std::string prefix = kWeightsMeta;
    for (auto& [k, v] : f.metadata) {
      if (k.rfind(prefix, 0) == 0) meta[k.substr(prefix.size())] = v;
    }
    nn::save_safetensors(weights, params, meta);
    r.completed.push_back(weights);
  }
  return r;
}

}  // namespace mg::optim
