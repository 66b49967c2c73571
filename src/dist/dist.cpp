// mg::dist (minigrad/dist/dist.h): the process group over MPI, collectives on CPU tensors through
// MPI, on CUDA tensors through NCCL (src/dist/nccl.cpp), every wait bounded
// (Note [collectives never hang]). `launched`: started by a launcher (MPI initialised, where
// built); `active`: collectives run (launched, or a world of one: Note [a world of one] in
// minigrad/dist/dist.h).
#include <minigrad/dist/dist.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dist/backend.h"

#ifdef MINIGRAD_WITH_MPI
#include <mpi.h>
#endif

namespace mg::dist {

namespace {

struct World {
  bool session = false, launched = false, active = false;
  int rank = 0, size = 1, local_rank = 0;
  double timeout_s = 300;
  int64_t bytes = 0;
};
World g_world;

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// MG_DIST_WORLD_OF_ONE: unset, empty or 0 is off, 1 is on.
bool world_of_one_from_env() {
  const char* v = std::getenv("MG_DIST_WORLD_OF_ONE");
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  MG_CHECK(std::string(v) == "1", "MG_DIST_WORLD_OF_ONE=\"" << v << "\": expected 1 (run the collectives as a world of "
                                  "one without a launcher) or 0");
  return true;
}

double timeout_from_env(double configured) {
  if (configured > 0) return configured;
  if (const char* v = std::getenv("MG_DIST_TIMEOUT")) {
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    MG_CHECK(end != v && *end == '\0' && t > 0 && t < 1e9,
             "MG_DIST_TIMEOUT=\"" << v << "\": expected a number of seconds > 0, e.g. 60");
    return t;
  }
  return 300;
}

#ifdef MINIGRAD_WITH_MPI
void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  MG_FAIL("mg::dist: " << what << " failed on rank " << g_world.rank << ": " << std::string(text, len));
}

// Note [collectives never hang]: MPI's blocking collectives wait forever for a peer that never
// comes; the non-blocking ones are polled here against a deadline instead.
void wait_all(std::vector<MPI_Request>& reqs, const std::string& what) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration<double>(g_world.timeout_s);
  for (;;) {
    int done = 0;
    mpi_check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), what.c_str());
    if (done) return;
    if (clock::now() > deadline) {
      MG_FAIL("mg::dist: rank " << g_world.rank << " of " << g_world.size << " waited " << g_world.timeout_s
              << " s in " << what << " and not every rank arrived: a rank died, threw, or is in a different "
              "collective (the ranks must run the same steps). ---> HINT: the other ranks' output names the "
              "failure; MG_DIST_TIMEOUT sets this wait in seconds");
    }
    // MPI's non-blocking collectives advance only inside MPI calls, so the first poll loop spins
    // (a sleep here stalls every fragment of the reduction); after a second of waiting (a slow
    // or dead peer) it sleeps between polls so as not to take the core.
    if (clock::now() - start > std::chrono::seconds(1)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    default: MG_FAIL("mg::dist: collectives take float32 or float64 tensors, got " << dtype_name(t));
  }
}

// Note [MPI packing]
// ~~~~~~~~~~~~~~~~~~
// The tensors are reduced in buckets of about kBucketBytes (1 MiB), in the order
// given (the Accumulator passes the gradients last layer first). Small tensors are packed into a
// host buffer so that one message carries many of them; a tensor of a bucket's size or more is
// reduced in place. Every rank adds the same values in the same order: the result is the same on
// every rank, to the bit.
//
// Note [arrive, then reduce]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The buckets go through MPI's blocking MPI_Allreduce, which Open
// MPI tunes per message size: for the MLP's gradient it is faster than MPI_Iallreduce polled in a
// tight loop, whose schedule advances only inside MPI calls (measured: BENCHMARKS.md, "Figures
// behind the design notes"). A blocking call cannot be bounded in time, so it is only made
// once every rank has arrived: a small non-blocking reduction first, polled against the deadline
// (Note [collectives never hang]), which also checks that every rank reduces as many elements of
// the same dtype. A rank that dies after arriving is noticed by mpirun, which stops the others.
constexpr size_t kBucketBytes = size_t{1} << 20;

void arrive(int64_t count, DType dt, const std::string& what) {
  // MAX over (count, -count, dtype, -dtype) gives the largest and the smallest of each.
  long long v[4] = {count, -count, static_cast<long long>(dt), -static_cast<long long>(dt)};
  std::vector<MPI_Request> reqs(1);
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, v, 4, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD, &reqs[0]), "MPI_Iallreduce");
  wait_all(reqs, what);
  MG_CHECK(v[0] == -v[1] && v[2] == -v[3],
           "mg::dist: " << what << ": the ranks reduce different tensors (between " << -v[1] << " and " << v[0]
                        << " elements, of " << (v[2] == -v[3] ? "one dtype" : "different dtypes") << "): rank "
                        << g_world.rank << " has " << count << " " << dtype_name(dt)
                        << ". ---> HINT: every rank must hold the same model (mg::dist::check_same_parameters)");
}

void mpi_all_reduce_cpu(const std::vector<Tensor>& tensors) {  // one dtype: check_summable
  const DType dt = tensors[0].dtype();
  int64_t count = 0;
  for (const Tensor& t : tensors) {
    MG_CHECK(t.numel() < (int64_t{1} << 31), "mg::dist::all_reduce: a tensor of " << t.numel()
                                                 << " elements (MPI counts are int; at most 2^31 - 1)");
    count += t.numel();
  }
  arrive(count, dt, "all_reduce of " + std::to_string(tensors.size()) + " tensors (" +
                        std::to_string(count * static_cast<int64_t>(dtype_size(dt))) + " bytes)");
  // One bucket buffer for the process's life: a fresh one every step cost more in page faults
  // than the reduction itself (measured: BENCHMARKS.md, "Figures behind the design notes").
  static std::vector<char> buffer(kBucketBytes);
  size_t used = 0;
  std::vector<const Tensor*> members;
  auto reduce = [&](void* data, int64_t n) {
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), mpi_type(dt), MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce");
  };
  auto flush = [&] {
    if (members.empty()) return;
    reduce(buffer.data(), static_cast<int64_t>(used / dtype_size(dt)));
    size_t at = 0;
    for (const Tensor* t : members) {
      std::memcpy(t->raw_data(), buffer.data() + at, t->nbytes());
      at += t->nbytes();
    }
    used = 0;
    members.clear();
  };
  for (const Tensor& t : tensors) {
    if (t.nbytes() >= kBucketBytes) {
      flush();
      reduce(t.raw_data(), t.numel());
      continue;
    }
    if (used + t.nbytes() > kBucketBytes) flush();
    std::memcpy(buffer.data() + used, t.raw_data(), t.nbytes());
    used += t.nbytes();
    members.push_back(&t);
  }
  flush();
  g_world.bytes += count * static_cast<int64_t>(dtype_size(dt));
}

std::vector<std::string> all_gather_strings(const std::string& value, const std::string& what) {
  const int n = g_world.size;
  int len = static_cast<int>(value.size());
  std::vector<int> lens(n), offsets(n);
  std::vector<MPI_Request> reqs(1);
  mpi_check(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD, &reqs[0]), "MPI_Iallgather");
  wait_all(reqs, "check_same(" + what + ")");
  int total = 0;
  for (int i = 0; i < n; ++i) {
    offsets[i] = total;
    total += lens[i];
  }
  std::string all(static_cast<size_t>(total), '\0');
  mpi_check(MPI_Iallgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR,
                            MPI_COMM_WORLD, &reqs[0]), "MPI_Iallgatherv");
  wait_all(reqs, "check_same(" + what + ")");
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(all.substr(static_cast<size_t>(offsets[i]), static_cast<size_t>(lens[i])));
  return out;
}
#endif  // MINIGRAD_WITH_MPI

void check_tensors(const std::vector<Tensor>& tensors, const char* what) {
  for (const Tensor& t : tensors) {
    MG_CHECK(t.defined(), "mg::dist::" << what << ": an undefined tensor");
    MG_CHECK(t.device() == tensors[0].device(), "mg::dist::" << what << ": tensors of one call share a device, got "
                                                             << tensors[0].device().str() << " and " << t.device().str());
  }
}

// Sums take float32 or float64, one dtype per call (checked before any backend call: an error
// inside NCCL's group would leave it half issued).
void check_summable(const std::vector<Tensor>& tensors, const char* what) {
  const DType dt = tensors[0].dtype();
  MG_CHECK(dt == DType::f32 || dt == DType::f64,
           "mg::dist::" << what << ": sums take float32 or float64 tensors, got " << dtype_name(dt));
  for (const Tensor& t : tensors) {
    MG_CHECK(t.dtype() == dt, "mg::dist::" << what << ": tensors of one call share a dtype, got " << dtype_name(dt)
                                           << " and " << dtype_name(t.dtype()));
  }
}

// The first line where two descriptions differ, for check_same's message.
[[maybe_unused]] std::string first_difference(const std::string& a, const std::string& b) {  // MPI builds only
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ha = static_cast<bool>(std::getline(sa, la)), hb = static_cast<bool>(std::getline(sb, lb));
    if (!ha && !hb) return "";
    if (!ha || !hb || la != lb) {
      return "line " + std::to_string(line) + ": \"" + (ha ? la : "<end>") + "\" against \"" + (hb ? lb : "<end>") + "\"";
    }
  }
}

}  // namespace

Session::Session(int* argc, char*** argv, SessionOptions opts) {
  MG_CHECK(!g_world.session, "mg::dist::Session: one per process (a Session already exists)");
  g_world.timeout_s = timeout_from_env(opts.timeout_seconds);
  g_world.launched = env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK") ||
                     env_set("PMI_SIZE");
  const bool world_of_one = opts.world_of_one || world_of_one_from_env();
#ifdef MINIGRAD_WITH_MPI
  if (g_world.launched) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors become mg::Error, not exit()
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world.size);
    MPI_Comm node;  // the ranks sharing this machine's memory
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world.rank, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    MPI_Comm_rank(node, &g_world.local_rank);
    MPI_Comm_free(&node);
  }
#else
  (void)argc;
  (void)argv;
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  MG_CHECK(!g_world.launched || (n && std::string(n) == "1"),
           "mg::dist: this process was started by an MPI launcher (" << (n ? std::string("world size ") + n : "PMI")
               << "), but libminigrad was built without MPI: every rank would train alone. ---> HINT: install "
                  "libopenmpi-dev and reconfigure (MINIGRAD_MPI=ON), or start one process without mpirun");
#endif
  g_world.active = g_world.launched || world_of_one;
  g_world.session = true;
  g_world.bytes = 0;
}

Session::~Session() {
  if (g_world.active) detail::nccl_shutdown(std::uncaught_exceptions() > 0, g_world.timeout_s);
#ifdef MINIGRAD_WITH_MPI
  if (g_world.launched) {
    // Note [collectives never hang]: a rank leaving on an exception takes the others with it.
    if (std::uncaught_exceptions() > 0) MPI_Abort(MPI_COMM_WORLD, 1);
    else MPI_Finalize();
  }
#endif
  g_world = World{};
}

void abort_all(int exit_code) {
  std::fflush(nullptr);
#ifdef MINIGRAD_WITH_MPI
  if (g_world.launched) MPI_Abort(MPI_COMM_WORLD, exit_code);
#endif
  std::exit(exit_code);
}

bool mpi_built() {
#ifdef MINIGRAD_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool nccl_built() { return detail::nccl_built(); }
bool launched() { return g_world.launched; }
bool active() { return g_world.active; }
int rank() { return g_world.rank; }
int world_size() { return g_world.size; }
int local_rank() { return g_world.local_rank; }

Device device_for_rank(Device d, bool index_given) {
  if (!d.is_cuda() || index_given || g_world.size == 1) return d;
  const int n = cuda_device_count();
  return n > 0 ? Device::cuda(g_world.local_rank % n) : d;
}
int64_t bytes_reduced() { return g_world.bytes; }

std::string backend_name(Device d) {
  if (!g_world.active) return "none";
  if (d.is_cuda()) return "nccl";
  return g_world.launched && mpi_built() ? "mpi" : "none";  // a world of one sums CPU tensors by doing nothing
}

namespace {
int64_t payload_bytes(const std::vector<Tensor>& tensors) {
  int64_t bytes = 0;
  for (const Tensor& t : tensors) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}
}  // namespace

void all_reduce(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return;
  check_tensors(tensors, "all_reduce");
  check_summable(tensors, "all_reduce");
  if (!g_world.active) return;
  if (tensors[0].is_cuda()) {
    detail::nccl_all_reduce(tensors, g_world.rank, g_world.size, g_world.timeout_s);
    g_world.bytes += payload_bytes(tensors);
    return;
  }
#ifdef MINIGRAD_WITH_MPI
  if (g_world.launched) mpi_all_reduce_cpu(tensors);
#endif
}

void all_reduce_start(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return;
  check_tensors(tensors, "all_reduce_start");
  check_summable(tensors, "all_reduce_start");
  if (!g_world.active) return;
  if (!tensors[0].is_cuda()) return all_reduce(tensors);
  detail::nccl_all_reduce_start(tensors, g_world.rank, g_world.size, g_world.timeout_s);
  g_world.bytes += payload_bytes(tensors);
}

void all_reduce_wait() {
  if (g_world.active) detail::nccl_all_reduce_wait(g_world.timeout_s);
}

std::vector<double> all_reduce(std::vector<double> values) {
  if (!g_world.launched || values.empty()) return values;
#ifdef MINIGRAD_WITH_MPI
  std::vector<MPI_Request> reqs(1);
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                           MPI_COMM_WORLD, &reqs[0]), "MPI_Iallreduce");
  wait_all(reqs, "all_reduce of " + std::to_string(values.size()) + " host values");
  g_world.bytes += static_cast<int64_t>(values.size() * sizeof(double));
#endif
  return values;
}

int64_t all_reduce_max(int64_t value) {
  if (!g_world.launched) return value;
#ifdef MINIGRAD_WITH_MPI
  std::vector<MPI_Request> reqs(1);
  long long v = value;
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD, &reqs[0]), "MPI_Iallreduce");
  wait_all(reqs, "all_reduce_max");
  value = v;
#endif
  return value;
}

void broadcast(const std::vector<Tensor>& tensors, int root) {
  MG_CHECK(root >= 0 && root < g_world.size, "mg::dist::broadcast: root " << root << " is not a rank of a world of "
                                                                         << g_world.size);
  if (tensors.empty()) return;
  check_tensors(tensors, "broadcast");
  if (!g_world.active) return;
  if (tensors[0].is_cuda()) {
    detail::nccl_broadcast(tensors, root, g_world.rank, g_world.size, g_world.timeout_s);
    return;
  }
#ifdef MINIGRAD_WITH_MPI
  if (!g_world.launched) return;
  std::vector<MPI_Request> reqs;
  for (const Tensor& t : tensors) {
    MPI_Request r;
    MG_CHECK(t.nbytes() < (size_t{1} << 31), "mg::dist::broadcast: a tensor of " << t.nbytes() << " bytes (at most 2^31 - 1)");
    mpi_check(MPI_Ibcast(t.raw_data(), static_cast<int>(t.nbytes()), MPI_BYTE, root, MPI_COMM_WORLD, &r), "MPI_Ibcast");
    reqs.push_back(r);
  }
  wait_all(reqs, "broadcast of " + std::to_string(tensors.size()) + " tensors");
#endif
}

void barrier() {
  if (!g_world.launched) return;
#ifdef MINIGRAD_WITH_MPI
  std::vector<MPI_Request> reqs(1);
  mpi_check(MPI_Ibarrier(MPI_COMM_WORLD, &reqs[0]), "MPI_Ibarrier");
  wait_all(reqs, "barrier");
#endif
}

void check_same(const std::string& what, const std::string& value) {
  if (!g_world.launched) return;
#ifdef MINIGRAD_WITH_MPI
  const std::vector<std::string> all = all_gather_strings(value, what);
  std::ostringstream diff;
  for (int r = 1; r < g_world.size; ++r) {
    if (all[r] != all[0]) diff << "\n  rank " << r << " differs from rank 0 at " << first_difference(all[r], all[0]);
  }
  MG_CHECK(diff.str().empty(), "mg::dist: the " << what << " is not the same on every rank:" << diff.str());
#else
  (void)what;
  (void)value;
#endif
}

namespace {
// "name shape dtype" per line; with_device adds the device's type (ranks differ in CUDA indices).
std::string describe_named(const std::vector<std::pair<std::string, Tensor>>& named, bool with_device = false) {
  std::ostringstream s;
  for (const auto& [name, t] : named) {
    s << name << " " << shape_str(t.shape()) << " " << dtype_name(t.dtype());
    if (with_device) s << " " << (t.is_cuda() ? "cuda" : "cpu");
    s << "\n";
  }
  return s.str();
}
}  // namespace

void check_same_parameters(const std::vector<std::pair<std::string, Tensor>>& named) {
  check_same("model (parameter names, shapes and dtypes)", describe_named(named));
}

void broadcast_buffers(const std::vector<std::pair<std::string, Tensor>>& named, int root) {
  MG_CHECK(root >= 0 && root < g_world.size, "mg::dist::broadcast_buffers: root " << root
                                                 << " is not a rank of a world of " << g_world.size);
  if (g_world.size == 1) return;  // rank 0 holds them already
  // One broadcast per device type, host buffers first: the same calls on every rank (CUDA
  // indices differ between ranks; one rank's CUDA buffers share one device, as its NCCL
  // communicator does).
  std::vector<Tensor> host, cuda;
  for (const auto& [name, t] : named) {
    MG_CHECK(t.defined(), "mg::dist::broadcast_buffers: buffer " << name << " is undefined");
    (t.is_cuda() ? cuda : host).push_back(t);
    MG_CHECK(!t.is_cuda() || t.device() == cuda[0].device(),
             "mg::dist::broadcast_buffers: buffers on " << cuda[0].device().str() << " and " << t.device().str()
                                                        << " (" << name << "): one CUDA device per rank");
  }
  // Called every step: compare a 63-bit FNV-1a fingerprint of the list (two small reductions),
  // and only when it differs gather the lists themselves for check_same's message. Different
  // lists would otherwise broadcast mismatched bytes.
  const std::string desc = describe_named(named, true);
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : desc) h = (h ^ c) * 1099511628211ull;
  const int64_t fp = static_cast<int64_t>(h >> 1);
  if (all_reduce_max(fp) != -all_reduce_max(-fp)) check_same("model's buffers (names, shapes, dtypes and devices)", desc);
  broadcast(host, root);
  broadcast(cuda, root);
}

void record_timeline(bool on) { detail::nccl_record_timeline(on); }
void timeline_mark(std::string_view name) { detail::nccl_timeline_mark(name); }
std::vector<TimelineSpan> timeline() { return detail::nccl_timeline(); }

std::string timeline_trace_json(const std::vector<TimelineSpan>& spans) {
  // Trace Event Format: complete events ("X") for spans, instant events ("i") for marks; pid is
  // the rank, tid the stream.
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  const bool copies = std::any_of(spans.begin(), spans.end(), [](const TimelineSpan& s) { return s.stream == "copy"; });
  for (const char* stream : {"compute", "nccl", "copy"}) {
    if (std::string(stream) == "copy" && !copies) continue;  // offload's row, when it copied
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", g_world.rank},
                      {"tid", stream}, {"args", {{"name", std::string(stream) + " stream"}}}});
  }
  for (const TimelineSpan& s : spans) {
    nlohmann::ordered_json e = {{"name", s.name}, {"pid", g_world.rank}, {"tid", s.stream},
                                {"ts", s.begin_ms * 1000.0}};
    if (s.stream != "compute" || s.end_ms > s.begin_ms) {  // a reduction stays a span, even an empty one
      e["ph"] = "X";
      e["dur"] = (s.end_ms - s.begin_ms) * 1000.0;
    } else {
      e["ph"] = "i";
      e["s"] = "t";
    }
    events.push_back(std::move(e));
  }
  nlohmann::ordered_json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump(1);
}

namespace detail {

void broadcast_bytes(void* data, size_t n, int root, const char* what) {
  if (g_world.size == 1) return;  // a world of one, launched or not: rank 0 holds them
#ifdef MINIGRAD_WITH_MPI
  MG_CHECK(n < (size_t{1} << 31), "mg::dist: broadcast of " << what << ": " << n << " bytes (at most 2^31 - 1)");
  std::vector<MPI_Request> reqs(1);
  mpi_check(MPI_Ibcast(data, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD, &reqs[0]), "MPI_Ibcast");
  wait_all(reqs, std::string("broadcast of ") + what);
#else
  (void)data;
  (void)n;
  (void)root;
  MG_FAIL("mg::dist: broadcast of " << what << " over " << g_world.size << " ranks, but this build has no MPI");
#endif
}

}  // namespace detail

}  // namespace mg::dist
