// Measuring a chain for the cost model (Note [checkpoint cost model] in minigrad/nn/checkpoint_plan.h):
// one pass unit by unit, read from the tape and the allocator's statistics. The only part of
// checkpoint planning that runs the model.
#include <minigrad/nn/checkpoint_plan.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <unordered_set>
#include <utility>

#include <minigrad/core/autocast.h>
#include <minigrad/core/checkpoint.h>
#include <minigrad/core/memory.h>
#include <minigrad/core/rng.h>

#include "core/parallel.h"
#include "core/tape.h"
#include "nn/checkpoint_segments.h"
#include "ops/op.h"

namespace mg::nn {

namespace {

// Groups layers into units: each view layer (Flatten) joins the layer after it; trailing views
// join the last unit.
std::vector<std::pair<size_t, size_t>> form_units(Sequential& seq) {
  std::vector<std::pair<size_t, size_t>> units;
  size_t start = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    if (dynamic_cast<Flatten*>(&seq[i]) != nullptr) continue;
    units.push_back({start, i + 1});
    start = i + 1;
  }
  if (start < seq.size()) {
    if (units.empty()) units.push_back({start, seq.size()});
    else units.back().second = seq.size();
  }
  return units;
}

size_t in_use(Device d) { return memory_stats(d).in_use; }

// Note [awake workers]
// ~~~~~~~~~~~~~~~~~~~~
// In a step, one op's parallel part follows another's within microseconds,
// while the pool's workers still spin; a unit measured on its own starts after the measuring's
// bookkeeping, when they sleep, and its first part pays their wake-up. A part of empty pieces
// just before the clock starts wakes them, as a step would find them. (Units of a tenth of a
// millisecond were measured at up to 1.8x their time in a step without it.)
void wake_workers(Device d) {
  if (d.is_cpu()) cpu::parallel_pieces(cpu::parallel_slots(1 << 10), [](int64_t, int) {});
}

// Whether t is a float32 tensor on the CPU whose bits are all 0 (+0.0 throughout), as the optimizer's
// zeroing leaves a gradient buffer: ModelStateGuard zeroes it again instead of keeping a copy
// (VGG16's 138M gradients: a scan instead of a 0.55 GB copy each way, for every measurement).
bool zero_on_cpu(const Tensor& t) {
  if (!t.device().is_cpu() || t.dtype() != DType::f32) return false;
  const auto* w = static_cast<const uint32_t*>(t.raw_data());
  return std::all_of(w, w + t.numel(), [](uint32_t x) { return x == 0; });
}

// The model's state that a measured pass changes, kept in host memory and put back by restore()
// or, failing that, when the guard goes: the gradient buffers (backward adds into them), the
// buffers (a BatchNorm's forward in training updates its running statistics) and the generators
// dropout draws from (the default one and any a Dropout was given). Measurement runs with zeroed
// gradient buffers, as a training step does (zero_grads): the existing ones, zeroed in place after
// their values are kept in host memory (a second set on the device would be counted in the peak,
// and could pass a memory cap the step itself fits), or new ones where there were none. Buffers
// that are zero already (MeasureOptions::gradients_zero, or all bits 0 on the CPU) are not kept:
// restore() zeroes them again. However the pass ends the model is left as it was: an
// out-of-memory error while measuring (under a memory cap, the joint planner measures until a
// micro-batch no longer fits) is one way.
class ModelStateGuard {
 public:
  ModelStateGuard(Sequential& seq, std::vector<Tensor> params, bool gradients_zero)
      : params_(std::move(params)), buffers_(seq.named_buffers()), gens_(seq.generators()) {
    saved_grads_.resize(params_.size());
    had_grad_.resize(params_.size());
    zero_grad_.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      had_grad_[i] = params_[i].grad().defined();
      if (!had_grad_[i]) continue;
      const Tensor& g = params_[i].grad();
      zero_grad_[i] = zero_on_cpu(g);
      MG_CHECK(zero_grad_[i] || !gradients_zero || !g.device().is_cpu(),
               "measure_chain: MeasureOptions::gradients_zero, but the gradient of parameter " << i << " (shape "
                                                                                              << shape_str(g.shape()) << ") is not zero");
      zero_grad_[i] = zero_grad_[i] || gradients_zero;
      if (!zero_grad_[i]) saved_grads_[i] = g.to_vector<float>();
    }
    saved_f32_.resize(buffers_.size());
    saved_i64_.resize(buffers_.size());
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Tensor& b = buffers_[i].second;
      if (b.dtype() == DType::f32) saved_f32_[i] = b.to_vector<float>();
      if (b.dtype() == DType::i64) saved_i64_[i] = b.to_vector<int64_t>();
    }
    if (std::find(gens_.begin(), gens_.end(), &default_generator()) == gens_.end()) gens_.push_back(&default_generator());
    for (const Generator* g : gens_) gen_state_.push_back({g->seed(), g->offset()});
  }
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;
  // Only when restore() was not reached; a failure here cannot be reported, and restore() is the
  // call that reports one.
  ~ModelStateGuard() {
    if (restored_) return;
    try {
      restore();
    } catch (...) {
    }
  }

  void zero_grads() {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (had_grad_[i]) {
        if (!zero_grad_[i]) params_[i].grad().fill_(0.0f);  // zero ones are zero already
      } else {
        params_[i].set_grad(Tensor::zeros(params_[i].shape(), TensorOptions{DType::f32, params_[i].device()}));
      }
    }
  }

  // Writes the kept state back without allocating where the device is the CPU (under a cap an
  // allocation could fail here too; on CUDA the staging copy is host memory). Once: a second call
  // does nothing.
  void restore() {
    if (restored_) return;
    restored_ = true;
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor g = params_[i].grad();
      if (!had_grad_[i]) {
        params_[i].set_grad(Tensor());
      } else if (zero_grad_[i]) {
        g.fill_(0.0f);
      } else if (g.device().is_cpu()) {
        std::copy(saved_grads_[i].begin(), saved_grads_[i].end(), g.data<float>());
      } else {
        g.copy_(Tensor::from_vector(saved_grads_[i], g.shape()));
      }
    }
    for (size_t i = 0; i < buffers_.size(); ++i) {
      Tensor b = buffers_[i].second;
      if (b.dtype() == DType::f32 && b.device().is_cpu()) {
        std::copy(saved_f32_[i].begin(), saved_f32_[i].end(), b.data<float>());
      } else if (b.dtype() == DType::f32) {
        b.copy_(Tensor::from_vector(saved_f32_[i], b.shape()));
      } else if (b.dtype() == DType::i64) {
        std::copy(saved_i64_[i].begin(), saved_i64_[i].end(), b.data<int64_t>());
      }
    }
    for (size_t i = 0; i < gens_.size(); ++i) {
      gens_[i]->manual_seed(gen_state_[i].first);
      gens_[i]->set_offset(gen_state_[i].second);
    }
  }

 private:
  std::vector<Tensor> params_;
  std::vector<std::vector<float>> saved_grads_;
  std::vector<bool> had_grad_;
  std::vector<bool> zero_grad_;  // zero on the CPU: not copied, zeroed again
  const std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::vector<float>> saved_f32_;
  std::vector<std::vector<int64_t>> saved_i64_;
  std::vector<Generator*> gens_;
  std::vector<std::pair<uint64_t, uint64_t>> gen_state_;  // each one's seed and offset
  bool restored_ = false;
};

// The unit's forward as a replayed segment runs it (Note [replay peak] in
// minigrad/nn/checkpoint_plan.h): its peak above what was live before the segment's first pass,
// the input live, as fwd_peak is (so it counts what the first pass left for the replay: the
// unit's inputs without history, and what its module holds); 0 where the unit makes no segment
// (no history, or it returns its input).
size_t measure_replay_peak(Sequential& seq, const Tensor& xin, size_t begin, size_t end) {
  const Device dev = xin.device();
  const size_t base = in_use(dev);
  // The first pass keeps the boundary (xin's storage) and its node; its output goes at once.
  const std::shared_ptr<Node> node =
      checkpoint([&](const std::vector<Tensor>& in) { return seq.forward_range(in[0], begin, end); }, {xin}).grad_fn();
  if (!node || !node->segment) return 0;
  reset_peak_memory_stats(dev);
  checkpoint_replay(*node);
  synchronize(dev);
  return memory_stats(dev).peak_in_use - base;
}

// Where a unit's output waits during the unit's measured backward (measure_units): off the
// device, so that the backward holds what it holds in a step, with its bits and dtype as they
// are. On a GPU, in a block of the CPU allocator, which the device's counts do not see; on the
// CPU, whose allocator is the device measured, in memory of its own. Both are kept for the next
// unit: before, each unit's output went to a fresh std::vector, widened to float32, and back
// through another host copy, and every vector's pages were new.
class OutputStash {
 public:
  void keep(const Tensor& y) {
    shape_ = y.shape();
    dtype_ = y.dtype();
    device_ = y.device();
    if (device_.is_cpu()) {
      if (bytes_.size() < y.nbytes()) bytes_.resize(y.nbytes());  // grows to the largest output once
      if (y.nbytes() > 0) std::memcpy(bytes_.data(), y.raw_data(), y.nbytes());
    } else {
      host_ = y.to(Device::cpu());
    }
  }
  Tensor take() {
    if (!device_.is_cpu()) return std::exchange(host_, Tensor()).to(device_);
    Tensor y = Tensor::empty(shape_, TensorOptions{dtype_, device_});
    if (y.nbytes() > 0) std::memcpy(y.raw_data(), bytes_.data(), y.nbytes());
    return y;
  }

 private:
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
  std::vector<std::byte> bytes_;
  Tensor host_;
};

// The measured pass: each unit's forward and backward on its own, timed, with its memory read
// from the allocator and its nodes from the tape, into cost.units. Returns the chain's output.
Tensor measure_units(Sequential& seq, const Tensor& x_in, ChainCost& cost) {
  const Device dev = x_in.device();
  // Host clocks read device time only once the device is done.
  auto wait = [&] {
    synchronize(dev);
  };
  Tensor h = x_in.detach();
  bool needs_grad = x_in.requires_grad();
  bool input_held = true;  // a step holds this unit's input during its backward (the caller's batch, or a saved output)
  OutputStash stash;
  for (auto [begin, end] : form_units(seq)) {
    UnitCost u;
    u.begin = begin;
    u.end = end;
    for (size_t i = begin; i < end; ++i) u.name += (u.name.empty() ? "" : " + ") + seq[i].name();

    Tensor xin = h.detach();
    if (needs_grad) xin.requires_grad_(true);
    h = Tensor();
    if (dev.is_cuda()) {
      // An unmeasured forward and backward first: the first call of a shape creates the device
      // context (cuBLAS's workspace stays allocated: measure_chain counts it in the fixed part) and
      // picks cuDNN's algorithms, under --cudnn-benchmark by timing them all in workspaces far
      // larger than the chosen one's. Both happen once per program, not in the steps planned.
      Tensor yw = seq.forward_range(xin, begin, end);
      if (yw.grad_fn()) yw.backward(Tensor::ones(yw.shape(), TensorOptions{DType::f32, dev}));
      yw = Tensor();
      if (xin.requires_grad()) xin.set_grad(Tensor());
      wait();
    }
    u.replay_peak = measure_replay_peak(seq, xin, begin, end);
    const uint64_t first_seq = next_node_seq();
    const size_t base0 = in_use(dev);
    reset_peak_memory_stats(dev);
    wake_workers(dev);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor y = seq.forward_range(xin, begin, end);
    wait();
    u.forward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    u.fwd_peak = memory_stats(dev).peak_in_use - base0;
    const size_t after = in_use(dev);
    u.out_bytes = y.shares_storage(xin) ? 0 : y.nbytes();
    u.extra_bytes = after > base0 + u.out_bytes ? after - base0 - u.out_bytes : 0;

    // The unit's nodes: what they keep, their work, and whether they can run in tiles.
    u.tiles = y.dim() >= 1 && y.size(0) == xin.size(0);
    if (y.grad_fn()) {
      std::vector<const Tensor*> saved;  // the nodes' saved tensors
      std::vector<const NodeInput*> leaves;  // inputs without history or grad, which a segment keeps
      std::vector<Node*> stack{y.grad_fn().get()};
      std::unordered_set<Node*> seen{stack.back()};
      while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        if (n->op) u.flops += n->op->flops(*n);
        if (n->segment) {  // the unit checkpoints a part of itself: that part's work is in the segment
          u.checkpoints_inside = true;
          for (const auto& sn : n->segment->nodes) u.flops += sn->op ? sn->op->flops(*sn) : 0.0;
        }
        u.tiles &= n->op != nullptr && op_tiles(*n->op) && !n->out_shape.empty() && n->out_shape[0] == xin.size(0);
        for (const Tensor& t : n->saved) {
          u.saves_input |= t.shares_storage(xin);
          u.saves_output |= t.shares_storage(y);
          saved.push_back(&t);
        }
        for (const NodeInput& in : n->inputs) {
          if (in.fn && in.fn->seq >= first_seq && seen.insert(in.fn.get()).second) stack.push_back(in.fn.get());
          if (in.leaf_nbytes > 0) leaves.push_back(&in);
        }
      }
      // Of the extras, what only the tape holds an offloaded segment moves (Note [offload]).
      size_t tape_only = 0;
      std::unordered_set<const StorageImpl*> tape_storages;
      for (const TapeStorage& t : tape_only_storages(saved, {xin.impl().storage.get(), y.impl().storage.get()})) {
        tape_only += t.storage->nbytes();
        tape_storages.insert(t.storage);
      }
      u.extra_held_bytes = u.extra_bytes - std::min(u.extra_bytes, tape_only);
      // A checkpointed segment keeps its nodes' inputs without history for the replay: those a
      // node saves too (alive now, held by nothing but the tape), and those nobody holds any more
      // (gone after the forward: a plain step frees them). Each storage once.
      std::set<std::weak_ptr<StorageImpl>, std::owner_less<std::weak_ptr<StorageImpl>>> counted;
      for (const NodeInput* in : leaves) {
        if (!counted.insert(in->leaf_storage).second) continue;
        if (const auto st = in->leaf_storage.lock()) {
          if (tape_storages.count(st.get())) u.leaf_bytes += st->nbytes();
        } else {
          u.leaf_only_bytes += in->leaf_nbytes;
        }
      }
      // The input's gradient lands in xin without a copy (accumulate_grad takes a gradient nothing
      // else holds), as a step passes it on: the unit's backward holds what it holds in a step.
      if (xin.requires_grad()) xin.set_grad(Tensor());
      // The output is the next unit's input, but a step does not hold it during this unit's
      // backward (unless the unit saved it): it waits in host memory, so that measuring holds
      // no more than the step does (under a memory cap at the floor, measuring must fit too).
      const Shape y_shape = y.shape();
      stash.keep(y);
      Tensor root(std::make_shared<TensorImpl>());
      root.impl().shape = y_shape;
      root.impl().requires_grad = true;
      root.impl().grad_fn = y.grad_fn();
      y = Tensor();
      // Likewise the input, when neither this unit nor the one before keeps it: its values are
      // not read by the backward, so its storage is swapped for an empty one (the leaf stays,
      // to take the input gradient).
      if (!input_held && !u.saves_input && xin.requires_grad()) xin.impl().storage = std::make_shared<StorageImpl>(0, dev);
      const DType y_dtype = root.impl().grad_fn->out_dtype;  // bf16 or f16 under autocast
      // The output's gradient: its values change neither the backward's bytes nor its time, so a
      // fill on the device (random values were drawn on the host and copied over: on a GPU,
      // gigabytes a measurement at a large batch).
      Tensor g = Tensor::full(y_shape, 1.0f, TensorOptions{DType::f32, dev});
      if (y_dtype != DType::f32) g = g.to(y_dtype);  // the gradient comes in the output's dtype
      const size_t base1 = in_use(dev);
      reset_peak_memory_stats(dev);
      wake_workers(dev);
      const auto t1 = std::chrono::steady_clock::now();
      run_backward(root, std::move(g), /*retain_graph=*/false);
      wait();
      u.backward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
      u.bwd_peak = memory_stats(dev).peak_in_use - base1;
      root = Tensor();
      y = stash.take();
      needs_grad = true;
    } else {
      u.flops = static_cast<double>(y.numel());
    }
    h = y.detach();
    input_held = u.saves_output;
    cost.units.push_back(std::move(u));
  }
  return h;
}

// The loss run on the chain's output (MeasureOptions::head), forward and backward, as a step
// runs it: the output is held (the loss keeps it), the targets are made before the bytes are read
// (the fixed part counts them), and its input gradient lands in the output's leaf as a step
// hands it to the chain.
void measure_head(const MeasureOptions& opts, Tensor& h, ChainCost& cost) {
  MG_CHECK(opts.head_targets, "measure_chain: a head needs head_targets");
  const Device dev = h.device();
  Tensor out = h.detach();
  out.requires_grad_(true);
  h = Tensor();
  const Tensor targets = opts.head_targets(out.size(0));
  auto head = [&](const Tensor& o) { return opts.head(o, targets); };
  if (dev.is_cuda()) {  // first calls of its shapes make what stays (workspaces), as measure_units' warm-up
    head(out).backward(Tensor::ones({}, TensorOptions{DType::f32, dev}));
    out.set_grad(Tensor());
    synchronize(dev);
  }
  const size_t base = in_use(dev);
  reset_peak_memory_stats(dev);
  Tensor loss = head(out);
  MG_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
           "measure_chain: the head must return a scalar loss with a gradient, got "
               << (loss.defined() ? shape_str(loss.shape()) : std::string("undefined")));
  const size_t fwd = memory_stats(dev).peak_in_use - base;
  loss.backward(Tensor::ones(loss.shape(), TensorOptions{DType::f32, dev}));
  synchronize(dev);
  const size_t bwd = memory_stats(dev).peak_in_use - base;
  cost.head_bytes = fwd;
  cost.head_backward_bytes = bwd;
  cost.head_measured = true;
}

// The host link's rate each way (Note [offload]), in bytes per millisecond: the best of three
// copies of `bytes` between the device and the host pool, as an offloaded segment makes them.
void measure_host_link(Device dev, size_t bytes, ChainCost& cost) {
  auto on_device = std::make_shared<StorageImpl>(bytes, dev);
  auto on_host = std::make_shared<StorageImpl>(bytes, StorageImpl::InHostPool{});
  auto best_ms = [&](const std::shared_ptr<StorageImpl>& to, const std::shared_ptr<StorageImpl>& from) {
    double best = std::numeric_limits<double>::infinity();
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      copy_storage(to, from, DType::f32);
      synchronize(dev);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return std::max(best, 1e-6);
  };
  cost.to_host_bytes_per_ms = static_cast<double>(bytes) / best_ms(on_host, on_device);
  cost.from_host_bytes_per_ms = static_cast<double>(bytes) / best_ms(on_device, on_host);
}

}  // namespace

ChainCost measure_chain(Sequential& seq, const Tensor& x_in, const MeasureOptions& opts) {
  MG_CHECK(seq.size() > 0, "measure_chain: empty Sequential");
  MG_CHECK(x_in.defined() && x_in.dim() >= 1, "measure_chain: the input must be a defined tensor with a batch dimension");
  // Under autocast: the parameters' low-precision copies, made afresh and not left behind (Note [autocast]).
  struct FreshCopies {
    FreshCopies() { clear_autocast_cache(); }
    ~FreshCopies() { clear_autocast_cache(); }
  } fresh_copies;
  if (autocast_dtype() != DType::f32) {
    // The copies live for the whole step (made in its first micro-batch's forward, dropped by the
    // optimizer's step), so they are part of the fixed bytes: made here by a forward without
    // gradients in eval mode, which neither moves BatchNorm's statistics nor draws dropout masks.
    NoGradGuard no_grad;
    const bool training = seq.is_training();
    seq.eval();
    const Tensor out = seq.forward(x_in.detach());
    if (opts.head && opts.head_targets) opts.head(out, opts.head_targets(out.size(0)));  // a tied head's copy too
    seq.train(training);
  }
  const size_t weight_copies = autocast_cache_bytes();
  const Device dev = x_in.device();
  const size_t in_use_at_start = in_use(dev);
  ChainCost cost;
  cost.rows = x_in.size(0);
  cost.num_layers = seq.size();
  cost.input_bytes = x_in.nbytes();
  cost.input_requires_grad = x_in.requires_grad();

  // The fixed part: what is in use now besides x, the gradient buffers backward would create,
  // and int64 targets for the loss.
  std::vector<Tensor> params = seq.parameters();
  size_t fixed = opts.fixed_bytes;
  if (opts.fixed_from_allocator) {
    const size_t now = in_use(dev);
    fixed += now >= x_in.nbytes() ? now - x_in.nbytes() : 0;
    for (const Tensor& p : params) {
      if (!p.grad().defined()) fixed += p.nbytes();
    }
    if (opts.cross_entropy_head || opts.head) {
      cost.target_bytes = static_cast<size_t>(x_in.size(0) * opts.targets_per_row) * sizeof(int64_t);
      fixed += cost.target_bytes;
    }
    cost.weight_copy_bytes = weight_copies;
  }
  MG_CHECK(opts.staged_batches >= 0, "measure_chain: staged_batches must be >= 0, got " << opts.staged_batches);
  cost.staged_bytes = static_cast<size_t>(opts.staged_batches) *
                      (x_in.nbytes() + static_cast<size_t>(x_in.size(0) * opts.targets_per_row) * sizeof(int64_t));
  fixed += cost.staged_bytes;
  cost.fixed_bytes = fixed;

  ModelStateGuard state(seq, std::move(params), opts.gradients_zero);
  Tensor h;
  try {
    state.zero_grads();
    h = measure_units(seq, x_in, cost);
  } catch (...) {
    state.restore();  // an error here replaces the first: never a half-restored model
    throw;
  }
  const size_t out_bytes = h.nbytes();
  // The probabilities, beside the logits in the loss's forward; in its backward the logits' gradient
  // takes the probabilities' place (Note [loss gradient in place] in src/ops/cross_entropy.cpp; the
  // caller keeps no logits past the loss: a step writes cross_entropy(forward(x), y), and a GPT's
  // logits are its largest tensor). Plus the loss, its gradient and the count of rows (ignore_index).
  // Low-precision logits (Note [autocast]): the loss's kernels read them as they are
  // (OpDef::half_kernels, cuda_half): it keeps the logits instead of the probabilities,
  // their gradient takes their place in backward, and on the CPU each thread widens a row and its
  // probabilities into two rows of float32. With set_half_kernels(false) the loss reads them
  // widened: two float32 copies beside them in its forward; in its backward a float32 copy that
  // becomes their gradient, and that gradient rounded.
  const bool low_logits = h.dtype() != DType::f32;
  size_t head = out_bytes, head_backward = 0;
  if (low_logits && half_kernels_enabled()) {
    const int64_t classes = h.dim() == 2 ? h.size(1) : 0;
    const size_t slots = dev.is_cpu() ? static_cast<size_t>(cpu::parallel_slots(h.dim() == 2 ? h.size(0) : 0)) : 0;
    head = head_backward = slots * 2 * static_cast<size_t>(classes) * sizeof(float);
  } else if (low_logits) {  // backward: a float32 copy that becomes the gradient, then its rounding
    head = 2 * static_cast<size_t>(h.numel()) * sizeof(float);
    head_backward = static_cast<size_t>(h.numel()) * (sizeof(float) + dtype_size(h.dtype()));
  }
  cost.head_bytes = opts.cross_entropy_head ? head + 3 * sizeof(float) : 0;
  cost.head_backward_bytes = opts.cross_entropy_head ? head_backward + 3 * sizeof(float) : 0;
  if (opts.head) {
    try {
      measure_head(opts, h, cost);
    } catch (...) {
      state.restore();
      throw;
    }
  }

  h = Tensor();
  state.restore();  // before in_use_at_end is read
  // What the pass left allocated for good (a CUDA context's cuBLAS workspace) is fixed too.
  const size_t in_use_at_end = in_use(dev);
  if (opts.fixed_from_allocator && in_use_at_end > in_use_at_start) cost.fixed_bytes += in_use_at_end - in_use_at_start;
  if (opts.offload == MeasureOptions::Offload::on || (opts.offload == MeasureOptions::Offload::automatic && dev.is_cuda())) {
    // As large as the largest activation (a real offload's size), within [1 MiB, 64 MiB].
    size_t largest = 0;
    for (const UnitCost& u : cost.units) largest = std::max(largest, u.out_bytes);
    measure_host_link(dev, std::clamp<size_t>(largest / 4 * 4, size_t{1} << 20, size_t{64} << 20), cost);
    cost.host_limit = host_memory_limit();
    cost.copies_overlap = dev.is_cuda();
  }
  reset_peak_memory_stats(dev);

  MeasureOptions tile_opts = opts;
  tile_opts.tile_rows.clear();
  tile_opts.tiles_measured.clear();
  tile_opts.offload = MeasureOptions::Offload::off;  // tiled segments are not offloaded
  for (int64_t r : opts.tile_rows) {
    MG_CHECK(r >= 1, "measure_chain: tile rows must be >= 1, got " << r);
    if (r >= cost.rows || cost.tile_cost(r)) continue;
    const auto known = std::find_if(opts.tiles_measured.begin(), opts.tiles_measured.end(),
                                    [&](const ChainCost& t) { return t.rows == r; });
    if (known != opts.tiles_measured.end()) {
      MG_CHECK(known->units.size() == cost.units.size(),
               "measure_chain: the chain measured before at " << r << " rows has " << known->units.size()
                                                              << " units, this one " << cost.units.size());
      cost.tile_costs.push_back(*known);
      cost.tile_costs.back().tile_costs.clear();
      continue;
    }
    Tensor xt = rows_view(x_in, 0, r).clone();
    if (x_in.requires_grad()) xt.requires_grad_(true);
    try {
      cost.tile_costs.push_back(measure_chain(seq, xt, tile_opts));
    } catch (const OutOfMemoryError&) {
      throw;
    } catch (const Error&) {
      // The chain does not run at r rows (a BatchNorm left with one value per channel): no tiles
      // of r rows, which is all the measurement was for.
    }
  }
  std::sort(cost.tile_costs.begin(), cost.tile_costs.end(),
            [](const ChainCost& a, const ChainCost& b) { return a.rows < b.rows; });
  return cost;
}

std::vector<int64_t> tile_rows_below(int64_t rows) {
  std::vector<int64_t> out;
  for (int64_t r = 1; r < rows; r *= 2) out.push_back(r);
  return out;
}

const ChainCost* ChainCost::tile_cost(int64_t tile_rows) const {
  for (const ChainCost& t : tile_costs) {
    if (t.rows == tile_rows) return &t;
  }
  return nullptr;
}

ChainCost measure_chain(Sequential& seq, const Shape& input_shape, const MeasureOptions& opts) {
  return measure_chain(seq, probe_input(seq, input_shape), opts);
}

}  // namespace mg::nn
