// Autocast's state and its parameter cache (Note [autocast] in minigrad/core/autocast.h).
#include <minigrad/core/autocast.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include <minigrad/core/error.h>
#include <minigrad/core/tensor.h>

namespace mg {

namespace {

thread_local DType t_low = DType::f32;
thread_local int t_depth = 0;

// A parameter's low-precision copy, keyed by the parameter's TensorImpl; the weak pointer and the
// data address tell a key reused by another tensor from the same one.
struct CacheEntry {
  std::weak_ptr<TensorImpl> source;
  const void* data = nullptr;
  Tensor low;
};

std::mutex g_cache_mutex;
std::unordered_map<const TensorImpl*, CacheEntry>& cache() {
  static std::unordered_map<const TensorImpl*, CacheEntry> c;
  return c;
}

}  // namespace

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "tf32") return Precision::tf32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  MG_FAIL("unknown precision '" << s << "': expected fp32, tf32, bf16 or fp16");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

DType compute_dtype(Precision p) {
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
}

AutocastGuard::AutocastGuard(DType low) : prev_(t_low) {
  MG_CHECK(low == DType::f32 || low == DType::bf16 || low == DType::f16,
           "AutocastGuard: the low dtype must be bfloat16 or float16 (float32: off), got " << dtype_name(low));
  t_low = low;
  ++t_depth;
}

AutocastGuard::~AutocastGuard() {
  t_low = prev_;
  if (--t_depth == 0) clear_autocast_cache();  // the copies are not kept past the run's scope
}

DType autocast_dtype() { return t_low; }

Tensor autocast_param(const Tensor& w, DType low) {
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  CacheEntry& e = cache()[w.impl_ptr().get()];
  if (e.low.defined() && e.low.dtype() == low && e.source.lock() == w.impl_ptr() && e.data == w.raw_data()) return e.low;
  e.source = w.impl_ptr();
  e.data = w.raw_data();
  e.low = w.detach().to(low);
  return e.low;
}

void clear_autocast_cache() {
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  cache().clear();
}

void refresh_autocast_cache() {
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  for (auto it = cache().begin(); it != cache().end();) {
    CacheEntry& e = it->second;
    const std::shared_ptr<TensorImpl> source = e.source.lock();
    const Tensor master = source ? Tensor(source) : Tensor();
    // In place only where nothing but the cache holds the copy (a graph kept with retain_graph
    // keeps the copy it saved) and the master is where and what it was.
    const bool in_place = master.defined() && e.low.defined() && e.data == master.raw_data() &&
                          e.low.impl_ptr().use_count() == 1 && e.low.impl().storage.use_count() == 1 &&
                          e.low.shape() == master.shape() && e.low.device() == master.device();
    if (!in_place) {
      it = cache().erase(it);
      continue;
    }
    e.low.copy_(master.detach());
    ++it;
  }
}

size_t autocast_cache_bytes() {
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  size_t n = 0;
  for (const auto& [key, e] : cache()) n += e.low.defined() ? e.low.nbytes() : 0;
  return n;
}

}  // namespace mg
