// Data-parallel training over several processes: MPI between CPU processes (Open MPI), NCCL
// between GPUs, one interface. Every process holds the whole model, reads its own shard of each
// epoch (LoaderOptions::shard, Note [shards] in minigrad/data/loader.h), and the Accumulator sums
// the window's gradients across processes once per optimizer step (Note [data parallel step] in
// minigrad/optim/accumulate.h).
//
//   // in main(int argc, char** argv), with a data set `train`:
//   mg::dist::Session session(&argc, &argv);  // MPI_Init under mpirun; one process otherwise
//   auto model = mg::nn::make_mlp({784, 512, 512, 10});
//   mg::dist::check_same_parameters(model->named_parameters());  // the same model everywhere
//   mg::dist::broadcast(model->parameters());                    // start from rank 0's weights
//   mg::data::DataLoader loader(train, {.batch_size = 16, .shard = mg::dist::rank(),
//                                       .num_shards = mg::dist::world_size()});
//   mg::optim::SGD sgd(model->parameters(), {.lr = 0.01f});
//   mg::optim::Accumulator acc(sgd, {.steps = 2});  // 2 ranks x 2 x 16 = one step of 64
//   mg::optim::train_epoch(*model, loader, acc, /*epoch=*/0);
//
//   $ mpirun -np 2 ./train
//
// The backend follows the tensors' device: CPU tensors go through MPI_Allreduce, CUDA tensors
// through ncclAllReduce on a stream of its own, ordered after the work that produced them
// (the NCCL communicator is made on first use; its unique id travels over MPI).
//
// Note [collectives never hang]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every collective waits at most timeout_seconds (Session's
// option, or MG_DIST_TIMEOUT in seconds; default 300). A peer that died, threw, or called a
// different collective makes the others throw mg::Error naming the operation and the wait,
// instead of hanging. A rank that fails should not just return (the others may wait for it in a
// collective): it reports its error and calls abort_all(), as the apps do, and mpirun stops every
// rank at once; a Session destroyed while an exception unwinds does the same. A rank killed by a
// signal is noticed by mpirun, which stops the others and names the dead rank.
//
// Built when MPI is found (CMake option MINIGRAD_MPI: AUTO/ON/OFF) and NCCL with the CUDA
// backend (MINIGRAD_NCCL; NCCL does not need MPI). Without MPI the library still links: a single
// process is world 1, and collectives do nothing. Started by a launcher, even a world of 1 runs
// every collective; without one, SessionOptions::world_of_one (Note [a world of one]) does that too.
//
// Note [a world of one]
// ~~~~~~~~~~~~~~~~~~~~~
// A process started without a launcher is a world of one whose collectives
// do nothing. With SessionOptions::world_of_one (or MG_DIST_WORLD_OF_ONE=1) it still runs them as
// `mpirun -np 1` would: CUDA tensors through NCCL on a communicator of one rank (its unique id
// made here, no MPI needed), the Accumulator through its data-parallel path (buckets started
// during backward, Note [overlapped reduction]). Sums over one rank of CPU tensors and host values
// need no MPI and are left as they are. This is how the NCCL path is tested on a machine with one
// GPU and no MPI (ctest's nccl_world_of_one).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::dist {

struct SessionOptions {
  double timeout_seconds = 0;  // 0: MG_DIST_TIMEOUT, else 300 (Note [collectives never hang])
  // Without a launcher, run the collectives anyway, as a world of one (Note [a world of one]);
  // MG_DIST_WORLD_OF_ONE=1 sets it too. Under a launcher it changes nothing.
  bool world_of_one = false;
};

// Starts the process group for its lifetime: MPI_Init when this process was started by mpirun
// (or srun, or another PMI launcher), nothing otherwise. One Session per process.
class Session {
 public:
  Session(int* argc, char*** argv, SessionOptions opts = {});
  ~Session();  // MPI_Finalize; MPI_Abort instead when an exception is unwinding through it
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

// Ends every rank now with `exit_code` (MPI_Abort; std::exit without MPI): for a rank that
// failed while the others may be waiting in a collective (the apps call it after printing their
// error).
[[noreturn]] void abort_all(int exit_code);

bool mpi_built();   // this build has the MPI backend
bool nccl_built();  // this build has the NCCL backend
bool launched();    // started by an MPI launcher (world_size may still be 1)
bool active();      // collectives run: launched, or a world of one on request (Note [a world of one])
int rank();         // 0 without a Session
int world_size();   // 1 without a Session
int local_rank();   // this rank's index among the ranks on its machine (to pick its GPU), 0 alone
// The device a rank trains on when the user named a type but no index ("cuda", "auto"):
// cuda:(local_rank % devices) for CUDA under data parallelism, `d` itself otherwise.
Device device_for_rank(Device d, bool index_given);
std::string backend_name(Device d);  // "mpi", "nccl" or "none" (what this device's collectives go through)

// Sums `tensors` over all ranks, in place (every rank ends with the same values). All tensors
// on one device, float32 or float64, contiguous. Without a launcher it does nothing; under
// `mpirun -np 1` it goes through MPI or NCCL all the same (a one-rank run tests the machinery),
// and so do CUDA tensors in a world of one (Note [a world of one]).
void all_reduce(const std::vector<Tensor>& tensors);
// all_reduce in two halves, for reductions that run while the caller goes on (Note [overlapped
// reduction], minigrad/optim/accumulate.h). all_reduce_start(tensors) starts the sum and returns;
// all_reduce_wait() returns when every reduction started so far has ended (against the deadline,
// Note [collectives never hang]), with the compute stream ordered after them. CUDA tensors: NCCL
// on its own stream, ordered after the work queued so far (the backward that produced them), so
// it runs beside the kernels queued after it. CPU tensors: reduced at once (all_reduce), because
// MPI progresses only inside its calls. The tensors must not be changed in between. Every rank
// starts the same reductions in the same order.
void all_reduce_start(const std::vector<Tensor>& tensors);
void all_reduce_wait();
// Sums host values over all ranks.
std::vector<double> all_reduce(std::vector<double> values);
int64_t all_reduce_max(int64_t value);
// Copies rank `root`'s tensors into every rank's, in place (any dtype; one device per call).
void broadcast(const std::vector<Tensor>& tensors, int root = 0);
// Copies rank `root`'s buffers into every rank's, in place: a model's named_buffers(), BatchNorm's
// running statistics and batch counts. Each rank updates them from its own samples; sharing rank
// 0's after every step (PyTorch DDP's broadcast_buffers) makes the ranks evaluate alike and what
// rank 0 saves what every rank holds. train_epoch does it under data parallelism. The buffers
// may be in host memory and on the rank's CUDA device (a CUDA model's running statistics, its
// host counts): one broadcast each. Throws on every rank, naming the first difference, unless
// every rank passes the same names, shapes, dtypes and device types (a fingerprint is compared
// first: two small reductions). A collective: every rank calls it, with buffers or without.
void broadcast_buffers(const std::vector<std::pair<std::string, Tensor>>& named, int root = 0);
void barrier();

// Throws on every rank, naming the ranks that differ, unless `value` is the same on all of them
// (a model's layer list, the run's configuration): mismatches are found at start, not as a hang
// or a wrong shape in the middle of a collective.
void check_same(const std::string& what, const std::string& value);
// check_same over the parameters' names, shapes and dtypes.
void check_same_parameters(const std::vector<std::pair<std::string, Tensor>>& named);

// Bytes this process has sent into collectives since the Session began (the payload, counted
// once per call: what an all-reduce of a gradient costs, whatever the algorithm underneath).
int64_t bytes_reduced();

// Note [reduction timeline]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Where the reductions of CUDA tensors ran, against the compute stream,
// read from CUDA events (NCCL builds; nothing is recorded for CPU tensors, whose MPI reductions
// block the caller). While recording, every NCCL call gets a span on NCCL's stream, from the
// moment the stream passed the wait for the work before it (its inputs were final) to its end;
// timeline_mark adds a point on the compute stream. The Accumulator marks the last micro-batch's
// backward ("backward begins", "backward ends"; "step starts the buckets" for a window that ended
// short, whose buckets start at step()) and the end of step()'s wait ("reductions waited"), so a
// window's buckets show whether they began before backward ended (Note [overlapped reduction]). A span costs two events, recorded beside the work: the work is not
// synchronised. At most 100,000 spans are kept; recording stops after that.
//
//   mg::dist::record_timeline(true);
//   ... train some steps ...
//   mg::write_file_atomic("trace.json", mg::dist::timeline_trace_json(mg::dist::timeline()));
//   // open in chrome://tracing or ui.perfetto.dev; bench/timeline.py prints the overlap per window
struct TimelineSpan {
  std::string name;    // "bucket 2: 3 tensors, 4194304 bytes", "backward begins", ...
  std::string stream;  // "nccl", "compute" or "copy" (offloaded activations: Note [offload schedule])
  double begin_ms = 0, end_ms = 0;  // GPU time since the first span began; a mark has begin == end
};
void record_timeline(bool on);  // true: forget what was recorded, and record; false: stop
// On the compute stream (current CUDA device); nothing, not even a copy of the name, when not recording.
void timeline_mark(std::string_view name);
// Waits for the recorded events and returns the spans, in the order they were recorded.
std::vector<TimelineSpan> timeline();
// The spans in the Trace Event Format (one process per rank, one thread per stream, times in µs).
std::string timeline_trace_json(const std::vector<TimelineSpan>& spans);

}  // namespace mg::dist
