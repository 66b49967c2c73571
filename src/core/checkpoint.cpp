#include <minigrad/core/checkpoint.h>
#include <minigrad/core/autocast.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/tape.h"

namespace mg {

namespace {
thread_local int t_recording_depth = 0;
thread_local const TileRecording* t_tile = nullptr;

struct RecordingScope {
  RecordingScope() { ++t_recording_depth; }
  ~RecordingScope() { --t_recording_depth; }
};

struct TileScope {
  TileRecording tile;
  const TileRecording* prev = t_tile;
  TileScope(int64_t rows, int64_t batch_rows) : tile{rows, batch_rows} { t_tile = rows < batch_rows ? &tile : prev; }
  ~TileScope() { t_tile = prev; }
};

struct GradModeScope {
  bool prev = GradMode::enabled();
  explicit GradModeScope(bool on) { GradMode::set_enabled(on); }
  ~GradModeScope() { GradMode::set_enabled(prev); }
};

// The rows a tiled segment takes from its inputs: all of them share the first dimension.
int64_t batch_rows(const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    MG_CHECK(inputs[i].dim() >= 1 && inputs[i].size(0) == inputs[0].size(0),
             "checkpoint tiles: every input needs the batch as its first dimension, of one size; input 0 has shape "
                 << shape_str(inputs[0].shape()) << ", input " << i << " " << shape_str(inputs[i].shape()));
  }
  return inputs[0].size(0);
}

Shape with_rows(Shape s, int64_t rows) {
  s[0] = rows;
  return s;
}

// Runs the recorded nodes again on `leaves` (standing for the boundary) and returns the
// segment's output. Each replayed value is dropped after its last reader, so replay holds no
// more than the first pass did. For a tiled segment the nodes run on rows [first, first + rows)
// of the batch (Note [tiled segments]). Records a fresh sub-tape when grad mode is on.
Tensor replay(const CheckpointSegment& seg, const std::vector<Tensor>& leaves, int64_t first, int64_t rows) {
  std::unordered_map<const Node*, std::vector<std::pair<size_t, size_t>>> uses;  // node -> (input, boundary)
  for (const auto& u : seg.boundary_uses) uses[seg.nodes[u.node].get()].push_back({u.input, u.boundary});
  std::unordered_map<const Node*, Tensor> value;
  std::unordered_map<const Node*, int> readers;
  for (const auto& n : seg.nodes) {
    for (const NodeInput& ni : n->inputs) {
      if (ni.fn) ++readers[ni.fn.get()];
    }
  }
  const bool tiled = seg.tile_rows > 0;
  for (const auto& n : seg.nodes) {
    std::vector<Tensor> in(n->inputs.size());
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const NodeInput& ni = n->inputs[i];
      if (ni.fn) {
        in[i] = value.at(ni.fn.get());
      } else if (ni.leaf.defined()) {
        in[i] = ni.leaf;
      }
    }
    if (auto it = uses.find(n.get()); it != uses.end()) {
      for (auto [input, b] : it->second) in[input] = leaves[b];
    }
    const OpAttrs attrs = tiled ? tile_attrs(*n, seg.tile_rows, first, rows) : n->attrs;
    Tensor out;
    {
      const AutocastGuard cast(n->cast);  // the dtype it first ran in (Note [autocast])
      out = apply(*n->op, attrs, std::move(in));
    }
    const Shape expected = tiled ? with_rows(n->out_shape, rows) : n->out_shape;
    MG_CHECK(out.shape() == expected, "checkpoint replay: " << node_name(*n) << " produced shape "
                                                            << shape_str(out.shape()) << " but the first pass produced "
                                                            << shape_str(expected));
    for (const NodeInput& ni : n->inputs) {
      if (ni.fn && --readers[ni.fn.get()] == 0) value.erase(ni.fn.get());
    }
    value[n.get()] = std::move(out);
  }
  return value.at(seg.nodes.back().get());
}

// A tiled segment's nodes must each keep the batch first, and be ops that can run in tiles.
void check_tileable(const CheckpointSegment& seg) {
  for (const auto& n : seg.nodes) {
    MG_CHECK(op_tiles(*n->op), "checkpoint tiles: " << node_name(*n)
                                                    << " cannot run in tiles (it mixes the samples of its batch, or "
                                                       "rounds differently for another number of rows); end the "
                                                       "tiled segment before it");
    const bool batch_first = !n->out_shape.empty() && n->out_shape[0] == seg.tile_rows;
    MG_CHECK(batch_first, "checkpoint tiles: " << node_name(*n) << " produced shape " << shape_str(n->out_shape)
                                               << " from a tile of " << seg.tile_rows
                                               << " rows; tiles need every output to keep the batch first");
  }
}
// Note [offload schedule]: this thread's offloaded segments, in recording order, and the device
// copies of their storages that wait to be released: `fresh` the last segment's, `pending` those
// of a segment before the unit now running.
struct Release {
  std::shared_ptr<StorageImpl> storage;
  std::shared_ptr<StorageImpl> host;  // the copy's destination, kept until the copy is done: a
                                      // segment dropped first would give it back to the host pool
  void* copied = nullptr;  // CUDA: the event of its copy to the host
};
struct OffloadSchedule {
  std::vector<std::weak_ptr<CheckpointSegment>> segments;
  std::vector<Release> fresh, pending;
  std::weak_ptr<Node> chain_output;  // the first fetch starts when backward reaches it
  bool first_fetch_due = false;      // backward started, and reaches no chain output yet
};
thread_local OffloadSchedule t_offload;

void release(std::vector<Release>& list) {
  for (Release& r : list) {
    if (r.copied) cuda_offload_wait(std::exchange(r.copied, nullptr));  // a failed wait leaves none behind
  }
  list.clear();  // the device's blocks go with the last references
}

// A copy of a storage's bytes into another, queued on the copy stream when a CUDA device is on
// either side (the event to wait for), done at once on the CPU (null).
void* start_copy(const std::shared_ptr<StorageImpl>& dst, const std::shared_ptr<StorageImpl>& src, DType dtype) {
  const bool to_host = src->device().is_cuda() && dst->device().is_cpu();
  const bool from_host = src->device().is_cpu() && dst->device().is_cuda();
  if (!to_host && !from_host) {
    copy_storage(dst, src, dtype);
    return nullptr;
  }
  return cuda_offload_copy(dst->data(), src->data(), src->nbytes(), (to_host ? src : dst)->device().index, to_host);
}

// Note [offload]: moves every storage that only the segment's saved tensors hold (not the
// boundary's, nor one something outside holds: a parameter, a cached low-precision weight, the
// segment's output) to the host pool, in the order the nodes first saved them. The device copies
// wait in the schedule's `fresh` list (Note [offload schedule]).
void send_away(const std::shared_ptr<CheckpointSegment>& segment) {
  CheckpointSegment& seg = *segment;
  std::vector<const StorageImpl*> boundary;
  for (const Tensor& b : seg.boundary) boundary.push_back(b.impl().storage.get());
  // The saved tensors, and the inputs without history the nodes keep for a replay (position ids
  // made inside the segment, say): the tape's own handles.
  std::vector<const Tensor*> handles;
  for (const auto& n : seg.nodes) {
    for (const Tensor& t : n->saved) handles.push_back(&t);
    for (const NodeInput& in : n->inputs) handles.push_back(&in.leaf);
  }
  for (const auto& [st, users] : tape_only_storages(handles, boundary)) {
    CheckpointSegment::Away a;
    a.host = std::make_shared<StorageImpl>(st->nbytes(), StorageImpl::InHostPool{});
    a.device = st->device();
    a.dtype = users.front()->dtype;
    a.users = users;
    std::shared_ptr<StorageImpl> device_copy = users.front()->storage;
    void* copied = start_copy(a.host, device_copy, a.dtype);
    for (TensorImpl* impl : users) impl->storage = a.host;
    t_offload.fresh.push_back({std::move(device_copy), a.host, copied});
    seg.away.push_back(std::move(a));
  }
  if (seg.away.empty()) return;
  auto& list = t_offload.segments;
  list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w.expired(); }), list.end());
  list.push_back(segment);
}

// Queues the segment's storages back to the devices they came from (device memory taken now).
void fetch(CheckpointSegment& seg) {
  for (CheckpointSegment::Away& a : seg.away) {
    if (a.back) continue;
    a.back = std::make_shared<StorageImpl>(a.host->nbytes(), a.device);
    a.arrived = start_copy(a.back, a.host, a.dtype);
  }
}

// The segment's storages on their devices again, its saved tensors pointing there.
void bring_back(CheckpointSegment& seg) {
  fetch(seg);
  for (CheckpointSegment::Away& a : seg.away) {
    if (a.arrived) cuda_offload_wait(std::exchange(a.arrived, nullptr));
    for (TensorImpl* impl : a.users) impl->storage = a.back;
  }
  seg.away.clear();  // the host pool's blocks go with the last references
}

// Starts bringing back the latest offloaded segment recorded before `seg` (all of them when `seg`
// is null) that is still away: Note [offload schedule].
void prefetch_before(const CheckpointSegment* seg) {
  auto& list = t_offload.segments;
  size_t k = list.size();
  if (seg != nullptr) {
    while (k > 0 && list[k - 1].lock().get() != seg) --k;
    if (k > 0) --k;  // list[k] is seg: look before it
  }
  while (k > 0) {
    if (auto s = list[--k].lock(); s && !s->away.empty()) {
      fetch(*s);
      return;
    }
  }
}

}  // namespace

CheckpointSegment::~CheckpointSegment() {
  for (Away& a : away) {
    if (a.arrived) cuda_offload_wait_quietly(std::exchange(a.arrived, nullptr));
  }
}

void copy_storage(const std::shared_ptr<StorageImpl>& dst, const std::shared_ptr<StorageImpl>& src, DType dtype) {
  if (dst->device().is_cpu() && src->device().is_cpu()) {
    std::memcpy(dst->data(), src->data(), src->nbytes());
    return;
  }
  auto view = [&](const std::shared_ptr<StorageImpl>& st) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = st;
    impl->dtype = dtype;
    impl->shape = {static_cast<int64_t>(st->nbytes() / dtype_size(dtype))};
    return Tensor(std::move(impl));
  };
  Tensor d = view(dst);
  copy_kernel(d, view(src));
}

std::vector<TapeStorage> tape_only_storages(const std::vector<const Tensor*>& handles,
                                            const std::vector<const StorageImpl*>& skip) {
  struct Held {
    long tape = 0, all = 0;  // handles the tape holds, and in all
  };
  std::unordered_map<TensorImpl*, Held> held;
  std::vector<TapeStorage> storages;
  std::unordered_map<StorageImpl*, size_t> index;
  for (const Tensor* t : handles) {
    if (!t->defined() || !t->impl().storage || t->impl().storage->nbytes() == 0) continue;
    TensorImpl* impl = t->impl_ptr().get();
    StorageImpl* st = impl->storage.get();
    if (st->in_host_pool() || std::find(skip.begin(), skip.end(), st) != skip.end()) continue;
    Held& h = held[impl];
    h.all = t->impl_ptr().use_count();
    if (h.tape++ > 0) continue;
    auto [it, fresh] = index.emplace(st, storages.size());
    if (fresh) storages.push_back({st, {}});
    storages[it->second].users.push_back(impl);
  }
  // Held by nothing but these tensors, and they by nothing but the tape.
  std::erase_if(storages, [&](const TapeStorage& s) {
    if (s.users.front()->storage.use_count() != static_cast<long>(s.users.size())) return true;
    return std::any_of(s.users.begin(), s.users.end(), [&](TensorImpl* i) { return held[i].all != held[i].tape; });
  });
  return storages;
}

void offload_unit_end() {
  release(t_offload.pending);
  t_offload.pending = std::move(t_offload.fresh);
  t_offload.fresh.clear();
}

void offload_chain_end(const std::shared_ptr<Node>& output) { t_offload.chain_output = output; }

void offload_backward_starts() {
  release(t_offload.pending);
  release(t_offload.fresh);
  // Without a chain's output to wait for (mg::checkpoint called directly), the first fetch now.
  if (t_offload.chain_output.expired()) prefetch_before(nullptr);
  else t_offload.first_fetch_due = true;
}

void offload_node_reached(const Node* n) {
  if (!t_offload.first_fetch_due || n != t_offload.chain_output.lock().get()) return;
  t_offload.first_fetch_due = false;
  t_offload.chain_output.reset();
  prefetch_before(nullptr);
}

bool checkpoint_recording() { return t_recording_depth > 0; }
const TileRecording* tile_recording() { return t_tile; }

Tensor checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs, const CheckpointOptions& opts) {
  MG_CHECK(opts.tile_rows >= 0, "checkpoint: tile_rows must be >= 0, got " << opts.tile_rows);
  // Without grad mode there is nothing to drop; inside another segment, this one is part of it
  // (Note [nested segments]).
  if (!GradMode::enabled() || checkpoint_recording()) return fn(inputs);
  auto seg = std::make_shared<CheckpointSegment>();
  for (const Tensor& t : inputs) {
    MG_CHECK(t.defined(), "checkpoint: an input is undefined");
    Tensor b = t.detach();
    if (t.requires_grad()) b.requires_grad_(true);
    seg->boundary.push_back(b);
  }
  MG_CHECK(opts.tile_rows == 0 || !inputs.empty(), "checkpoint tiles: a segment without inputs has no batch to tile");
  const int64_t batch = opts.tile_rows > 0 ? batch_rows(inputs) : 0;
  const bool tiled = opts.tile_rows > 0 && opts.tile_rows < batch;
  MG_CHECK(!(tiled && opts.offload), "checkpoint: a segment is offloaded or runs in tiles, not both (tile_rows "
                                         << opts.tile_rows << " of a batch of " << batch << ", offload on)");
  seg->offload = opts.offload;
  // What the function sees: the boundary, or the first tile's rows of it.
  std::vector<Tensor> recorded = seg->boundary;
  if (tiled) {
    seg->tile_rows = opts.tile_rows;
    seg->batch_rows = batch;
    for (Tensor& r : recorded) {
      const bool grad = r.requires_grad();
      r = rows_view(r, 0, opts.tile_rows);
      if (grad) r.requires_grad_(true);
    }
  }
  const uint64_t first_seq = next_node_seq();
  Tensor y;
  {
    RecordingScope rec;
    TileScope tile(seg->tile_rows, seg->batch_rows);
    y = fn(recorded);
  }
  MG_CHECK(y.defined(), "checkpoint: the segment function returned an undefined tensor");
  for (size_t i = 0; i < inputs.size(); ++i) {  // fn returned an input untouched: keep its history
    if (y.same(recorded[i])) {
      MG_CHECK(!tiled, "checkpoint tiles: the segment function returned its input " << i << " untouched");
      return inputs[i];
    }
  }
  if (!y.grad_fn()) {  // nothing inside needed a gradient: nothing to drop
    MG_CHECK(!tiled, "checkpoint tiles: nothing in the segment needs a gradient; run it without tiles");
    return y;
  }

  // Collect the sub-tape: every node reachable from y that was recorded inside the segment.
  std::unordered_set<Node*> seen{y.grad_fn().get()};
  std::vector<std::shared_ptr<Node>> stack{y.grad_fn()};
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    MG_CHECK(!n->segment, "checkpoint: a segment node inside a segment (Note [nested segments])");
    seg->nodes.push_back(n);
    for (const NodeInput& in : n->inputs) {
      if (!in.fn || !seen.insert(in.fn.get()).second) continue;
      MG_CHECK(in.fn->seq >= first_seq,
               "checkpoint: the segment used a tensor computed outside it (by "
                   << node_name(*in.fn) << ", shape " << shape_str(in.shape)
                   << ") that was not passed as an input; pass it in the inputs list");
      stack.push_back(in.fn);
    }
  }
  std::sort(seg->nodes.begin(), seg->nodes.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  if (tiled) check_tileable(*seg);
  std::unordered_map<const TensorImpl*, size_t> boundary_index;
  for (size_t i = 0; i < recorded.size(); ++i) boundary_index[recorded[i].impl_ptr().get()] = i;
  for (size_t k = 0; k < seg->nodes.size(); ++k) {  // drop the activations: replay recomputes them
    Node& n = *seg->nodes[k];
    if (!seg->offload) {
      n.saved.clear();
      n.saved.shrink_to_fit();
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!n.inputs[i].leaf.defined()) continue;
      auto it = boundary_index.find(n.inputs[i].leaf.impl_ptr().get());
      if (it == boundary_index.end()) continue;
      seg->boundary_uses.push_back({k, i, it->second});
      n.inputs[i].leaf = Tensor();
    }
  }
  recorded.clear();

  Tensor out = y.detach();
  if (seg->offload) send_away(seg);
  if (tiled) {  // the other tiles: replayed without recording, each into its rows of the output
    out = Tensor::empty(with_rows(y.shape(), batch), TensorOptions{y.dtype(), y.device()});
    rows_view(out, 0, seg->tile_rows).copy_(y);
    y = Tensor();
    GradModeScope no_grad(false);
    for (int64_t first = seg->tile_rows; first < batch; first += seg->tile_rows) {
      const int64_t rows = std::min(seg->tile_rows, batch - first);
      std::vector<Tensor> leaves;
      for (const Tensor& b : seg->boundary) leaves.push_back(rows_view(b, first, rows));
      rows_view(out, first, rows).copy_(replay(*seg, leaves, first, rows));
    }
  }

  auto node = std::make_shared<Node>();
  node->seq = next_node_seq();
  node->saved = std::move(seg->boundary);  // released with the node's saved tensors
  seg->boundary.clear();
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->out_device = out.device();
  node->inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    NodeInput& ni = node->inputs[i];
    ni.requires_grad = inputs[i].requires_grad();
    ni.fn = inputs[i].grad_fn();
    ni.shape = inputs[i].shape();
    if (!ni.fn && ni.requires_grad) ni.leaf = inputs[i];
  }
  node->segment = std::move(seg);
  out.impl().requires_grad = true;
  out.impl().grad_fn = std::move(node);
  return out;
}

namespace {

// Note [relu mask in the consumer]: the leaves in `fresh` that stand for boundary tensors a ReLU
// outside the segment made (the checkpoint node's inputs), for ReluBoundaryScope.
std::vector<const TensorImpl*> relu_boundary(const Node& node, const std::vector<Tensor>& fresh) {
  std::vector<const TensorImpl*> out;
  for (size_t i = 0; i < fresh.size() && i < node.inputs.size(); ++i) {
    if (node.inputs[i].fn && op_masks_by_relu(*node.inputs[i].fn)) out.push_back(fresh[i].impl_ptr().get());
  }
  return out;
}

// Fresh leaves standing for a whole segment's boundary (node.saved), so that gradients w.r.t.
// the inputs collect there.
std::vector<Tensor> fresh_leaves(const Node& node) {
  std::vector<Tensor> fresh;
  for (const Tensor& b : node.saved) {
    Tensor f = b.detach();
    if (b.requires_grad()) f.requires_grad_(true);
    fresh.push_back(f);
  }
  return fresh;
}

// An offloaded segment's backward (Note [offload]): its saved tensors come back, and backward
// runs through the nodes of the first pass, with fresh leaves for the boundary as in a replay.
void offloaded_backward(Node& node, Tensor grad_out, std::vector<Tensor>& grads) {
  CheckpointSegment& seg = *node.segment;
  bring_back(seg);
  prefetch_before(&seg);  // the previous offloaded segment comes back during this one's backward
  std::vector<Tensor> fresh = fresh_leaves(node);
  for (const auto& u : seg.boundary_uses) seg.nodes[u.node]->inputs[u.input].leaf = fresh[u.boundary];
  Tensor root(std::make_shared<TensorImpl>());
  root.impl().shape = node.out_shape;
  root.impl().requires_grad = true;
  root.impl().grad_fn = seg.nodes.back();  // the output's node: the last one recorded
  {
    const ReluBoundaryScope relu_leaves(relu_boundary(node, fresh));
    run_backward(root, std::move(grad_out), backward_retains_graph());
  }
  for (const auto& u : seg.boundary_uses) seg.nodes[u.node]->inputs[u.input].leaf = Tensor();
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (node.inputs[i].requires_grad) grads[i] = fresh[i].grad();
  }
}

}  // namespace

Tensor checkpoint_replay(const Node& node) {
  MG_CHECK(node.segment && node.segment->tile_rows == 0 && !node.segment->offload,
           "checkpoint_replay: " << node_name(node) << " is not a whole segment's node");
  const std::vector<Tensor> fresh = fresh_leaves(node);
  GradModeScope grad_on(true);
  RecordingScope rec;
  const ReplayPass replaying;  // the profiler counts these forwards as "replay"
  return replay(*node.segment, fresh, 0, 1);
}

void checkpoint_backward(Node& node, Tensor grad_out, std::vector<Tensor>& grads) {
  if (node.segment->offload) return offloaded_backward(node, std::move(grad_out), grads);
  const CheckpointSegment& seg = *node.segment;
  const bool tiled = seg.tile_rows > 0;
  const int64_t batch = tiled ? seg.batch_rows : 1, step = tiled ? seg.tile_rows : 1;
  if (tiled) {  // the input gradients, filled tile by tile
    for (size_t i = 0; i < node.saved.size(); ++i) {
      if (node.inputs[i].requires_grad) grads[i] = Tensor::empty(node.saved[i].shape(), TensorOptions{node.saved[i].dtype(), node.saved[i].device()});
    }
  }
  for (int64_t first = 0; first < batch; first += step) {
    const int64_t rows = std::min(step, batch - first);
    // Fresh leaves stand in for the boundary (or the tile's rows of it), so that gradients w.r.t.
    // the inputs collect there.
    std::vector<Tensor> fresh;
    for (const Tensor& b : node.saved) {
      Tensor f = tiled ? rows_view(b, first, rows) : b.detach();
      if (b.requires_grad()) f.requires_grad_(true);
      fresh.push_back(f);
    }
    Tensor y;
    {
      GradModeScope grad_on(true);
      RecordingScope rec;
      const ReplayPass replaying;  // the profiler counts these forwards as "replay"
      y = replay(seg, fresh, first, rows);
    }
    MG_CHECK(y.shape() == (tiled ? with_rows(node.out_shape, rows) : node.out_shape),
             "checkpoint replay: segment output shape " << shape_str(y.shape()) << ", first pass "
                                                        << shape_str(node.out_shape));
    if (y.requires_grad()) {
      // Backward needs y's node, not its values (a node that does keeps them in its saved
      // tensors), so the replayed output is not held for the whole backward of the segment.
      Tensor root(std::make_shared<TensorImpl>());
      root.impl().shape = y.shape();
      root.impl().requires_grad = true;
      root.impl().grad_fn = y.grad_fn();
      y = Tensor();
      Tensor g = tiled ? rows_view(grad_out, first, rows) : std::move(grad_out);
      const ReluBoundaryScope relu_leaves(relu_boundary(node, fresh));
      run_backward(root, std::move(g), /*retain_graph=*/false);
    }
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (!node.inputs[i].requires_grad) continue;
      if (!tiled) {
        grads[i] = fresh[i].grad();
      } else if (Tensor g = fresh[i].grad(); g.defined()) {
        rows_view(grads[i], first, rows).copy_(g);
      } else {
        rows_view(grads[i], first, rows).zero_();
      }
    }
  }
}

}  // namespace mg
