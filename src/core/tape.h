// The reverse-mode tape (internal). Every recorded op is a Node: which op it is, its attributes,
// where each input came from, the tensors its backward needs (`saved`) and the metadata of its
// one output. Nodes are owned through the outputs' grad_fn, so a graph nobody can reach frees
// itself.
//
// Order: each node gets an increasing sequence number when recorded; a node's inputs always
// have smaller numbers, so backward visits the reachable nodes in decreasing order, which is
// both a topological order and the exact reverse of the forward pass. Checkpoint replay relies
// on that (Note [checkpoint replay] in include/minigrad/core/checkpoint.h).
//
// Note [op layer hooks]
// ~~~~~~~~~~~~~~~~~~~~~~
// core/ sits below the op layer (src/ops/) and includes nothing from it, nor from kernels/. The
// tape knows an op only as an opaque `const OpDef*` (an entry of the op table, src/ops/op.h) and
// reaches the op layer through the functions declared under "hooks" below, which src/ops/
// defines. tests/check_layering.cmake fails the build's tests if a core file includes anything
// above core.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/autograd.h>
#include <minigrad/core/tensor.h>

namespace mg {

struct OpDef;  // an entry of the op table (src/ops/op.h); opaque to core
struct CheckpointSegment;

// Everything an op needs besides its input tensors. One flat struct for all ops keeps replay
// (Note [checkpoint replay]) a plain re-run of (op, attrs, inputs).
struct OpAttrs {
  int kernel_h = 0, kernel_w = 0;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int out_h = 0, out_w = 0;     // adaptive_avg_pool2d
  float scalar = 0.0f;          // dropout p, scale factor
  uint64_t seed = 0, offset = 0;  // dropout's counter-based RNG position
  uint64_t sample_stride = 0;     // dropout: counters from one sample's first to the next's (0: contiguous)
  Reduction reduction = Reduction::mean;
  int64_t ignore_index = -100;  // cross_entropy: rows with this target count for nothing
  bool batch_stats = false;     // batch_norm: the batch's statistics (training), or the given ones
  Shape shape;                  // reshape target; unpack's piece
  int heads = 0;                // causal_self_attention
  int64_t chunk_rows = 0;       // linear_cross_entropy: rows of logits at a time (0: its default)
  bool channels_last = false;   // conv2d, the pools, batch_norm: Layout::nhwc (Note [channels last])
  bool relu = false;            // conv2d, batch_norm: a ReLU after it, fused (Note [fused relu])
  bool gelu = false;            // linear: a GELU after it, fused (Note [fused gelu])
  Shape dims;                   // permute: the input dimension each output dimension takes
};

struct NodeInput {
  std::shared_ptr<Node> fn;  // producer, or null when the input had no history
  Tensor leaf;       // the input itself when it has no producer and is needed (grad or replay)
  bool requires_grad = false;
  Shape shape;       // the input's shape, for rules that need only that and for replay checks
  DType dtype = DType::f32;  // the input's dtype: its gradient's (Note [autocast])
  // An input without history and without grad (position ids made in a forward): its storage,
  // watched, and its bytes. A segment keeps such an input for its replay; measure_chain reads
  // these to count it (UnitCost::leaf_bytes), whether or not a plain step would keep it.
  std::weak_ptr<StorageImpl> leaf_storage;
  size_t leaf_nbytes = 0;
};

struct Node {
  const OpDef* op = nullptr;  // null for a checkpoint node (segment set instead)
  OpAttrs attrs;
  uint64_t seq = 0;
  std::vector<NodeInput> inputs;
  std::vector<Tensor> saved;  // what backward needs; released after use
  Shape out_shape;
  DType out_dtype = DType::f32;
  DType cast = DType::f32;    // the autocast dtype it ran under (f32: none), for replay (Note [autocast])
  bool half_kernels = false;  // its kernels took bf16/f16 as they were (OpDef::half_kernels in src/ops/op.h)
  Device out_device;
  bool released = false;      // saved tensors were freed by a backward without retain_graph
  // Note [relu mask in the consumer] (src/core/autograd.cpp), set by backward for each rule and
  // cleared after it: bit i, this node's rule masks input i's gradient by that input > 0; and this
  // node's output gradient has come masked so, its ReLU's mask already applied.
  uint8_t mask_inputs_by_relu = 0;
  bool grad_masked_by_relu = false;
  std::shared_ptr<CheckpointSegment> segment;  // checkpoint nodes only
};

// "linear", "relu", ..., or "checkpoint".
const char* node_name(const Node& n);

uint64_t next_node_seq();

// Runs backward from `root` with incoming gradient `grad` (same shape as root). `grad` is taken
// by value and, like every gradient in flight, dropped as soon as its node's rule has run.
void run_backward(const Tensor& root, Tensor grad, bool retain_graph);
// The retain_graph of the backward running on this thread (false outside one).
bool backward_retains_graph();

// Adds `g` into the leaf's gradient: `grad += g`; when the leaf has none yet, `g` itself if
// nothing else refers to it (one handle, its storage not shared), else a copy of it.
void accumulate_grad(const Tensor& leaf, const Tensor& g);

// ---- checkpoint segments (src/core/checkpoint.cpp) -----------------------------------------------
struct CheckpointSegment {
  std::vector<std::shared_ptr<Node>> nodes;  // the sub-tape, in recording order
  std::vector<Tensor> boundary;  // detached inputs while recording; then the checkpoint node's saved
  // Where the sub-tape read a boundary tensor: (node index, input index, boundary index). The
  // nodes do not keep those tensors themselves, so releasing the checkpoint node's saved
  // boundary frees it even while the outer graph is still alive.
  struct BoundaryUse {
    size_t node, input, boundary;
  };
  std::vector<BoundaryUse> boundary_uses;
  // Tiled segments (Note [tiled segments]): the nodes were recorded on rows [0, tile_rows) of a
  // batch of batch_rows; 0 when the segment runs whole.
  int64_t tile_rows = 0, batch_rows = 0;
  // Offloaded segments (Note [offload]): the nodes keep their saved tensors, whose storages wait
  // in the host pool between forward and backward; backward brings them back instead of
  // replaying. `away` lists the storages still in the host pool (Note [offload schedule]).
  bool offload = false;
  // Waits for copies back still queued (a prefetch that backward never took: a segment dropped
  // after an out-of-memory error, or one no gradient reached) before their device blocks go back
  // to the allocator, whose next user would otherwise race the copy stream's writes.
  ~CheckpointSegment();
  CheckpointSegment() = default;
  CheckpointSegment(const CheckpointSegment&) = delete;
  CheckpointSegment& operator=(const CheckpointSegment&) = delete;
  struct Away {
    std::shared_ptr<StorageImpl> host;
    std::shared_ptr<StorageImpl> back;  // its device copy once a fetch has been queued
    void* arrived = nullptr;            // CUDA: the event of that copy (null on the CPU)
    Device device;                      // where the storage came from, and goes back to
    DType dtype = DType::f32;           // a dtype of the tensors on it (its size divides the bytes)
    std::vector<TensorImpl*> users;     // the saved tensors on it (owned by the nodes)
  };
  std::vector<Away> away;
};

// Note [offload schedule] (include/minigrad/core/checkpoint.h): the end of a unit of a plan's chain
// (forward_with_plan), where the device copies of an offloaded segment that ended before it are
// released; the end of the chain (forward_with_plan: the node of its output); the start of a
// backward (run_backward), where the copies are all released; and each node a backward reaches,
// the chain's output among them, where the last offloaded segment's activations start coming back.
void offload_unit_end();
void offload_chain_end(const std::shared_ptr<Node>& output);
void offload_backward_starts();
void offload_node_reached(const Node* n);

// Offload copies, defined by the CUDA backend (no_cuda.cpp: never called there). Queued on the
// device's copy stream after what its stream has queued so far; the host waits for the event they
// return (before the source may be freed or the destination read), which frees it.
void* cuda_offload_copy(void* dst, const void* src, size_t nbytes, int device_index, bool to_host);
void cuda_offload_wait(void* event);  // frees the event even when the wait fails (then throws)
void cuda_offload_wait_quietly(void* event) noexcept;  // the same for destructors: reports nothing

// Note [offload]: the storages under `handles` (tensors the tape holds) that nothing else holds:
// each with the tensors on it, in the order first seen. Storages in `skip`, empty ones and the
// host pool's are left out. An offloaded segment moves exactly these; measure_chain counts them.
struct TapeStorage {
  StorageImpl* storage;
  std::vector<TensorImpl*> users;
};
std::vector<TapeStorage> tape_only_storages(const std::vector<const Tensor*>& handles,
                                            const std::vector<const StorageImpl*>& skip);

// Copies a storage's bytes into another of the same size, between any two devices or the host
// pool (Note [offload]); `dtype` is one of the dtypes on them (its size divides the bytes).
void copy_storage(const std::shared_ptr<StorageImpl>& dst, const std::shared_ptr<StorageImpl>& src, DType dtype);

// True while a segment's forward pass records (ops then keep inputs that have no history).
bool checkpoint_recording();

// While a tiled segment records its first tile (Note [tiled segments]): that tile's rows and the
// rows of the batch it stands for, so that an op drawing from a generator takes the whole batch's
// counters. Null otherwise.
struct TileRecording {
  int64_t rows = 0, batch_rows = 0;
};
const TileRecording* tile_recording();

// Rows [first, first + rows) of t's first dimension: a detached tensor sharing t's storage.
Tensor rows_view(const Tensor& t, int64_t first, int64_t rows);

// The forward of a whole (untiled, kept) segment run again from its checkpoint node, recorded as
// checkpoint_backward runs it: the replayed output, which the caller drops. For measuring a
// replay's bytes (Note [replay peak] in minigrad/nn/checkpoint_plan.h).
Tensor checkpoint_replay(const Node& node);

// The gradient rule of a checkpoint node. grad_out goes on to the replayed segment's backward,
// which frees it after the segment's last op.
void checkpoint_backward(Node& node, Tensor grad_out, std::vector<Tensor>& grads);

// ---- hooks: defined by the op layer (src/ops/apply.cpp), Note [op layer hooks] -----------------
const char* op_name(const OpDef& op);
// Runs one op and records it on the tape when grad mode is on and an input requires grad
// (checkpoint replay calls it with a recorded node's op and attrs).
Tensor apply(const OpDef& op, const OpAttrs& attrs, std::vector<Tensor> inputs);
// Backward of one node: fills grads[i] for each input i with requires_grad. When accum[i] is
// defined (the leaf's existing gradient buffer, or the gradient already pending for the input's
// producer: Note [adding into pending gradients]), a rule may add its result straight into it and
// leave grads[i] undefined, saving a temporary and a pass over memory. grad_out is owned by the
// rule, so that one may release it early.
// True when nothing else refers to t or its storage (one handle, the storage not shared, no
// history): a gradient its receiver may overwrite in place (accumulate_grad, relu's backward).
bool sole_owner(const Tensor& t);
// Whether node n's rule adds input i's gradient into accum[i] (OpDef::adds_into_pending), and
// whether it is handed a pending gradient there now (set_add_into_pending on): Note [adding into
// pending gradients]; accum[i] is then that gradient where nothing else holds it.
bool op_adds_into_pending(const Node& n, size_t i);
bool rule_adds_into_pending(const Node& n, size_t i);
// Note [relu mask in the consumer] (src/core/autograd.cpp): whether node n's output is a ReLU's
// (its rule masks its gradient by the output > 0: relu, and conv2d and batch_norm with the ReLU
// fused), and whether n's rule masks input i's gradient by that input > 0 when asked
// (OpDef::takes_relu_mask, n still holding the input as it came; set_relu_mask_in_consumer on).
bool op_masks_by_relu(const Node& n);
bool rule_takes_relu_mask(const Node& n, size_t i);
// Whether every reader of a ReLU's output that can mask is asked to, not only a sole one (on where
// the mask goes into cuDNN's dgrad graph, so that a conv2d's choice of engine does not depend on
// how a checkpoint plan splits its readers).
bool relu_mask_every_reader();
// How many gradients a ReLU's reader has masked so far, in this process (for tests).
uint64_t relu_masks_in_consumer();
// While a checkpoint segment's sub-tape runs backward: the leaves standing for its boundary
// tensors that a ReLU outside it made (checkpoint_backward sets them), which backward treats as
// ReLU outputs. Scopes nest; the innermost one holds.
class ReluBoundaryScope {
 public:
  explicit ReluBoundaryScope(std::vector<const TensorImpl*> leaves);
  ~ReluBoundaryScope();
  ReluBoundaryScope(const ReluBoundaryScope&) = delete;
  ReluBoundaryScope& operator=(const ReluBoundaryScope&) = delete;

 private:
  std::vector<const TensorImpl*> leaves_;
  const std::vector<const TensorImpl*>* prev_;
};
void backward_rule(Node& node, Tensor grad_out, std::vector<Tensor>& grads,
                   const std::vector<Tensor>& accum);
// Tiles (Note [tiled segments]): whether an op can run on rows of its batch, and the attributes
// that run node n, recorded on rows [0, recorded), on rows [first, first + rows).
bool op_tiles(const OpDef& op);
OpAttrs tile_attrs(const Node& n, int64_t recorded, int64_t first, int64_t rows);
// The device kernels core itself needs.
void fill_kernel(Tensor& t, float value);                  // t = value
void copy_kernel(Tensor& dst, const Tensor& src);          // bytes, any pair of devices
void convert_kernel(Tensor& dst, const Tensor& src);       // between float dtypes, one device
void add_into_kernel(Tensor& acc, const Tensor& g);        // acc += g
Tensor add_kernel(const Tensor& a, const Tensor& b);       // a + b, not recorded
void synchronize_cuda(int device_index);                   // waits for a CUDA device's work
// The profiler's marks on a CUDA device (minigrad/core/profiler.h): an event recorded on its stream
// now; the device's milliseconds between two (waiting for the second); freeing one.
void* cuda_mark(int device_index);
double cuda_mark_ms(void* from, void* to);
void cuda_mark_free(void* mark);

// ---- hooks: defined by dist (src/dist/nccl.cpp; no_nccl.cpp without NCCL) --------------------------
// A span of the --timeline trace on a CUDA stream (Note [reduction timeline] in
// minigrad/dist/dist.h): `stream` names its row ("copy": offload's copies, Note [offload
// schedule]). 0 when the timeline does not record, else a handle for the span's end.
size_t timeline_span_begin(std::string name, const char* stream, void* cuda_stream);
void timeline_span_end(size_t span, void* cuda_stream);

// ---- the profiler's passes (src/core/profiler.cpp) ----------------------------------------------
// The pass an op's forward counts under: "replay" while a ReplayPass lives on this thread
// (checkpoint backward running a segment again), else "forward".
const char* forward_pass();
struct ReplayPass {
  ReplayPass();
  ~ReplayPass();
  ReplayPass(const ReplayPass&) = delete;
  ReplayPass& operator=(const ReplayPass&) = delete;
};

}  // namespace mg
