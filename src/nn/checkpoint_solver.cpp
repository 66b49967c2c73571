// The cost model of Note [checkpoint cost model] (minigrad/nn/checkpoint_plan.h) and the planners over it:
// plain arithmetic over a measured ChainCost, with no tape, allocator or tensors, so that
// tests/test_planner.cpp can check the solver on made-up chains against enumeration.
#include <minigrad/nn/checkpoint_plan.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include <minigrad/util/bytes.h>

#include "nn/checkpoint_segments.h"

namespace mg::nn {

// ---- the cost model ------------------------------------------------------------------------

namespace {

// A moment of a step: bytes in use (relative to R), the unit running and the phase.
struct Moment {
  size_t bytes = 0;
  size_t unit = 0;
  const char* phase = "";
};

// What a piece of the chain adds, relative to R (the bytes earlier units keep). Its forward and
// backward peaks are kept apart: an offloaded segment just before the piece still holds its
// device copies through the piece's forward, and the last offloaded segment before it is coming
// back during the piece's backward (Note [offload schedule] in minigrad/core/checkpoint.h).
struct PieceCost {
  Moment fwd, bwd;
  size_t kept = 0;         // R grows by this
  size_t host = 0;         // bytes it moves to the host pool (offloaded pieces)
  bool holds_out = false;  // the piece's last unit keeps its output
  // A moment's phase names its side: the forward's phases begin with "forward".
  void note(size_t bytes, size_t unit, const char* phase) {
    Moment& m = std::strncmp(phase, "forward", 7) == 0 ? fwd : bwd;
    if (bytes > m.bytes) m = {bytes, unit, phase};
  }
  // The peak above R with q bytes pending in forward and p bytes prefetched in backward.
  size_t peak(size_t q, size_t p) const { return std::max(fwd.bytes + q, bwd.bytes + p); }
  Moment peak_moment(size_t q, size_t p) const {
    return fwd.bytes + q >= bwd.bytes + p ? Moment{fwd.bytes + q, fwd.unit, fwd.phase} : Moment{bwd.bytes + p, bwd.unit, bwd.phase};
  }
};

// The backward of a checkpointed segment [s, e), whole or one tile: the units replayed on top of
// `base` (with `incoming` bytes of incoming gradient waiting besides it), then backpropagated in
// reverse, and the input gradient handed to the boundary leaf. `t` is the chain at the rows
// replayed (the batch's, or a tile's). An offloaded segment (`replay` null) is not replayed: what
// its units keep comes back from the host pool whole, beside a saved output kept on the device.
void note_replay_backward(PieceCost& pc, const ChainCost& t, size_t s, size_t e, size_t base, size_t incoming,
                          bool wants_dx0, const char* replay, const char* backward, const char* end) {
  auto A = [&](size_t k) { return t.activation_bytes(k); };
  std::vector<size_t> r_before(e - s);
  std::vector<char> keep_in(e - s);
  size_t R = 0;
  bool h = true;
  for (size_t u = s; u < e; ++u) {
    const UnitCost& U = t.units[u];
    const size_t replay_peak = U.replay_peak ? U.replay_peak : U.fwd_peak;  // Note [replay peak]
    if (replay) pc.note(base + incoming + R + (u > s ? A(u) : 0) + replay_peak, u, replay);
    r_before[u - s] = R;
    keep_in[u - s] = u > s && (h || U.saves_input);
    R += (keep_in[u - s] ? A(u) : 0) + U.extra_bytes + U.leaf_only_bytes;
    h = U.saves_output;
  }
  if (!replay) pc.note(base + incoming + R + (h ? A(e) : 0), e - 1, "backward of an offloaded segment (its activations back)");
  for (size_t u = e; u-- > s;) {
    const UnitCost& U = t.units[u];
    const size_t in_flight = u + 1 == e ? incoming : A(u + 1);  // the gradient in flight
    pc.note(base + r_before[u - s] + (keep_in[u - s] ? A(u) : 0) + U.extra_bytes + U.leaf_only_bytes +
                (U.saves_output ? A(u + 1) : 0) + in_flight + U.bwd_peak,
            u, backward);
  }
  if (wants_dx0) pc.note(base + A(s), s, end);
}

// The forward of a checkpointed (or offloaded) segment [s, e): its units run as plain ones, on
// the boundary A_s, but for the inputs without history their nodes keep for a replay (a plain
// step frees those). Returns what they keep, A_s included, and whether the last keeps its output.
size_t note_first_pass(PieceCost& pc, const ChainCost& c, size_t s, size_t e, const char* phase, bool* holds_out) {
  size_t R = 0;
  bool h = true;
  for (size_t u = s; u < e; ++u) {
    const UnitCost& U = c.units[u];
    pc.note(c.fixed_bytes + R + c.activation_bytes(u) + U.fwd_peak, u, phase);
    R += ((h || U.saves_input) ? c.activation_bytes(u) : 0) + U.extra_bytes + U.leaf_only_bytes;
    h = U.saves_output;
  }
  if (holds_out) *holds_out = h;
  return R;
}

// Units [s, e), checkpointed or plain, entered with `holds` = the previous unit keeps A_s.
PieceCost eval_piece(const ChainCost& c, size_t s, size_t e, bool ckpt, bool holds) {
  const size_t n = c.units.size();
  auto A = [&](size_t k) { return c.activation_bytes(k); };
  const size_t F = c.fixed_bytes;
  const bool wants_dx0 = s > 0 || c.input_requires_grad;
  PieceCost pc;
  if (!ckpt) {
    size_t R = 0;
    for (size_t u = s; u < e; ++u) {
      const UnitCost& U = c.units[u];
      const bool keep_in = holds || U.saves_input;
      const size_t fwd = F + R + A(u) + U.fwd_peak;
      // The last unit's output (the logits) is live in its backward unless a cross-entropy head
      // took it: that loss keeps the probabilities (or, in bf16 on the CPU, the logits), and
      // they go once its backward is done, before this unit's.
      const bool out_live = U.saves_output || (u + 1 == n && c.head_bytes == 0);
      const size_t bwd = F + R + (keep_in ? A(u) : 0) + U.extra_bytes + (out_live ? A(u + 1) : 0) +
                         A(u + 1) + U.bwd_peak;
      pc.note(fwd, u, "forward");
      pc.note(bwd, u, "backward");
      R += (keep_in ? A(u) : 0) + U.extra_bytes;
      holds = U.saves_output;
    }
    pc.kept = R;
    pc.holds_out = holds;
    return pc;
  }
  // First pass: the units run as plain ones, then all but the input is dropped.
  note_first_pass(pc, c, s, e, "forward (checkpointed segment, first pass)", nullptr);
  // What the first pass kept goes, but for extras something else holds and the inputs without
  // history the replay needs (UnitCost::leaf_bytes).
  for (size_t u = s; u < e; ++u) {
    const UnitCost& U = c.units[u];
    pc.kept += U.extra_held_bytes + U.leaf_bytes + U.leaf_only_bytes;
  }
  pc.kept += A(s);
  pc.holds_out = false;
  // Backward: the boundary and (for the last piece) the caller's logits stay live throughout;
  // the incoming gradient through the replay, until the segment's last unit has used it.
  // The caller's logits stay live unless a cross-entropy head took them (as for a plain last unit).
  const size_t base = F + A(s) + (e == n && c.head_bytes == 0 ? A(n) : 0);
  note_replay_backward(pc, c, s, e, base, A(e), wants_dx0, "replay (forward again during backward)",
                       "backward of a replayed segment",
                       "end of a replayed segment (the input gradient, taken by the boundary leaf)");
  return pc;
}

// Units [s, e) checkpointed in tiles, with t the chain measured at the tile's rows (Note
// [checkpoint cost model], Note [tiled segments]).
PieceCost eval_tiled_piece(const ChainCost& c, const ChainCost& t, size_t s, size_t e) {
  const size_t n = c.units.size();
  auto A = [&](size_t k) { return c.activation_bytes(k); };  // the batch's
  auto At = [&](size_t k) { return t.activation_bytes(k); };  // a tile's
  const size_t F = c.fixed_bytes;
  const bool wants_dx0 = s > 0 || c.input_requires_grad;
  PieceCost pc;
  {  // the first tile, recorded: the units as plain ones at the tile's rows, on a view of the input
    size_t R = 0;
    bool h = true;
    for (size_t u = s; u < e; ++u) {
      const UnitCost& U = t.units[u];
      pc.note(F + A(s) + R + (u > s ? At(u) : 0) + U.fwd_peak, u, "forward (tiled segment, first tile)");
      R += ((u > s && (h || U.saves_input)) ? At(u) : 0) + U.extra_bytes + U.leaf_only_bytes;
      h = U.saves_output;
    }
  }
  pc.note(F + A(s) + At(e) + A(e), e - 1, "forward (tiled segment, the first tile copied into the output)");
  for (size_t u = s; u < e; ++u) {  // the other tiles, replayed without recording
    pc.note(F + A(s) + A(e) + (u > s ? At(u) : 0) + t.units[u].fwd_peak, u, "forward (tiled segment, later tiles)");
  }
  // The boundary, and what the first tile's nodes keep for the replays: their extras something else
  // holds and their inputs without history (UnitCost::leaf_bytes), at the tile's rows.
  pc.kept = A(s);
  for (size_t u = s; u < e; ++u) {
    const UnitCost& U = t.units[u];
    pc.kept += U.extra_held_bytes + U.leaf_bytes + U.leaf_only_bytes;
  }
  pc.holds_out = false;
  // Backward, tile by tile: the boundary, the incoming gradient and the input gradient are whole.
  const size_t base = F + A(s) + (e == n ? A(n) : 0) + A(e) + (wants_dx0 ? A(s) : 0);
  // The tile's input and incoming gradient are views of the whole ones in base: no bytes of their own.
  note_replay_backward(pc, t, s, e, base, 0, wants_dx0, "replay of a tile (forward again during backward)",
                       "backward of a tile", "end of a tile (its input gradient, copied into its rows of the whole)");
  return pc;
}

// Units [s, e) offloaded (Note [offload] in minigrad/core/checkpoint.h): the forward of a
// checkpointed segment's first pass; then what the units keep goes to the host pool, but for the
// boundary (kept on the device, as a checkpointed segment keeps it) and a saved output (the last
// unit's, kept on the device as a plain unit keeps it). In backward it all comes back, and the
// units backpropagate as plain ones.
PieceCost eval_offload_piece(const ChainCost& c, size_t s, size_t e) {
  const size_t n = c.units.size();
  auto A = [&](size_t k) { return c.activation_bytes(k); };
  const size_t F = c.fixed_bytes;
  PieceCost pc;
  bool h = true;
  const size_t R = note_first_pass(pc, c, s, e, "forward (offloaded segment)", &h);
  size_t held = 0;  // extras something else holds: they stay on the device
  for (size_t u = s; u < e; ++u) held += c.units[u].extra_held_bytes;
  pc.kept = A(s) + held;
  pc.host = R - A(s) - held;
  pc.holds_out = h;
  const size_t base = F + A(s) + (e == n && !h && c.head_bytes == 0 ? A(n) : 0);
  note_replay_backward(pc, c, s, e, base, A(e), s > 0 || c.input_requires_grad, nullptr,
                       "backward of an offloaded segment", "end of an offloaded segment (the input gradient)");
  return pc;
}

// The chain at `tile_rows` rows for a tiled segment over units [s, e), checked.
const ChainCost& tile_chain(const ChainCost& c, size_t s, size_t e, int64_t tile_rows) {
  const ChainCost* t = c.tile_cost(tile_rows);
  MG_CHECK(t != nullptr, "checkpoint plan: a segment runs in tiles of " << tile_rows << " rows, but the chain was not "
                                                                           "measured at "
                                                                        << tile_rows << " rows (MeasureOptions::tile_rows)");
  MG_CHECK(t->units.size() == c.units.size(), "checkpoint plan: the chain measured at " << tile_rows
                                                                                        << " rows has other units");
  for (size_t u = s; u < e; ++u) {
    MG_CHECK(c.units[u].tiles, "checkpoint plan: unit " << u << " (" << c.units[u].name
                                                        << ") cannot run in tiles (Note [tiled segments])");
  }
  return *t;
}

PieceCost eval_any_piece(const ChainCost& c, size_t s, size_t e, bool ckpt, bool holds, int64_t tile_rows,
                         bool offload) {
  if (offload) return eval_offload_piece(c, s, e);
  if (ckpt && tile_rows > 0 && tile_rows < c.rows) return eval_tiled_piece(c, tile_chain(c, s, e, tile_rows), s, e);
  return eval_piece(c, s, e, ckpt, holds);
}

struct UnitPiece {
  size_t s, e;
  bool ckpt;
  int64_t tile_rows = 0;
  bool offload = false;
};

// Layer segments -> the unit pieces that cover the chain.
std::vector<UnitPiece> to_pieces(const ChainCost& c, const std::vector<Segment>& segments) {
  check_segments(segments, c.num_layers, "checkpoint plan");
  auto unit_at = [&](size_t layer, bool is_end) -> size_t {
    for (size_t u = 0; u < c.units.size(); ++u) {
      if (!is_end && c.units[u].begin == layer) return u;
      if (is_end && c.units[u].end == layer) return u + 1;
    }
    MG_FAIL("checkpoint plan: a segment " << (is_end ? "ends" : "starts") << " at layer " << layer
                                          << ", inside a unit (a view layer such as Flatten belongs "
                                             "to the layer after it); move the boundary");
  };
  std::vector<UnitPiece> pieces;
  size_t pos = 0;
  for (const Segment& g : segments) {
    const size_t s = unit_at(g.begin, false), e = unit_at(g.end, true);
    for (; pos < s; ++pos) pieces.push_back({pos, pos + 1, false});
    MG_CHECK(!(g.offload && g.tile_rows > 0), "checkpoint plan: segment [" << g.begin << ", " << g.end
                                                                          << ") is offloaded and in tiles; choose one");
    pieces.push_back({s, e, true, g.tile_rows, g.offload});
    pos = e;
  }
  for (; pos < c.units.size(); ++pos) pieces.push_back({pos, pos + 1, false});
  return pieces;
}

// The loss: its forward with the logits and the probabilities (and the device copies of an
// offloaded last segment, pending); its backward, where the logits' gradient takes the
// probabilities' bytes (the caller keeps no logits past the loss; the last unit may).
// The last offloaded segment starts coming back only after it, when backward reaches the chain's
// output (Note [offload schedule]).
Moment head_moment(const ChainCost& c, size_t R, size_t q, bool holds) {
  const size_t n = c.units.size();
  const size_t base = c.fixed_bytes + R + c.activation_bytes(n);
  const size_t fwd = base + c.head_bytes + q;
  // A measured head holds the output itself (in base) and makes its gradient (in its bytes).
  const size_t bwd = base + c.head_backward_bytes + (holds && !c.head_measured ? c.activation_bytes(n) : 0);
  return fwd >= bwd ? Moment{fwd, n - 1, "loss (end of forward)"} : Moment{bwd, n - 1, "loss (its backward)"};
}

double piece_flops(const ChainCost& c, size_t s, size_t e) {
  double f = 0;
  for (size_t u = s; u < e; ++u) f += c.units[u].flops;
  return f;
}

// A checkpointed piece's forward work done again: its units', or for tiles the tile's units' for
// as many tiles as the batch holds (the same FLOPs; with measured times, the tiles' own speed).
double recompute_of(const ChainCost& c, size_t s, size_t e, const ChainCost* tile) {
  if (!tile) return piece_flops(c, s, e);
  return piece_flops(*tile, s, e) * static_cast<double>(c.rows) / static_cast<double>(tile->rows);
}

// The link's time that a plan cannot hide (Note [offload schedule]). Where copies run beside
// compute (ChainCost::copies_overlap: CUDA), the copy to the host of an offloaded segment hides
// behind the next piece's forward, and the copy back behind the backward of everything from the
// next offloaded segment (or the loss) down to it; elsewhere (the CPU's copies, done by the thread
// that runs the model) every copy is exposed. Walked piece by piece in forward order, with
// `pending` the last piece's offloaded bytes (0 unless it was offloaded), `coming` the last
// offloaded piece's and `window` the backward milliseconds since it.
struct LinkClock {
  size_t pending = 0, coming = 0;
  double window = 0;
  double to_host(const ChainCost& c, size_t b) const { return static_cast<double>(b) / c.to_host_bytes_per_ms; }
  double from_host(const ChainCost& c, size_t b) const { return static_cast<double>(b) / c.from_host_bytes_per_ms; }
  // The exposed milliseconds a piece settles, and the clock moved past it.
  double step(const ChainCost& c, bool offloaded, size_t host, double fwd_ms, double bwd_ms) {
    if (!c.copies_overlap) return offloaded ? to_host(c, host) + from_host(c, host) : 0.0;
    double ms = pending ? std::max(0.0, to_host(c, pending) - fwd_ms) : 0.0;
    pending = offloaded ? host : 0;
    if (offloaded && host > 0) {
      ms += coming ? std::max(0.0, from_host(c, coming) - (window + bwd_ms)) : 0.0;
      coming = host;
      window = 0;
    } else {
      window += bwd_ms;
    }
    return ms;
  }
  // What the end of the chain settles: the last copy to the host, and the last copy back (from
  // the start of backward).
  double end(const ChainCost& c) const {
    if (!c.copies_overlap) return 0.0;
    return (pending ? to_host(c, pending) : 0.0) + (coming ? std::max(0.0, from_host(c, coming) - window) : 0.0);
  }
};

// A piece's forward and backward milliseconds (a replayed piece's backward runs its forward again).
double piece_forward_ms(const ChainCost& c, size_t s, size_t e) {
  double ms = 0;
  for (size_t u = s; u < e; ++u) ms += c.units[u].forward_ms;
  return ms;
}
double piece_backward_ms(const ChainCost& c, size_t s, size_t e, bool replayed) {
  double ms = replayed ? piece_forward_ms(c, s, e) : 0.0;
  for (size_t u = s; u < e; ++u) ms += c.units[u].backward_ms;
  return ms;
}

// The chain's forward FLOPs per millisecond: the planner prices link time in the unit of
// UnitCost::flops (FLOPs, or milliseconds for the joint planner, where this is 1).
double flops_per_ms(const ChainCost& c) {
  double flops = 0, ms = 0;
  for (const UnitCost& u : c.units) flops += u.flops, ms += u.forward_ms;
  return flops / ms;
}

}  // namespace

bool offload_offered(const ChainCost& cost) {
  double ms = 0;
  for (const UnitCost& u : cost.units) ms += u.forward_ms;
  return cost.to_host_bytes_per_ms > 0 && cost.from_host_bytes_per_ms > 0 && ms > 0;
}

size_t predict_host_peak(const ChainCost& cost, const std::vector<Segment>& segments) {
  size_t host = 0;
  for (const UnitPiece& p : to_pieces(cost, segments)) {
    if (p.offload) host += eval_offload_piece(cost, p.s, p.e).host;
  }
  return host;
}

double offload_ms(const ChainCost& cost, const std::vector<Segment>& segments) {
  if (predict_host_peak(cost, segments) == 0) return 0.0;
  LinkClock clock;
  double ms = 0;
  bool holds = true;
  for (const UnitPiece& p : to_pieces(cost, segments)) {
    const PieceCost pc = eval_any_piece(cost, p.s, p.e, p.ckpt, holds, p.tile_rows, p.offload);
    ms += clock.step(cost, p.offload, pc.host, piece_forward_ms(cost, p.s, p.e),
                     piece_backward_ms(cost, p.s, p.e, p.ckpt && !p.offload));
    holds = pc.holds_out;
  }
  return ms + clock.end(cost);
}

PeakBreakdown explain_peak(const ChainCost& cost, const std::vector<Segment>& segments) {
  MG_CHECK(!cost.units.empty(), "predict_peak: the chain has no units (measure it first)");
  PeakBreakdown out;
  size_t R = 0;
  size_t by[3] = {0, 0, 0};  // plain, replayed, offloaded
  bool holds = true;  // the caller holds the input
  auto take = [&](size_t peak, size_t unit, std::string phase) {
    out.peak = peak;
    out.unit = unit;
    out.phase = std::move(phase);
    out.kept_by_earlier = R;
    out.kept_plain = by[0], out.kept_replayed = by[1], out.kept_offloaded = by[2];
  };
  size_t q = 0, p = 0;  // Note [offload schedule]: pending in forward, prefetched in backward
  for (const UnitPiece& x : to_pieces(cost, segments)) {
    PieceCost pc = eval_any_piece(cost, x.s, x.e, x.ckpt, holds, x.tile_rows, x.offload);
    const Moment m = pc.peak_moment(q, p);
    if (R + m.bytes > out.peak) take(R + m.bytes, m.unit, m.phase);
    R += pc.kept;
    by[x.offload ? 2 : x.ckpt ? 1 : 0] += pc.kept;
    holds = pc.holds_out;
    q = x.offload ? pc.host : 0;
    if (x.offload && pc.host > 0) p = pc.host;
  }
  const Moment h = head_moment(cost, R, q, holds);
  if (h.bytes > out.peak) take(h.bytes, h.unit, h.phase);
  const UnitCost& u = cost.units[out.unit];
  out.where = out.phase + " of unit " + std::to_string(out.unit) + " (layers [" + std::to_string(u.begin) + ", " +
              std::to_string(u.end) + "): " + u.name + "), with " + format_bytes(out.kept_by_earlier) +
              " kept by earlier units and " + format_bytes(cost.fixed_bytes) + " fixed";
  return out;
}

std::vector<UnitMemory> unit_memory(const ChainCost& cost, const std::vector<Segment>& segments) {
  std::vector<UnitMemory> out(cost.units.size());
  bool holds = true;
  for (const UnitPiece& p : to_pieces(cost, segments)) {
    const PieceCost pc = eval_any_piece(cost, p.s, p.e, p.ckpt, holds, p.tile_rows, p.offload);
    if (!p.ckpt) {
      out[p.s] = {"keep", pc.kept, 0, 0};
    } else {
      // What the units would keep as plain ones, inside the segment (its boundary aside).
      bool h = true;
      for (size_t u = p.s; u < p.e; ++u) {
        const UnitCost& U = cost.units[u];
        const size_t own = (u > p.s && (h || U.saves_input) ? cost.activation_bytes(u) : 0) + U.extra_bytes;
        h = U.saves_output;
        UnitMemory& m = out[u];
        m.choice = p.offload ? "offload" : p.tile_rows > 0 && p.tile_rows < cost.rows ? "tiles of " + std::to_string(p.tile_rows)
                                                                                      : "recompute";
        (p.offload ? m.offloaded : m.dropped) = own - U.extra_held_bytes;
      }
      out[p.s].kept = pc.kept;
    }
    holds = pc.holds_out;
  }
  return out;
}

size_t predict_peak(const ChainCost& cost, const std::vector<Segment>& segments) {
  return explain_peak(cost, segments).peak;
}

double recompute_flops(const ChainCost& cost, const std::vector<Segment>& segments) {
  double f = 0;
  for (const UnitPiece& p : to_pieces(cost, segments)) {
    if (!p.ckpt || p.offload) continue;
    const bool tiled = p.tile_rows > 0 && p.tile_rows < cost.rows;
    f += recompute_of(cost, p.s, p.e, tiled ? &tile_chain(cost, p.s, p.e, p.tile_rows) : nullptr);
  }
  return f;
}

// ---- plans ---------------------------------------------------------------------------------

std::string Plan::str() const {
  if (segments.empty()) return "no checkpointing";
  std::string s;
  for (const Segment& g : segments) {
    // Appended piece by piece: "[" + std::to_string(...) trips GCC 12's -Wrestrict (a false
    // positive) once inlined here.
    if (!s.empty()) s += ' ';
    s += '[';
    s += std::to_string(g.begin);
    s += ',';
    s += std::to_string(g.end);
    s += ')';
    if (g.tile_rows > 0) {
      s += '/';
      s += std::to_string(g.tile_rows);
    }
    if (g.offload) s += "@host";
  }
  return s;
}

namespace {

Plan finish(const ChainCost& c, std::string kind, std::vector<Segment> segments) {
  Plan p;
  p.kind = std::move(kind);
  p.segments = std::move(segments);
  p.predicted_peak = predict_peak(c, p.segments);
  p.recompute_flops = recompute_flops(c, p.segments);
  p.predicted_host_peak = predict_host_peak(c, p.segments);
  p.offload_ms = offload_ms(c, p.segments);
  return p;
}

// Moves layer boundaries that fall inside a unit to the unit's start; drops emptied segments.
std::vector<Segment> snap_to_units(const ChainCost& c, const std::vector<Segment>& segments) {
  auto snap = [&](size_t layer) {
    for (const UnitCost& u : c.units) {
      if (layer >= u.begin && layer < u.end) return u.begin;
    }
    return layer;  // == num_layers
  };
  std::vector<Segment> out;
  for (const Segment& g : segments) {
    Segment s{snap(g.begin), snap(g.end)};
    if (!out.empty()) s.begin = std::max(s.begin, out.back().end);
    if (s.begin < s.end) out.push_back(s);
  }
  return out;
}

enum class Objective { least_recompute, least_peak };

struct Label {
  size_t R = 0;
  size_t H = 0;  // bytes offloaded so far (the host pool's peak is all of them)
  size_t Q = 0;  // the last piece's offloaded bytes, when it was offloaded (pending in the next forward)
  size_t P = 0;  // the last offloaded piece's bytes (prefetched in the backward of the pieces after it)
  LinkClock clock;  // the link's time so far (Note [offload schedule])
  double cost = 0;
  size_t peak = 0;
  bool holds = true;
  int parent = -1;
  size_t from = 0;  // the piece that led here: units [from, here)
  bool ckpt = false;
  int64_t tile_rows = 0;
  bool offload = false;
  int64_t tiles = 0;  // tiles run per step: of two plans with equal cost, fewer tiles run faster
};

// Dynamic programme over the chain (Note [checkpoint cost model]): exact for the cost model.
// Returns the layer segments of the best plan, or one segment starting at SIZE_MAX when nothing
// fits the budget (plan_budget reports it, with the smallest feasible peak).
std::vector<Segment> solve(const ChainCost& c, Objective obj, size_t budget, size_t* best_peak) {
  const size_t n = c.units.size();
  MG_CHECK(n > 0, "checkpoint planner: the chain has no units (measure it first)");
  // Precomputed pieces: plain single units (two entry states) and checkpointed ranges.
  std::vector<std::array<PieceCost, 2>> plain(n);
  for (size_t s = 0; s < n; ++s) {
    plain[s][0] = eval_piece(c, s, s + 1, false, false);
    plain[s][1] = eval_piece(c, s, s + 1, false, true);
  }
  std::vector<std::vector<PieceCost>> ck(n, std::vector<PieceCost>(n + 1));
  for (size_t s = 0; s < n; ++s) {
    for (size_t e = s + 1; e <= n; ++e) ck[s][e] = eval_piece(c, s, e, true, false);
  }
  // Tiled segments: per tile size, the ranges whose units can all run in tiles.
  std::vector<const ChainCost*> tiles;
  for (const ChainCost& t : c.tile_costs) {
    if (t.rows < c.rows && t.units.size() == n) tiles.push_back(&t);
  }
  std::vector<std::vector<std::vector<PieceCost>>> tk(tiles.size(), std::vector<std::vector<PieceCost>>(n));
  for (size_t k = 0; k < tiles.size(); ++k) {
    for (size_t s = 0; s < n; ++s) {
      for (size_t e = s + 1; e <= n && c.units[e - 1].tiles; ++e) tk[k][s].push_back(eval_tiled_piece(c, *tiles[k], s, e));
    }
  }
  // Offloaded segments, when the chain has a host link.
  const bool offload = offload_offered(c);
  const double rate = offload ? flops_per_ms(c) : 0.0;
  std::vector<std::vector<PieceCost>> off(offload ? n : 0, std::vector<PieceCost>(n + 1));
  for (size_t s = 0; s < off.size(); ++s) {
    for (size_t e = s + 1; e <= n; ++e) off[s][e] = eval_offload_piece(c, s, e);
  }
  auto key = [&](const Label& l) { return obj == Objective::least_recompute ? l.cost : static_cast<double>(l.peak); };
  // Ties: fewer tiles, then the other of (cost, peak).
  auto tie = [&](const Label& l) {
    return std::make_pair(l.tiles, obj == Objective::least_recompute ? static_cast<double>(l.peak) : l.cost);
  };

  std::vector<Label> all;
  std::vector<std::vector<int>> at(n + 1);
  all.push_back(Label{});
  at[0].push_back(0);
  for (size_t s = 0; s <= n; ++s) {
    // Pareto pruning on (R, key) within each holds value.
    std::vector<int> kept;
    for (int holds = 0; holds < 2; ++holds) {
      std::vector<int> idx;
      for (int i : at[s]) {
        if (all[i].holds == static_cast<bool>(holds)) idx.push_back(i);
      }
      std::sort(idx.begin(), idx.end(), [&](int a, int b) {
        const Label &x = all[a], &y = all[b];
        if (x.R != y.R) return x.R < y.R;
        if (key(x) != key(y)) return key(x) < key(y);
        if (tie(x) != tie(y)) return tie(x) < tie(y);
        return x.H < y.H;
      });
      // A label is dominated by an earlier one (R no larger) with no larger key and, where the
      // host pool has a cap, no more bytes offloaded.
      const bool host_capped = c.host_limit != 0;
      std::vector<int> front;  // kept so far within this holds value
      for (int i : idx) {
        bool dominated = false;
        for (int j : front) {
          const LinkClock &cj = all[j].clock, &ci = all[i].clock;
          if (key(all[j]) <= key(all[i]) && all[j].Q <= all[i].Q && all[j].P <= all[i].P &&
              (!host_capped || all[j].H <= all[i].H) && cj.pending <= ci.pending && cj.coming <= ci.coming &&
              cj.window >= ci.window) {
            dominated = true;
            break;
          }
        }
        if (!dominated) front.push_back(i);
      }
      kept.insert(kept.end(), front.begin(), front.end());
    }
    at[s] = std::move(kept);
    if (s == n) break;
    for (int li : at[s]) {
      const Label l = all[li];
      auto extend = [&](size_t e, bool ckpt, const PieceCost& pc, const ChainCost* tile = nullptr, bool offloaded = false) {
        Label m;
        m.R = l.R + pc.kept;
        m.H = l.H + pc.host;
        if (c.host_limit != 0 && m.H > c.host_limit) return;
        m.peak = std::max(l.peak, l.R + pc.peak(l.Q, l.P));
        m.Q = offloaded ? pc.host : 0;
        m.P = offloaded && pc.host > 0 ? pc.host : l.P;
        m.cost = l.cost + (ckpt && !offloaded ? recompute_of(c, s, e, tile) : 0.0);
        if (offload) {
          m.clock = l.clock;
          double link = m.clock.step(c, offloaded, pc.host, piece_forward_ms(c, s, e), piece_backward_ms(c, s, e, ckpt && !offloaded));
          if (e == n) link += m.clock.end(c);
          m.cost += link * rate;
        }
        m.offload = offloaded;
        m.tiles = l.tiles + (tile ? (c.rows + tile->rows - 1) / tile->rows : 0);
        m.holds = pc.holds_out;
        m.parent = li;
        m.from = s;
        m.ckpt = ckpt;
        m.tile_rows = tile ? tile->rows : 0;
        if (e == n) m.peak = std::max(m.peak, head_moment(c, m.R, m.Q, m.holds).bytes);
        if (m.peak > budget) return;
        all.push_back(m);
        at[e].push_back(static_cast<int>(all.size() - 1));
      };
      extend(s + 1, false, plain[s][l.holds ? 1 : 0]);
      for (size_t e = s + 1; e <= n && !c.units[e - 1].checkpoints_inside; ++e) extend(e, true, ck[s][e]);
      for (size_t k = 0; k < tiles.size(); ++k) {
        for (size_t i = 0; i < tk[k][s].size(); ++i) extend(s + 1 + i, true, tk[k][s][i], tiles[k]);
      }
      for (size_t e = s + 1; offload && e <= n && !c.units[e - 1].checkpoints_inside; ++e) {
        extend(e, true, off[s][e], nullptr, true);
      }
    }
  }
  int best = -1;
  for (int i : at[n]) {
    if (best < 0 || key(all[i]) < key(all[best]) ||
        (key(all[i]) == key(all[best]) && tie(all[i]) < tie(all[best]))) {
      best = i;
    }
  }
  if (best < 0) return {{std::numeric_limits<size_t>::max(), 0}};  // nothing fits: caller reports
  if (best_peak) *best_peak = all[best].peak;
  std::vector<Segment> segs;
  // Each label's piece ends where its successor's begins.
  std::vector<int> chain;
  for (int i = best; i >= 0; i = all[i].parent) chain.push_back(i);
  std::reverse(chain.begin(), chain.end());  // chain[0] is the root
  for (size_t k = 1; k < chain.size(); ++k) {
    const Label& l = all[chain[k]];
    const size_t here = k + 1 < chain.size() ? all[chain[k + 1]].from : n;
    if (l.ckpt) segs.push_back({c.units[l.from].begin, c.units[here - 1].end, l.tile_rows, l.offload});
  }
  return segs;
}

}  // namespace

Plan plan_none(const ChainCost& cost) { return finish(cost, "none", {}); }

Plan plan_segments(const ChainCost& cost, int64_t segments) {
  return finish(cost, "segments=" + std::to_string(segments),
                snap_to_units(cost, pytorch_segments(cost.num_layers, segments)));
}

Plan plan_sqrt(const ChainCost& cost) {
  const int64_t k = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(cost.num_layers))));
  Plan p = plan_segments(cost, k);
  p.kind = "sqrt";
  return p;
}

size_t min_feasible_peak(const ChainCost& cost) {
  size_t peak = 0;
  solve(cost, Objective::least_peak, std::numeric_limits<size_t>::max(), &peak);
  return peak;
}

Plan plan_min_peak(const ChainCost& cost) {
  const size_t floor = min_feasible_peak(cost);
  Plan p = plan_budget(cost, floor);
  p.kind = "min-peak";
  return p;
}

Plan plan_budget(const ChainCost& cost, size_t budget) {
  size_t peak = 0;
  std::vector<Segment> segs = solve(cost, Objective::least_recompute, budget, &peak);
  if (!segs.empty() && segs[0].begin == std::numeric_limits<size_t>::max()) {
    const size_t floor = min_feasible_peak(cost);
    MG_FAIL("checkpoint planner: budget " << format_bytes(budget) << " (" << budget
                                          << " bytes) is below the smallest feasible peak "
                                          << format_bytes(floor) << " (" << floor
                                          << " bytes) for this model and input; the fixed part "
                                             "(parameters, gradients, optimizer state, targets) is "
                                          << format_bytes(cost.fixed_bytes)
                                          << ". Use a smaller batch (with gradient accumulation) or "
                                             "a budget of at least the minimum.");
  }
  Plan p = finish(cost, "budget=" + format_bytes(budget), std::move(segs));
  p.budget = budget;
  MG_CHECK(p.predicted_peak == peak, "checkpoint planner: internal error, DP peak " << peak
                                         << " != model peak " << p.predicted_peak);
  return p;
}

namespace {

// A plan's spelling, read: kind none, sqrt, min, segments (K) or budget (SIZE).
struct PlanSpec {
  std::string kind;
  int64_t segments = 0;
  size_t budget = 0;
  std::vector<Segment> list;  // kind "list": the segments spelled out, as Plan::str() prints them
};

// "[0,3)@host [3,6)/4 [8,12)": Plan::str()'s spelling read back (layer ranges; /R tiles of R rows;
// @host offloaded). The ranges are checked against the chain when the plan is made.
std::vector<Segment> read_segment_list(const std::string& spec) {
  auto bad = [&](const std::string& why) {
    MG_FAIL("checkpoint plan: expected segments such as '[0,3)@host [3,6)/4 [8,12)' ([begin,end) layer ranges, /R "
            "for tiles of R rows, @host for offloaded), got '"
            << spec << "': " << why);
  };
  std::vector<Segment> out;
  size_t i = 0;
  auto number = [&]() -> uint64_t {
    const size_t start = i;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) ++i;
    if (i == start || i - start > 9) bad("a number expected at character " + std::to_string(start + 1));
    return std::stoull(spec.substr(start, i - start));
  };
  auto expect = [&](char ch) {
    if (i >= spec.size() || spec[i] != ch) bad(std::string("'") + ch + "' expected at character " + std::to_string(i + 1));
    ++i;
  };
  while (i < spec.size()) {
    if (spec[i] == ' ') {
      ++i;
      continue;
    }
    Segment g;
    expect('[');
    g.begin = number();
    expect(',');
    g.end = number();
    expect(')');
    if (i < spec.size() && spec[i] == '/') {
      ++i;
      g.tile_rows = static_cast<int64_t>(number());
      if (g.tile_rows == 0) bad("tiles of 0 rows");
    }
    if (spec.compare(i, 5, "@host") == 0) {
      i += 5;
      g.offload = true;
    }
    if (g.offload && g.tile_rows > 0) bad("a segment is offloaded or in tiles, not both");
    if (i < spec.size() && spec[i] != ' ') bad("a space expected between segments at character " + std::to_string(i + 1));
    out.push_back(g);
  }
  if (out.empty()) bad("no segment");
  size_t prev_end = 0;
  for (const Segment& g : out) {
    if (g.begin >= g.end || g.begin < prev_end) bad("segments must be non-empty, increasing and disjoint");
    prev_end = g.end;
  }
  return out;
}

PlanSpec read_plan_spec(const std::string& spec) {
  if (spec == "none" || spec == "sqrt" || spec == "min") return {spec, 0, 0, {}};
  if (spec.rfind("segments=", 0) == 0) {
    const std::string v = spec.substr(9);
    MG_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 10,
             "checkpoint plan: segments=K needs a positive integer K, got '" << spec << "'");
    return {"segments", std::stoll(v), 0, {}};
  }
  if (spec.rfind("budget=", 0) == 0) return {"budget", 0, parse_bytes(spec.substr(7)), {}};
  if (!spec.empty() && spec[0] == '[') return {"list", 0, 0, read_segment_list(spec)};
  MG_FAIL("checkpoint plan: expected none, sqrt, min, segments=K, budget=SIZE or segments such as '[0,3)@host [3,6)', got '"
          << spec << "'");
}

}  // namespace

void check_plan_spec(const std::string& spec) { (void)read_plan_spec(spec); }

Plan make_plan(const ChainCost& cost, const std::string& spec) {
  const PlanSpec s = read_plan_spec(spec);
  if (s.kind == "none") return plan_none(cost);
  if (s.kind == "sqrt") return plan_sqrt(cost);
  if (s.kind == "min") return plan_min_peak(cost);
  if (s.kind == "segments") return plan_segments(cost, s.segments);
  if (s.kind == "list") return finish(cost, "given", s.list);
  return plan_budget(cost, s.budget);
}

}  // namespace mg::nn
