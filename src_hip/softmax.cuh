// Generated from src_cuda/softmax.cuh by tools/hipify_sources.py (torch.utils.hipify, torch 2.13.0). Do not edit.
// softmax.cuh: the softmax / log_softmax kernel templates, one per tier.
//
// Every tier reduces a row to the pair (m, d) = (max x, sum exp(x - m)) and
// merges pairs with the online-softmax monoid md_combine. A row is read as
// "slots" of VEC elements aligned to VEC * sizeof(T) bytes: the first and last
// slot of a row may be partial (scalar head / tail), every other slot is one
// aligned vector load. The host guarantees that input and output rows share
// their misalignment (else it launches VEC = 1).
#pragma once
#include "portable.cuh"

namespace ps {

typedef long long i64;

enum Op { kSoftmax = 0, kLogSoftmax = 1 };

template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

// A whole vector's store; kOneInstruction: 16-byte vectors through the vendor header's
// single-instruction store. Only the two-pass split takes it: there the compiler would split
// 16-byte stores into 2- and 4-byte ones (several times the store requests); elsewhere it keeps
// them whole, and the explicit store's four packed registers would cost occupancy.
template <bool kOneInstruction, typename T, int N> PS_DEVICE void store_vector(T* at, const Vec<T, N>& raw) {
  if (kOneInstruction && sizeof(raw) == sizeof(ps_words4)) {
    ps_words4 words;
    memcpy(&words, &raw, sizeof(words));
    ps_store_words4(at, words);
  } else {
    *reinterpret_cast<Vec<T, N>*>(at) = raw;
  }
}

// A vector as stored, widened to the compute type. A bfloat16 is the top half of a float32, so
// pairs widen from their 32-bit word with a shift and a mask and the raw vector stays whole in
// registers (widened element by element, the compiler splits it into 16-bit pieces and joins
// them again to cache it in shared memory).
template <typename T, int VEC> PS_DEVICE void widen(const Vec<T, VEC>& raw, typename compute_of<T>::type* v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) v[j] = to_compute(raw.v[j]);
}
template <int WORDS> PS_DEVICE void widen_bf16_words(const unsigned* words, float* v) {
#pragma unroll
  for (int i = 0; i < WORDS; ++i) {
    const unsigned lo = words[i] << 16, hi = words[i] & 0xffff0000u;
    memcpy(&v[2 * i], &lo, 4);
    memcpy(&v[2 * i + 1], &hi, 4);
  }
}
template <int VEC> PS_DEVICE void widen_bf16_pairs(const Vec<bfloat16_t, VEC>& raw, float* v) {
  unsigned words[VEC / 2];
  memcpy(words, &raw, sizeof(words));
  widen_bf16_words<VEC / 2>(words, v);
}

// A vector of -inf, which adds nothing to (m, d): the values of slots past a row.
template <typename T, int N> PS_DEVICE Vec<T, N> neg_inf_vec() {
  Vec<T, N> v;
#pragma unroll
  for (int j = 0; j < N; ++j) v.v[j] = from_compute<T>(ps_neg_inf<typename compute_of<T>::type>());
  return v;
}
template <> PS_DEVICE void widen(const Vec<bfloat16_t, 8>& raw, float* v) { widen_bf16_pairs(raw, v); }
template <> PS_DEVICE void widen(const Vec<bfloat16_t, 4>& raw, float* v) { widen_bf16_pairs(raw, v); }
template <> PS_DEVICE void widen(const Vec<bfloat16_t, 2>& raw, float* v) { widen_bf16_pairs(raw, v); }

// ---- the (m, d) monoid ----------------------------------------------------
template <typename C> struct MD { C m; C d; };

template <typename C> PS_DEVICE MD<C> md_identity() { MD<C> r = {ps_neg_inf<C>(), C(0)}; return r; }

template <typename C> PS_DEVICE MD<C> md_combine(MD<C> a, MD<C> b) {
  const C m = ps_max_nan(a.m, b.m);
  // Both sides empty or all -inf: exp(-inf - -inf) would be NaN; the sum is 0.
  if (m == ps_neg_inf<C>()) return md_identity<C>();
  // The per-element exp (float64: the precise one): block reductions merge 10-20 pairs a row,
  // and the hardware exp's error of about 1e-6 stays far under float32's 1e-5 bound.
  const ExpMinus<C> exp_minus(m);
  MD<C> r = {m, a.d * exp_minus(a.m) + b.d * exp_minus(b.m)};
  return r;
}

// Streaming (m, d) of values seen a few at a time: the sum is rescaled only when
// the max grows, and compensated (Kahan) so long runs keep float32 accuracy.
template <typename C> struct OnlineSum {
  // m starts at the lowest finite value, not -inf, so that a -inf value adds exp(-inf - m) = 0
  // with no test (exp(-inf - -inf) is NaN), which an early return or a separate shift would cost
  // in the hot loop. d stays 0 until a
  // value above -inf comes (whose own term is 1), so md() tells an empty run by d = 0.
  C m, d, carry;
  PS_DEVICE OnlineSum() : m(ps_lowest<C>()), d(C(0)), carry(C(0)) {}
  // N values at once: one rescale at most, one exp per value, one compensated add.
  template <int N> PS_DEVICE void push_all(const C* v) {
    C top = v[0];
#pragma unroll
    for (int j = 1; j < N; ++j) top = ps_max_nan(top, v[j]);
    raise_to(top);
    push_below<N>(v);
  }
  // The max rises to `top` (the largest of the values still to come), rescaling the sum once, so
  // that those values then add with no test (push_below).
  PS_DEVICE void raise_to(C top) {
    if (top > m || top != top) {
      const C scale = ps_exp(m - top);  // 0 while empty: exp(lowest - top) underflows
      d *= scale;
      carry *= scale;
      m = top;
    }
  }
  // N values no larger than m (after raise_to): one exp per value, one compensated add.
  template <int N> PS_DEVICE void push_below(const C* v) {
    const ExpMinus<C> exp_minus(m);
    C sum = C(0);
#pragma unroll
    for (int j = 0; j < N; ++j) sum += exp_minus(v[j]);
    add(sum);
  }
  PS_DEVICE void add(C term) {  // Kahan
    const C y = term - carry;
    const C t = d + y;
    carry = (t - d) - y;
    d = t;
  }
  PS_DEVICE MD<C> md() const { MD<C> r = {d == C(0) ? ps_neg_inf<C>() : m, d}; return r; }
};

// Butterfly over `width` consecutive lanes; every lane ends with the total.
template <int width, typename C> PS_DEVICE MD<C> md_reduce_lanes(MD<C> md) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset /= 2) {
    MD<C> other = {warp_shfl_xor(md.m, offset, width), warp_shfl_xor(md.d, offset, width)};
    md = md_combine(md, other);
  }
  return md;
}

// The block reductions' scratch, a pair a warp, sized from WARP, not from a guess of it (the
// planner counts it beside the cache: static_bytes). One array for every reduction of a kernel.
template <int WARP, typename C> struct WarpPairs {
  PS_DEVICE static C* m() { PS_SHARED C warp_m[1024 / WARP]; return warp_m; }
  PS_DEVICE static C* d() { PS_SHARED C warp_d[1024 / WARP]; return warp_d; }
};

// Whole-block reduction, final in warp 0 only (every lane of it): warps first, then the first
// warp over the warps' results. One barrier; the caller passes another before the scratch is
// written again.
template <int WARP, typename C> PS_DEVICE MD<C> md_reduce_to_first_warp(MD<C> md) {
  C* warp_m = WarpPairs<WARP, C>::m();
  C* warp_d = WarpPairs<WARP, C>::d();
  const int lane = PS_THREAD_X % WARP;
  const int warp = PS_THREAD_X / WARP;
  const int warps = PS_BLOCK_DIM_X / WARP;
  md = md_reduce_lanes<WARP>(md);
  if (lane == 0) { warp_m[warp] = md.m; warp_d[warp] = md.d; }
  PS_SYNC();
  if (warp == 0) {
    MD<C> part = md_identity<C>();
    if (lane < warps) { part.m = warp_m[lane]; part.d = warp_d[lane]; }
    md = md_reduce_lanes<WARP>(part);
  }
  return md;  // in the other warps, their own warp's
}

// Every thread's copy of warp 0's (m, d) (lane 0 passes it), through the scratch.
template <int WARP, typename C> PS_DEVICE MD<C> md_from_first_warp(MD<C> md) {
  C* warp_m = WarpPairs<WARP, C>::m();
  C* warp_d = WarpPairs<WARP, C>::d();
  if (PS_THREAD_X == 0) { warp_m[0] = md.m; warp_d[0] = md.d; }
  PS_SYNC();
  MD<C> total = {warp_m[0], warp_d[0]};
  PS_SYNC();  // the scratch may be reused by the next reduction
  return total;
}

// Whole-block reduction; every thread ends with the total.
template <int WARP, typename C> PS_DEVICE MD<C> md_reduce_block(MD<C> md) {
  return md_from_first_warp<WARP>(md_reduce_to_first_warp<WARP>(md));
}

// ---- turning (m, d) into outputs ------------------------------------------
template <int OP, typename T> struct RowFinish {
  typedef typename compute_of<T>::type C;
  C m, scale, log_d;
  ExpMinus<C> exp_over_d;  // exp(x - m) / d
  bool empty, safe;
  PS_DEVICE RowFinish() : m(0), scale(0), log_d(0), exp_over_d(C(0)), empty(true), safe(false) {}
  PS_DEVICE RowFinish(MD<C> md, bool safe_)
      : RowFinish(OP == kSoftmax && safe_ && md.m == ps_neg_inf<C>() ? MD<C>{C(0), -ps_neg_inf<C>()} : md,
                  md.m == ps_neg_inf<C>(), safe_) {}
  // An empty row's outputs come out of value() itself, so the loops over a row need no test: with
  // m = -inf every x - m is NaN (torch's answer, and log_softmax's always); a safe softmax takes
  // (m, d) = (0, +inf) instead (above), whose exp(x - 0) / inf is 0.
  PS_DEVICE C operator()(C x) const { return value(x); }
  // A row of all -inf has no softmax: NaN like torch, or 0 when asked to be safe.
  PS_DEVICE C empty_value() const { return (OP == kSoftmax && safe) ? C(0) : ps_nan<C>(); }
  // The output of x in a row with some value above -inf, or (above) in an empty row.
  PS_DEVICE C value(C x) const {
    if (OP == kSoftmax) return exp_over_d(x);
    // x - m first (exact near the max): x - (m + log d) would round m + log d to float32, an
    // absolute error of up to half an ulp of m, where the output -log d can be far smaller.
    return (x - m) - log_d;
  }

 private:
  PS_DEVICE RowFinish(MD<C> md, bool empty_, bool safe_)
      : m(md.m), scale(recip_for<T>(md.d)), log_d(log_for<T>(md.d)), exp_over_d(md.m, md.d, log2_for<T>(md.d)),
        empty(empty_), safe(safe_) {}
};

// ---- one row seen as aligned slots ---------------------------------------
template <typename T, int VEC> struct RowSlots {
  typedef typename compute_of<T>::type C;
  const T* x;
  T* y;
  i64 cols;
  int pad;     // elements between the aligned slot start and the row start
  i64 slots;   // slots covering [-pad, cols)

  RowSlots() = default;
  PS_DEVICE RowSlots(const T* x_, T* y_, i64 cols_) : x(x_), y(y_), cols(cols_) {
    pad = static_cast<int>((reinterpret_cast<unsigned long long>(x_) / sizeof(T)) % VEC);
    slots = (pad + cols + VEC - 1) / VEC;
  }
  PS_DEVICE bool full(i64 k) const { return k * VEC - pad >= 0 && k * VEC - pad + VEC <= cols; }

  // Out-of-row elements read as -inf, which adds nothing to (m, d).
  PS_DEVICE Vec<T, VEC> load_raw(i64 k) const {
    const i64 first = k * VEC - pad;
    if (full(k)) return *reinterpret_cast<const Vec<T, VEC>*>(x + first);
    Vec<T, VEC> raw;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const i64 i = first + j;
      raw.v[j] = (i >= 0 && i < cols) ? x[i] : from_compute<T>(ps_neg_inf<C>());
    }
    return raw;
  }
  PS_DEVICE void load(i64 k, C* v) const {
    widen(load_raw(k), v);
  }
  // Values already in the stored type (outputs computed in place in shared memory).
  PS_DEVICE void store_raw(i64 k, const Vec<T, VEC>& raw) const {
    const i64 first = k * VEC - pad;
    if (full(k)) {
      *reinterpret_cast<Vec<T, VEC>*>(y + first) = raw;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const i64 i = first + j;
        if (i >= 0 && i < cols) y[i] = raw.v[j];
      }
    }
  }
  template <bool kOneInstruction = false> PS_DEVICE void store(i64 k, const C* v) const {
    const i64 first = k * VEC - pad;
    if (full(k)) {
      Vec<T, VEC> raw;
#pragma unroll
      for (int j = 0; j < VEC; ++j) raw.v[j] = from_compute<T>(v[j]);
      store_vector<kOneInstruction>(y + first, raw);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const i64 i = first + j;
        if (i >= 0 && i < cols) y[i] = from_compute<T>(v[j]);
      }
    }
  }
};

template <int OP, typename T, int VEC>
PS_DEVICE void finish_slot(const RowFinish<OP, T>& f, typename compute_of<T>::type* v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) v[j] = f(v[j]);
}
// A slot as stored, widened into v and turned into its outputs.
template <int OP, typename T, int VEC>
PS_DEVICE void finish_slot(const RowFinish<OP, T>& f, const Vec<T, VEC>& raw, typename compute_of<T>::type* v) {
  widen(raw, v);
  finish_slot<OP, T, VEC>(f, v);
}

template <int width, typename C> PS_DEVICE C max_over_lanes(C v) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset /= 2) v = ps_max_nan(v, warp_shfl_xor(v, offset, width));
  return v;
}

template <int width, typename C> PS_DEVICE C sum_over_lanes(C v) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset /= 2) v += warp_shfl_xor(v, offset, width);
  return v;
}

// ---- a row held in registers --------------------------------------------------
// N values in each of LANES consecutive lanes (LANES = 1: one thread holds the row). The
// max over the group comes first, then d = sum exp(x - m): one exp per element and no exp
// in the shuffles. Softmax keeps each exp, so its output is a multiply; log-softmax keeps
// each x - m, so its output is a subtraction. Every lane of the group takes part, also for
// rows past the end (their outputs are not stored).
template <int OP, typename T, int LANES, int N>
PS_DEVICE void softmax_in_registers(typename compute_of<T>::type* v, bool safe) {
  typedef typename compute_of<T>::type C;
  if (LANES == 1 && N == 1) {  // a row of one element needs no exp: 1 (log: 0) if it is finite
    const C x = v[0];
    if (x == ps_neg_inf<C>()) {
      v[0] = (OP == kSoftmax && safe) ? C(0) : ps_nan<C>();  // an empty row, as RowFinish says
    } else {
      v[0] = x - x == C(0) ? C(OP == kSoftmax ? 1 : 0) : ps_nan<C>();  // NaN and +inf give NaN
    }
    return;
  }
  C m = ps_neg_inf<C>();
#pragma unroll
  for (int j = 0; j < N; ++j) m = ps_max_nan(m, v[j]);
  m = max_over_lanes<LANES>(m);
  C d = C(0);
  auto sum_exps = [&](const auto& exp_of) {  // softmax: each value becomes its exp
#pragma unroll
    for (int j = 0; j < N; ++j) {
      v[j] = exp_of(v[j]);
      d += v[j];
    }
  };
  if constexpr (OP == kSoftmax) {
    // Softmax keeps each exp (its output is exp * (1 / d)), so it may take them with a factor the
    // row shares (ExpShifted, an instruction a value fewer). An empty row (m = -inf) takes them
    // relative to 0: all 0, whose outputs are then the empty value's 0 or NaN with no select a value
    // (a select, or ones written for an empty row, cost a register and an instruction a value).
    const C shift = m == ps_neg_inf<C>() ? C(0) : m;
    if constexpr (same_type<C, float>::value) {
      if (exp_shift_fits<T>(shift)) {
        sum_exps(ExpShifted(shift));
      } else {
        sum_exps(ExpMinus<C>(shift));
      }
    } else {
      sum_exps(ExpMinus<C>(shift));
    }
  } else if (m != ps_neg_inf<C>()) {
    // Log-softmax keeps x - m (its output is (x - m) - log d), so each difference is taken once.
    const ExpMinus<C> exp_of(C(0));
#pragma unroll
    for (int j = 0; j < N; ++j) {
      v[j] -= m;
      d += exp_of(v[j]);
    }
  }
  MD<C> md = {m, sum_over_lanes<LANES>(d)};
  const RowFinish<OP, T> f(md, safe);
  if (OP == kSoftmax) {
    const C scale = f.empty ? f.empty_value() : f.scale;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] *= scale;
  } else if (m != ps_neg_inf<C>()) {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] -= f.log_d;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = f(v[j]);  // an empty row: NaN, as RowFinish says
  }
}

// ---- rows in registers: a group of lanes a row --------------------------------------------------
// The regime of rows that registers hold, for every op. A group of LANES consecutive lanes (LANES
// divides WARP) takes a row: LANES < WARP packs WARP / LANES short rows into one warp, LANES == WARP
// gives a warp a row. Each lane holds SLOTS slots of VEC elements (slots lane, lane + LANES, ...),
// so a row is read once and written once, and a group takes BATCH rows a step (WarpBatch), so that
// short rows still keep 32 bytes a lane in flight. Every lane of a group takes part in its
// reductions, also for rows past the end, which read as empty rows and are not stored. The op
// policy Op says what a row is:
//   Op::row<VEC>(row, rows, cols)      a row's arrays as its view.slots aligned slots
//   Op::kPastEndViewIsEmpty            a row past the end holds no slot (else it is skipped at the store)
//   Op::Held<SLOTS, VEC>               what a lane holds of a row
//   Op::load / Op::absent              a slot of the row, and a slot past its end
//   Op::finish<WARP, LANES>(held, lane, row, rows, cols)  the row's reduction over its group: how its
//                                      slots finish
//   Op::store                          a slot's outputs
template <typename T, int SLOTS, int VEC> struct WarpBatch {
  static const int bytes = SLOTS * VEC * (int)sizeof(T);
  static const int rows = bytes >= 32 ? 1 : 32 / bytes;
};

template <typename Op, int WARP, int LANES, int SLOTS, int VEC, int BATCH>
PS_DEVICE void rows_in_registers(const Op& op, i64 rows, i64 cols) {
  static_assert(LANES <= WARP && WARP % LANES == 0, "a row group lies inside one warp");
  const int lane = static_cast<int>(PS_THREAD_X % LANES);
  const i64 group = PS_THREAD_X / LANES;
  const i64 groups_per_block = PS_BLOCK_DIM_X / LANES;
  const i64 rows_per_step = groups_per_block * BATCH;
  // The bound depends on the block only, so all lanes of a warp stay in the
  // loop together and every shuffle sees its whole lane group.
  for (i64 first_row = (i64)PS_BLOCK_X * rows_per_step; first_row < rows;
       first_row += (i64)PS_GRID_DIM_X * rows_per_step) {
    typename Op::template Held<SLOTS, VEC> held[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const i64 row = first_row + b * groups_per_block + group;
      const auto view = op.template row<VEC>(row, rows, cols);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const i64 k = (i64)s * LANES + lane;
        if (k < view.slots) {
          op.load(view, k, held[b], s);
        } else {
          op.absent(held[b], s);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const i64 row = first_row + b * groups_per_block + group;
      const auto finish = op.template finish<WARP, LANES>(held[b], lane, row, rows, cols);
      if constexpr (!Op::kPastEndViewIsEmpty) {
        if (row >= rows) continue;
      }
      const auto view = op.template row<VEC>(row, rows, cols);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const i64 k = (i64)s * LANES + lane;
        if (k < view.slots) op.store(view, k, held[b], s, finish);
      }
    }
  }
}

// The forward op of the rows-in-registers regime: a lane holds its slots widened, and the row
// finishes in place (softmax_in_registers), a group of at most a warp.
template <typename T, int OP> struct ForwardRows {
  typedef typename compute_of<T>::type C;
  struct InPlace {};
  static constexpr bool kPastEndViewIsEmpty = false;  // its slots read as -inf, so that it reduces
  const T* x;
  T* y;
  i64 x_stride, y_stride;
  bool safe;
  template <int SLOTS, int VEC> struct Held { C v[SLOTS * VEC]; };
  template <int VEC> PS_DEVICE RowSlots<T, VEC> row(i64 row, i64 rows, i64 cols) const {
    const i64 r = row < rows ? row : 0;
    return RowSlots<T, VEC>(x + r * x_stride, y + r * y_stride, row < rows ? cols : 0);
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void load(const RowSlots<T, VEC>& rs, i64 k, Held<SLOTS, VEC>& held, int s) const {
    rs.load(k, held.v + s * VEC);
  }
  template <int SLOTS, int VEC> PS_DEVICE void absent(Held<SLOTS, VEC>& held, int s) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) held.v[s * VEC + j] = ps_neg_inf<C>();
  }
  template <int WARP, int LANES, int SLOTS, int VEC>
  PS_DEVICE InPlace finish(Held<SLOTS, VEC>& held, int, i64, i64, i64) const {
    softmax_in_registers<OP, T, LANES, SLOTS * VEC>(held.v, safe);
    return InPlace();
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void store(const RowSlots<T, VEC>& rs, i64 k, const Held<SLOTS, VEC>& held, int s, InPlace) const {
    rs.store(k, held.v + s * VEC);
  }
};

// ---- rows in registers, two passes apart -----------------------------------------------------------
// The sharded softmax's local rows, each a slice of a row whose other slices other ranks hold: the
// first pass writes each row's (m, d), unnormalised, to partials[2 row] and [2 row + 1]; the caller
// merges every rank's pairs; the second pass finishes each row from the (m, d) it then finds there.
// A warp a row (LANES = WARP), ForwardRows's loads and layout otherwise.
template <int LANES, int N, typename C> PS_DEVICE MD<C> md_in_registers(const C* v) {
  C m = ps_neg_inf<C>();
#pragma unroll
  for (int j = 0; j < N; ++j) m = ps_max_nan(m, v[j]);
  m = max_over_lanes<LANES>(m);
  const ExpMinus<C> exp_of(m == ps_neg_inf<C>() ? C(0) : m);  // a row of all -inf: (-inf, 0), the identity
  C d = C(0);
#pragma unroll
  for (int j = 0; j < N; ++j) d += exp_of(v[j]);
  return MD<C>{m, sum_over_lanes<LANES>(d)};
}

template <typename T> struct RowsPartials : ForwardRows<T, kSoftmax> {
  typedef typename compute_of<T>::type C;
  template <int SLOTS, int VEC> using Held = typename ForwardRows<T, kSoftmax>::template Held<SLOTS, VEC>;
  struct Written {};
  C* partials;
  template <int WARP, int LANES, int SLOTS, int VEC>
  PS_DEVICE Written finish(Held<SLOTS, VEC>& held, int lane, i64 row, i64 rows, i64) const {
    const MD<C> md = md_in_registers<LANES, SLOTS * VEC>(held.v);
    if (lane == 0 && row < rows) {
      partials[2 * row] = md.m;
      partials[2 * row + 1] = md.d;
    }
    return Written();
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void store(const RowSlots<T, VEC>&, i64, const Held<SLOTS, VEC>&, int, Written) const {}
};

template <typename T, int OP> struct RowsFromPartials : ForwardRows<T, OP> {
  typedef typename compute_of<T>::type C;
  template <int SLOTS, int VEC> using Held = typename ForwardRows<T, OP>::template Held<SLOTS, VEC>;
  const C* partials;
  template <int WARP, int LANES, int SLOTS, int VEC>
  PS_DEVICE RowFinish<OP, T> finish(Held<SLOTS, VEC>&, int, i64 row, i64 rows, i64) const {
    const i64 r = row < rows ? row : 0;
    return RowFinish<OP, T>(MD<C>{partials[2 * r], partials[2 * r + 1]}, this->safe);
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void store(const RowSlots<T, VEC>& rs, i64 k, const Held<SLOTS, VEC>& held, int s,
                       const RowFinish<OP, T>& f) const {
    C v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = f(held.v[s * VEC + j]);
    rs.store(k, v);
  }
};

// ---- streaming a thread's slots of a row --------------------------------------
// Slots begin + threadIdx, + blockDim, ... below end, DEPTH at a time, as stored
// (no conversion): all DEPTH loads are issued before the first use, so a thread keeps
// several requests in flight (a store to shared memory in between would otherwise
// order each load after it).
template <int DEPTH, typename T, int VEC, typename F>
PS_DEVICE void for_each_slot(const RowSlots<T, VEC>& rs, i64 begin, i64 end, F&& use) {
  const i64 step = PS_BLOCK_DIM_X;
  for (i64 k0 = begin + PS_THREAD_X; k0 < end; k0 += DEPTH * step) {
    Vec<T, VEC> raw[DEPTH];
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (k0 + u * step < end) raw[u] = rs.load_raw(k0 + u * step);
    }
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (k0 + u * step < end) use(k0 + u * step, raw[u]);
    }
  }
}

// Slots in flight a thread while a 16-bit chunk is cached: nvcc splits the raw 16-byte slots of
// 16-bit values into a register a value, so four of them took 32 registers and held the block
// tiers to 8 blocks of 128 threads a multiprocessor; two (with the launch bounds below) allow 12.
const int kCacheDepth16 = 2;

// Whole slots go to shared memory without passing through registers where the vendor can
// (PS_ASYNC_COPY, 4- to 16-byte slots): a thread then has every slot of its share in flight at
// once, however many, where loads through registers keep a few in flight (their registers, and
// the wait for each batch's use, limit them).
template <typename T, int VEC> constexpr bool kAsyncSlots = PS_ASYNC_COPY && sizeof(Vec<T, VEC>) >= 4;

// One slot of a row into its place in the cache: by an asynchronous copy where the vendor has
// them and the slot is whole (kAsyncSlots), else through a register.
template <typename T, int VEC>
PS_DEVICE void copy_slot_to_cache(const RowSlots<T, VEC>& rs, i64 k, Vec<T, VEC>* at) {
#if PS_ASYNC_COPY
  if constexpr (kAsyncSlots<T, VEC>) {
    if (rs.full(k)) {
      async_copy<sizeof(Vec<T, VEC>)>(at, rs.x + (k * VEC - rs.pad));
      return;
    }
  }
#endif
  *at = rs.load_raw(k);
}

// The slots [begin, end) of a row that a block holds in shared memory, indexed from begin in 32
// bits (a chunk fits on chip): which of them are whole vectors (all but a row's first and last
// slot can be), and where local slot 0's elements would start. The loops over a chunk then test a
// slot with one unsigned compare and address it with one multiply-add, where RowSlots' 64-bit
// tests and addresses cost about as many instructions a 16-bit slot as its arithmetic.
template <typename T, int VEC> struct CachedChunk {
  typedef typename compute_of<T>::type C;
  const RowSlots<T, VEC>& rs;
  i64 begin;
  int n;                  // slots in the chunk
  int whole_from, whole;  // local slots [whole_from, whole_from + whole) are whole vectors
  const T* x0;            // element 0 of local slot 0 (dereferenced only for whole slots)
  T* y0;
  PS_DEVICE static int clamp(i64 v, int n) { return v < 0 ? 0 : (v > n ? n : static_cast<int>(v)); }
  PS_DEVICE CachedChunk(const RowSlots<T, VEC>& rs_, i64 begin_, i64 end) : rs(rs_), begin(begin_) {
    n = end > begin ? static_cast<int>(end - begin) : 0;
    // slot k is whole when k * VEC >= pad and (k + 1) * VEC <= pad + cols; pad < VEC
    whole_from = clamp((rs.pad > 0 ? 1 : 0) - begin, n);
    whole = clamp((rs.pad + rs.cols) / VEC - begin, n) - whole_from;
    if (whole < 0) whole = 0;
    const i64 offset = begin * VEC - rs.pad;
    x0 = rs.x + offset;
    y0 = rs.y + offset;
  }
  PS_DEVICE bool full(int j) const { return static_cast<unsigned>(j - whole_from) < static_cast<unsigned>(whole); }
  // copy_slot_to_cache with the chunk's test and address, written out: routed through one helper,
  // they changed the staged tier's generated code for the worse.
  PS_DEVICE void copy_to_cache(int j, Vec<T, VEC>* cache) const {
#if PS_ASYNC_COPY
    if constexpr (kAsyncSlots<T, VEC>) {
      if (full(j)) {
        async_copy<sizeof(Vec<T, VEC>)>(&cache[j], x0 + j * VEC);
        return;
      }
    }
#endif
    cache[j] = rs.load_raw(begin + j);
  }
  PS_DEVICE void store(int j, const C* v) const {
    if (full(j)) {
      store_whole(j, v);
    } else {
      rs.store(begin + j, v);
    }
  }
  PS_DEVICE void store_whole(int j, const C* v) const {
    Vec<T, VEC> raw;
#pragma unroll
    for (int e = 0; e < VEC; ++e) raw.v[e] = from_compute<T>(v[e]);
    store_vector<true>(y0 + j * VEC, raw);  // one instruction: as a plain store nvcc split it into 2-byte ones
  }

  // The loops over whole slots with no test a slot: a chunk's other slots are at most its first
  // (the row starts inside it) and its last (the row ends inside it), which their owners take
  // apart (partial_slots): a test a slot costs instructions the block tier cannot spare.
  PS_DEVICE int first_whole_of_thread() const {
    return PS_THREAD_X < whole_from ? PS_THREAD_X + PS_BLOCK_DIM_X : PS_THREAD_X;
  }
  PS_DEVICE int whole_end() const { return whole_from + whole; }
#if PS_ASYNC_COPY
  // This thread's whole slots from j (one of its own) below stop, by asynchronous copies; returns
  // its next slot.
  PS_DEVICE int copy_whole(int j, int stop, Vec<T, VEC>* cache) const {
    for (; j < stop; j += PS_BLOCK_DIM_X) copy_whole_slot(j, cache);
    return j;
  }
  PS_DEVICE void copy_whole_slot(int j, Vec<T, VEC>* cache) const {
    async_copy<sizeof(Vec<T, VEC>)>(&cache[j], x0 + j * VEC);
  }
#endif
  // Whether this thread owns the chunk's partial slots: local slots [0, whole_from) and [tail, n).
  PS_DEVICE bool owns_head() const { return static_cast<int>(PS_THREAD_X) < whole_from; }
  PS_DEVICE bool owns_tail() const {
    const int tail = whole_end() > whole_from ? whole_end() : whole_from;
    return tail < n && (n - 1) % static_cast<int>(PS_BLOCK_DIM_X) == static_cast<int>(PS_THREAD_X);
  }
  // f(j) for each partial slot j of this thread's.
  template <typename F> PS_DEVICE void partial_slots(F&& f) const {
    if (owns_head()) f(static_cast<int>(PS_THREAD_X));
    if (owns_tail()) f(n - 1);
  }
  // A thread's partial slot is read into registers before its asynchronous copies are issued and
  // placed in the cache after them: read after the copies, it queued behind them and held its
  // warp's exps of the first copy groups until the last group had landed. One slot a thread goes
  // ahead (a register slot, not
  // two): a thread that owns both ends (chunks of k * blockDim + 1 slots) reads its tail after.
  struct Partial {
    Vec<T, VEC> raw;
    int at;  // the slot, or -1
  };
  PS_DEVICE Partial fetch_partial() const {
    Partial p;
    p.at = owns_head() ? 0 : (owns_tail() ? n - 1 : -1);
    if (p.at >= 0) p.raw = load_partial_raw(p.at);
    return p;
  }
  PS_DEVICE void place_partial(const Partial& p, Vec<T, VEC>* cache) const {
    if (p.at >= 0) cache[p.at] = p.raw;
    if (p.at == 0 && owns_tail()) cache[n - 1] = load_partial_raw(n - 1);
  }
  // Element e of local slot j is in the row when lo <= j * VEC + e < hi (32 bits: a chunk fits on
  // chip; RowSlots' 64-bit tests here cost the block kernels registers and spills).
  PS_DEVICE int row_lo() const { const i64 v = rs.pad - begin * VEC; return v < 0 ? 0 : static_cast<int>(v); }
  PS_DEVICE int row_hi() const {
    const i64 v = rs.pad + rs.cols - begin * VEC;
    return v > (i64)n * VEC ? n * VEC : static_cast<int>(v);
  }
  PS_DEVICE Vec<T, VEC> load_partial_raw(int j) const {
    const int lo = row_lo(), hi = row_hi();
    Vec<T, VEC> raw;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int i = j * VEC + e;
      raw.v[e] = (i >= lo && i < hi) ? x0[i] : from_compute<T>(ps_neg_inf<C>());
    }
    return raw;
  }
  // Local slot j (j >= 0) as stored: a whole vector where it is one, else its in-row elements
  // (out-of-row ones, and every one of a slot past the chunk, read as -inf).
  PS_DEVICE Vec<T, VEC> load_raw(int j) const {
    return full(j) ? *reinterpret_cast<const Vec<T, VEC>*>(x0 + j * VEC) : load_partial_raw(j);
  }
  PS_DEVICE void store_partial(int j, const C* v) const {
    const int lo = row_lo(), hi = row_hi();
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int i = j * VEC + e;
      if (i >= lo && i < hi) y0[i] = from_compute<T>(v[e]);
    }
  }
};

#if PS_ASYNC_COPY
// async_copy_wait_group with the count of groups left pending known only after unrolling.
template <int MOST> PS_DEVICE void async_copy_wait_groups_but(int pending) {
  if constexpr (MOST > 0) {
    if (pending >= MOST) {
      async_copy_wait_group<MOST>();
      return;
    }
    async_copy_wait_groups_but<MOST - 1>(pending);
  } else {
    async_copy_wait_group<0>();
  }
}
#endif

// The (m, d) of a 16-bit chunk's cached slots j0, j0 + blockDim, ... below n, added to acc in two
// passes over shared memory: their max first (two values an instruction where the vendor has a
// packed max), then their exps with no rescale test, each 2^(x log2(e) - h) in one multiply-add
// (h = m log2(e) rounded; its rounding m log2(e) - h, exact from one more multiply-add, is taken
// out of the sum once, so the sum is exp(x - m)'s as ExpMinus takes it) where the max allows it
// (exp_shift_fits), else exp(x - m) (push_below). The split's blocks take this pass with no loads
// of their own in flight, so its instruction count matters: about two thirds of the one-pass
// form's a 16-byte slot.
template <typename T, int VEC> constexpr bool kTwoPassChunk = sizeof(T) == 2 && VEC % 2 == 0;
template <typename T, int VEC>
PS_DEVICE void add_cached_two_pass(OnlineSum<float>& acc, const Vec<T, VEC>* cache, int j0, int n) {
  constexpr int kWords = VEC / 2;
  typedef Vec<T, 2> Pair;
  float top = ps_neg_inf<float>();
  if constexpr (PackedMax<T>::native) {
    Pair neg_inf_pair;
    neg_inf_pair.v[0] = neg_inf_pair.v[1] = from_compute<T>(ps_neg_inf<float>());
    unsigned top_bits;
    memcpy(&top_bits, &neg_inf_pair, 4);
    for (int j = j0; j < n; j += PS_BLOCK_DIM_X) {
      unsigned w[kWords];
      memcpy(w, &cache[j], sizeof(w));
#pragma unroll
      for (int k = 0; k < kWords; ++k) top_bits = PackedMax<T>::max(top_bits, w[k]);
    }
    Pair pair;
    memcpy(&pair, &top_bits, 4);
    float v[2];
    widen(pair, v);
    top = ps_max_nan(v[0], v[1]);
  } else {
    for (int j = j0; j < n; j += PS_BLOCK_DIM_X) {
      float v[VEC];
      widen(cache[j], v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) top = ps_max_nan(top, v[e]);
    }
  }
  if (top == ps_neg_inf<float>()) return;  // every cached value is -inf (or there are none): exps of 0
  acc.raise_to(top);
  const float m = acc.m;
  if (exp_shift_fits<T>(m)) {
    const ExpShifted exp_shifted(m);
    OnlineSum<float> shifted;  // its compensated sum only
    for (int j = j0; j < n; j += PS_BLOCK_DIM_X) {
      float v[VEC];
      widen(cache[j], v);
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += exp_shifted(v[e]);
      shifted.add(sum);
    }
    acc.add((shifted.d - shifted.carry) * PS_FAST_EXP2F(-exp_shifted.shared_exponent(m)));
  } else {
    for (int j = j0; j < n; j += PS_BLOCK_DIM_X) {
      float v[VEC];
      widen(cache[j], v);
      acc.template push_below<VEC>(v);
    }
  }
}

// No values of the caller's beside the cache (cache_chunk's `early`).
struct NothingEarly {
  template <typename Sum> PS_DEVICE void operator()(Sum&) const {}
};

// Caches slots [begin, end) of a row in shared memory (cache[0] is slot begin), as
// stored, and returns this thread's (m, d) over them. Each thread later reads back
// only the slots it wrote, so the cache needs no barrier of its own. `issued`: the copies
// are in flight already (store_and_prefetch). `early(acc)` adds the caller's other values
// (block_rows_registers: the row's slots in registers) once the copies are issued, before the
// first wait, so that their exps overlap the copies. GROUPS > 1 (not issued): the copies go out in GROUPS
// commit groups of consecutive slots, and (m, d) takes each group as it lands, so that the first
// groups' exps overlap the later groups' copies. More than two groups need a slot a thread in each
// group, else they only add waits. Two groups skip that test: compiled in, it costs the 16-bit
// block kernels registers.
template <typename T, int VEC, int GROUPS = 1, typename Early = NothingEarly>
PS_DEVICE MD<typename compute_of<T>::type> cache_chunk(const RowSlots<T, VEC>& rs, i64 begin, i64 end,
                                                       Vec<T, VEC>* cache, bool issued = false,
                                                       Early early = Early()) {
  typedef typename compute_of<T>::type C;
  OnlineSum<C> acc;
#if PS_ASYNC_COPY
  if constexpr (kAsyncSlots<T, VEC> && GROUPS > 1) {
    if (!issued && (GROUPS == 2 || end - begin >= (i64)GROUPS * PS_BLOCK_DIM_X)) {
      const CachedChunk<T, VEC> chunk(rs, begin, end);
      // local slots [n * g / GROUPS, n * (g + 1) / GROUPS) make group g; the whole ones go by
      // asynchronous copies, the partial ones (after them) through registers
      const auto partial = chunk.fetch_partial();
      int j = chunk.first_whole_of_thread();
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
        const int group_end = chunk.n * (g + 1) / GROUPS;
        j = chunk.copy_whole(j, group_end < chunk.whole_end() ? group_end : chunk.whole_end(), cache);
        async_copy_commit();
      }
      chunk.place_partial(partial, cache);
      early(acc);
      // Unrolled, so that each wait's count is a constant (a rolled loop through the chain of waits
      // costs a register-indexed wait).
      j = PS_THREAD_X;
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
        async_copy_wait_groups_but<GROUPS - 1>(GROUPS - 1 - g);
        for (; j < chunk.n * (g + 1) / GROUPS; j += PS_BLOCK_DIM_X) {
          C v[VEC];
          widen(cache[j], v);
          acc.template push_all<VEC>(v);
        }
      }
      return acc.md();
    }
  }
  if constexpr (kAsyncSlots<T, VEC>) {  // all copies first, then (m, d) from shared memory
    const CachedChunk<T, VEC> chunk(rs, begin, end);
    if (!issued) {
      const auto partial = chunk.fetch_partial();
      chunk.copy_whole(chunk.first_whole_of_thread(), chunk.whole_end(), cache);
      chunk.place_partial(partial, cache);
    }
    early(acc);
    async_copy_wait_all();
    if constexpr (kTwoPassChunk<T, VEC>) {
      add_cached_two_pass(acc, cache, PS_THREAD_X, chunk.n);
    } else {
      for (int j = PS_THREAD_X; j < chunk.n; j += PS_BLOCK_DIM_X) {
        C v[VEC];
        widen(cache[j], v);
        acc.template push_all<VEC>(v);
      }
    }
    return acc.md();
  }
#endif
  // (m, d) as the loads arrive: no second pass over the cache
  early(acc);
  for_each_slot<(sizeof(T) == 2 ? kCacheDepth16 : 4)>(rs, begin, end, [&](i64 k, const Vec<T, VEC>& raw) {
    C v[VEC];
    widen(raw, v);
    acc.template push_all<VEC>(v);
    cache[k - begin] = raw;
  });
  return acc.md();
}

template <int OP, typename T, int VEC>
PS_DEVICE void store_from_cache(const RowSlots<T, VEC>& rs, i64 begin, i64 end, const Vec<T, VEC>* cache,
                                const RowFinish<OP, T>& f) {
  typedef typename compute_of<T>::type C;
  const CachedChunk<T, VEC> chunk(rs, begin, end);
  for (int j = chunk.first_whole_of_thread(); j < chunk.whole_end(); j += PS_BLOCK_DIM_X) {
    C v[VEC];
    finish_slot(f, cache[j], v);
    chunk.store_whole(j, v);
  }
  chunk.partial_slots([&](int j) {
    C v[VEC];
    finish_slot(f, cache[j], v);
    chunk.store_partial(j, v);
  });
}

// store_from_cache, and where copies are asynchronous, each slot's place refilled with the same
// slot of the block's next row (`next`, slots [begin, next_end); next_end = begin: none) once its
// output is stored. The next row's loads are then in flight while this row's stores drain, where
// they would otherwise start only after them. Returns whether it issued the next row's copies
// (cache_chunk's `issued`). A thread refills only the slots it read, so no barrier is needed.
template <int OP, typename T, int VEC>
PS_DEVICE bool store_and_prefetch(const RowSlots<T, VEC>& rs, i64 begin, i64 end, Vec<T, VEC>* cache,
                                  const RowFinish<OP, T>& f, const RowSlots<T, VEC>& next, i64 next_end) {
  if constexpr (!kAsyncSlots<T, VEC>) {
    store_from_cache(rs, begin, end, cache, f);
    return false;
  } else {
    typedef typename compute_of<T>::type C;
    if (next_end == begin) {  // no next row
      store_from_cache(rs, begin, end, cache, f);
      return false;
    }
    const CachedChunk<T, VEC> chunk(rs, begin, end), next_chunk(next, begin, next_end);
    // Slot j: its output stored, then its place refilled with the next row's (read before the
    // refill is issued: the store needs it). Where both are whole vectors, with no test a slot
    // (as in cache_chunk); the rest (a slot or two at either end) with the tests.
    auto store_then_refill = [&](int j) {
      if (j < chunk.n) {
        C v[VEC];
        finish_slot(f, cache[j], v);
        chunk.store(j, v);
      }
      if (j < next_chunk.n) next_chunk.copy_to_cache(j, cache);
    };
    const int lo = chunk.whole_from > next_chunk.whole_from ? chunk.whole_from : next_chunk.whole_from;
    const int hi = chunk.whole_end() < next_chunk.whole_end() ? chunk.whole_end() : next_chunk.whole_end();
    const int last = chunk.n > next_chunk.n ? chunk.n : next_chunk.n;
    int j = PS_THREAD_X < lo ? PS_THREAD_X + PS_BLOCK_DIM_X : PS_THREAD_X;
    for (; j < hi; j += PS_BLOCK_DIM_X) {
      C v[VEC];
      finish_slot(f, cache[j], v);
      chunk.store_whole(j, v);
      next_chunk.copy_whole_slot(j, cache);
    }
    if (static_cast<int>(PS_THREAD_X) < lo) store_then_refill(PS_THREAD_X);
    for (; j < last; j += PS_BLOCK_DIM_X) store_then_refill(j);
    return true;
  }
}

// ---- short rows, packed: rows of a few elements inside a thread's vectors ------------------
// Contiguous rows of COLS elements: GROUP = lcm(COLS, VEC) / VEC consecutive aligned vectors
// hold whole rows when the span starts on a row boundary (the host checks that its
// misalignment is a multiple of COLS). A thread takes DEPTH groups from shared memory (below),
// each row in registers: no shuffles, and every access but the span's two ends a full vector.
template <int A, int B> struct Gcd { static const int value = Gcd<B, A % B>::value; };
template <int A> struct Gcd<A, 0> { static const int value = A; };

// The groups pass through a tile of shared memory (dynamic, DEPTH * blockDim groups): the block
// copies its groups' slots in order (cp.async where there is one), each thread takes its group
// from the tile, and the block stores the tile in order. So a warp's requests are whole lines,
// where a thread loading its own group of GROUP > 1 vectors read one vector of every GROUP (ncu,
// 16-bit rows of 3 columns: L2 at 92% of its throughput, each sector requested twice); and the
// bytes in flight wait in shared memory, not registers (ncu, 16-bit rows of 1 column loaded
// into registers: 4 blocks of 256 threads a multiprocessor for registers, DRAM at 66%). Reading its
// group back, a thread's 16-byte accesses are GROUP * 16 bytes apart, which for an odd GROUP (1, 3,
// 5 or 7: every length the planner packs) meets no bank twice in a quarter warp.
const int kPackedThreads = 256;  // the packed tier's launch bound (Tuning.packed_threads in the planner)
// Groups of more than 32 values (5 and 7 columns of 16-bit values) hold a block to 3-4 a
// multiprocessor for registers: those may take two tiles (the planner's Tuning.packed_stages), so
// that a block taking several rounds has the next one's copies in flight. Shorter groups keep one
// tile: the loop that can take two costs them 8-16 registers a thread.
const int kPackedTwoTilesAbove = 32;
// Groups of up to this many values are widened whole, then taken a row at a time; larger ones
// (16-bit rows of 9, 11, 13, 18, 36 and 44 columns: 72-104 values) stay as stored and are widened
// a row at a time, which keeps them within packed_min_blocks' register bound without spilling.
const int kPackedWidenedMost = 64;
// The groups widened a row at a time compile for three blocks of kPackedThreads a multiprocessor
// (at most 85 registers a thread): without the bound the compiler gives them fewer registers and
// less overlap of a group's reads with its arithmetic.
template <int COLS, int VEC> constexpr int packed_min_blocks() {
  return COLS / Gcd<COLS, VEC>::value * VEC > kPackedWidenedMost ? 3 : 0;
}
template <typename T, int VEC, int N>
constexpr bool kPackedTwoTiles = kAsyncSlots<T, VEC> && N > kPackedTwoTilesAbove;

// A thread reads its group's 16-byte slots back one slot index at a time; groups of an even
// number of slots (16-bit rows of 16 and 32 columns) would put a quarter warp's reads on the
// same banks (4-way at 4 slots). So the slots of thread t's group lie XOR-ed with packed_flip(t),
// which differs between the threads of a quarter warp whose groups start on the same banks.
template <int GROUP> PS_DEVICE int packed_flip(int thread) {
  if constexpr (GROUP % 2 != 0) {
    return 0;
  } else {
    static_assert((GROUP & (GROUP - 1)) == 0 && GROUP <= 8, "even groups of 2, 4 or 8 slots");
    return static_cast<unsigned>(thread) / (8 / GROUP) % GROUP;  // 8 slots of 16 bytes span the 32 banks
  }
}
// Where slot `place` of a round's tile lies: its group's, at the XOR-ed index (for a power-of-two
// GROUP, place XOR the flip of its group).
template <int GROUP> PS_DEVICE int packed_swizzle(int place) {
  return place ^ packed_flip<GROUP>(static_cast<unsigned>(place) / GROUP);
}

// The op policy (Op, as staged_rows takes it) says what a row is: Op::kTiles arrays alike aligned,
// each a span (Op::span) copied into a tile of its own, and a row finished in registers
// (Op::row_in_registers<COLS>(v, w, safe): the values of the first array's row, into which its outputs
// go, and those of the last's).
template <typename Op, int COLS, int VEC, int GROUP, int DEPTH>
PS_DEVICE void packed_groups(const Op& op, const RowSlots<typename Op::T, VEC> (&spans)[Op::kTiles], i64 groups,
                             int safe, Vec<typename Op::T, VEC>* tile, int stages) {
  typedef typename Op::T T;
  typedef typename compute_of<T>::type C;
  constexpr int kTiles = Op::kTiles;
  const RowSlots<T, VEC>& span = spans[0];
  const int threads = PS_BLOCK_DIM_X;
  const i64 step = (i64)PS_GRID_DIM_X * threads;
  const i64 round = DEPTH * step;      // groups of the grid's round
  const int tile_slots = DEPTH * threads * GROUP;  // slots of one round's tile of one array
  // Where the slots of the round's u-th block of groups are all whole vectors (every round but
  // the span's first and last), its loops take no test a slot and address it from one pointer:
  // RowSlots' 64-bit tests and addresses would be about half the instructions of a 16-byte slot's
  // copy or store, in a tier bound by instruction issue.
  const i64 whole_from = span.pad > 0 ? 1 : 0, whole_end = (span.pad + span.cols) / VEC;
  auto all_whole = [&](i64 first) { return first >= whole_from && first + threads * GROUP <= whole_end; };
  // A round's slots into `at`, in order but for the swizzle within each group: slot place = s *
  // threads + thread of each block of groups, s < GROUP. The loops over s stay rolled: unrolled,
  // nvcc kept every slot's address in registers (16-bit 7 columns 72 -> 98 a thread, 32: 40 -> 50).
  auto copy_round = [&](i64 base, Vec<T, VEC>* at) {
#pragma unroll
    for (int a = 0; a < kTiles; ++a) {
      const RowSlots<T, VEC>& from_span = spans[a];
#pragma unroll
      for (int u = 0; u < DEPTH; ++u) {
        const i64 first = (base + u * step) * GROUP;
        Vec<T, VEC>* to = &at[a * tile_slots + (u * threads) * GROUP];
#if PS_ASYNC_COPY
        if constexpr (kAsyncSlots<T, VEC>) {
          if (all_whole(first)) {
            const T* from = from_span.x + (first * VEC - from_span.pad);
#pragma unroll 1
            for (int s = 0; s < GROUP; ++s) {
              const int place = s * threads + PS_THREAD_X;
              async_copy<sizeof(Vec<T, VEC>)>(&to[packed_swizzle<GROUP>(place)], from + place * VEC);
            }
            continue;
          }
        }
#endif
#pragma unroll 1
        for (int s = 0; s < GROUP; ++s) {
          const int place = s * threads + PS_THREAD_X;
          if (first + place < from_span.slots) {
            copy_slot_to_cache(from_span, first + place, &to[packed_swizzle<GROUP>(place)]);
          }
        }
      }
    }
  };
  // Each thread's groups of the round, in place; then the block stores the tile in order.
  auto finish_round = [&](i64 base, Vec<T, VEC>* at) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      Vec<T, VEC>* group = &at[(u * threads + PS_THREAD_X) * GROUP];
      const int flip = packed_flip<GROUP>(PS_THREAD_X);  // slot s of the group lies at group[s ^ flip]
      const i64 first = (base + u * step + PS_THREAD_X) * GROUP;
      if constexpr (GROUP * VEC > kPackedWidenedMost) {
        static_assert(kTiles == 1, "groups widened a row at a time: one array");
        // A row at a time: the slots a row reaches into are read as stored just before it, and
        // those it finishes written back just after, so that few are held at once.
        Vec<T, VEC> raw[GROUP];
#pragma unroll
        for (int r = 0; r < GROUP * VEC / COLS; ++r) {
#pragma unroll
          for (int s = (r * COLS + VEC - 1) / VEC; s < ((r + 1) * COLS + VEC - 1) / VEC; ++s) {
            raw[s] = first + s < span.slots ? group[s ^ flip] : neg_inf_vec<T, VEC>();
          }
          C v[COLS];
#pragma unroll
          for (int j = 0; j < COLS; ++j) v[j] = to_compute(raw[(r * COLS + j) / VEC].v[(r * COLS + j) % VEC]);
          op.template row_in_registers<COLS>(v, v, safe != 0);
#pragma unroll
          for (int j = 0; j < COLS; ++j) raw[(r * COLS + j) / VEC].v[(r * COLS + j) % VEC] = from_compute<T>(v[j]);
#pragma unroll
          for (int s = r * COLS / VEC; s < (r + 1) * COLS / VEC; ++s) group[s ^ flip] = raw[s];
        }
      } else {
        C v[kTiles][GROUP * VEC];
#pragma unroll
        for (int a = 0; a < kTiles; ++a) {
#pragma unroll
          for (int s = 0; s < GROUP; ++s) {
            if (first + s < span.slots) {
              widen(group[a * tile_slots + (s ^ flip)], v[a] + s * VEC);
            } else {
#pragma unroll
              for (int j = 0; j < VEC; ++j) v[a][s * VEC + j] = ps_neg_inf<C>();
            }
          }
        }
#pragma unroll
        for (int r = 0; r < GROUP * VEC / COLS; ++r) {
          op.template row_in_registers<COLS>(v[0] + r * COLS, v[kTiles - 1] + r * COLS, safe != 0);
        }
#pragma unroll
        for (int s = 0; s < GROUP; ++s) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) group[s ^ flip].v[j] = from_compute<T>(v[0][s * VEC + j]);
        }
      }
    }
    PS_SYNC();
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      const i64 first = (base + u * step) * GROUP;
      const Vec<T, VEC>* from = &at[(u * threads) * GROUP];
      if (all_whole(first)) {
        Vec<T, VEC>* to = reinterpret_cast<Vec<T, VEC>*>(span.y + (first * VEC - span.pad));
#pragma unroll 1
        for (int s = 0; s < GROUP; ++s) {
          const int place = s * threads + PS_THREAD_X;
          to[place] = from[packed_swizzle<GROUP>(place)];
        }
      } else {
#pragma unroll 1
        for (int s = 0; s < GROUP; ++s) {
          const int place = s * threads + PS_THREAD_X;
          if (first + place < span.slots) span.store_raw(first + place, from[packed_swizzle<GROUP>(place)]);
        }
      }
    }
    PS_SYNC();  // the tile is copied into again
  };
#if PS_ASYNC_COPY
  if constexpr (kPackedTwoTiles<T, VEC, GROUP * VEC>) {
    static_assert(kTiles == 1, "two stages of one array's tiles");
    // With two tiles (stages = 2) the next round's copies are in flight while the block computes
    // and stores this one; with one, they are issued after its stores.
    const bool ahead = stages > 1;
    i64 base = (i64)PS_BLOCK_X * threads;
    if (base < groups) copy_round(base, tile);
    async_copy_commit();
    int at = 0;
    for (; base < groups; base += round) {
      Vec<T, VEC>* here = tile + at * tile_slots;
      const bool more = base + round < groups;
      if (ahead && more) copy_round(base + round, tile + (at ^ 1) * tile_slots);
      async_copy_commit();  // maybe empty: wait_group<1> still waits for this round's copies
      async_copy_wait_group<1>();
      PS_SYNC();
      finish_round(base, here);
      if (!ahead && more) copy_round(base + round, here);
      async_copy_commit();
      at ^= ahead ? 1 : 0;
    }
  } else
#endif
  {
    for (i64 base = (i64)PS_BLOCK_X * threads; base < groups; base += round) {
      copy_round(base, tile);
#if PS_ASYNC_COPY
      if constexpr (kAsyncSlots<T, VEC>) async_copy_wait_all();
#endif
      PS_SYNC();
      finish_round(base, tile);
    }
  }
}

template <typename Op, int COLS, int VEC>
PS_DEVICE void packed_rows(const Op& op, i64 rows, int safe, int stages, Vec<typename Op::T, VEC>* tile) {
  const int N = COLS / Gcd<COLS, VEC>::value * VEC;  // values of a group: lcm(COLS, VEC)
  const int GROUP = N / VEC;
  const int DEPTH = GROUP >= 4 ? 1 : 4 / GROUP;  // at least four vectors in flight a thread
  if constexpr (Op::kTiles == 1) {
    const RowSlots<typename Op::T, VEC> spans[1] = {op.template span<VEC>(0, 0, rows, COLS)};
    packed_groups<Op, COLS, VEC, GROUP, DEPTH>(op, spans, (spans[0].slots + GROUP - 1) / GROUP, safe, tile, stages);
  } else {
    static_assert(Op::kTiles == 2, "one array or two");
    const RowSlots<typename Op::T, VEC> spans[2] = {op.template span<VEC>(0, 0, rows, COLS),
                                                    op.template span<VEC>(1, 0, rows, COLS)};
    packed_groups<Op, COLS, VEC, GROUP, DEPTH>(op, spans, (spans[0].slots + GROUP - 1) / GROUP, safe, tile, stages);
  }
}

// ---- short rows, staged: contiguous rows through shared memory ----------------------------
// A staged row of n <= N elements in one thread's registers; the slots past n read as -inf,
// which adds nothing to (m, d), and are not written back.
template <int OP, typename T, int N> PS_DEVICE void staged_row_in_registers(T* row, int n, bool safe) {
  typedef typename compute_of<T>::type C;
  C v[N];
#pragma unroll
  for (int c = 0; c < N; ++c) v[c] = c < n ? to_compute(row[c]) : ps_neg_inf<C>();
  softmax_in_registers<OP, T, 1, N>(v, safe);
#pragma unroll
  for (int c = 0; c < N; ++c) {
    if (c < n) row[c] = from_compute<T>(v[c]);
  }
}

// A 4-byte word of shared memory as one load (pairs of 16-bit values copied member by member
// become two 2-byte loads); wider words as they are.
template <typename W> PS_DEVICE W read_word(const W* at) {
  if (sizeof(W) != 4) return *at;
  const unsigned bits = *reinterpret_cast<const unsigned*>(at);
  W w;
  memcpy(&w, &bits, 4);
  return w;
}

// 32-bit banks of shared memory (NVIDIA, and AMD's LDS)
const int kSharedBanks = 32;
// No warp is narrower: a group of fewer lanes shares its warp with other groups.
const int kNarrowestWarp = 32;
// Groups of LANES lanes that share a warp: they take other rows (or none), and must still reach the
// warp's shuffles together.
template <int LANES> constexpr bool kGroupsShareWarp = LANES > 1 && LANES < kNarrowestWarp;

// f(k) for the words k of a row that this thread takes: with LANES > 1, lanes of a group take
// every LANES-th word (neighbouring lanes, neighbouring banks); with one thread a row, in order
// where start < 0, else from word `start` round to start - 1. Threads of a warp take rows a whole
// number of words apart; where that number is even (a multiple of the bank count at worst),
// starting each thread at a different word spreads their reads over the banks. One loop with a
// wrapping index, not two loops split at `start`: every thread of the warp runs the same count,
// where split loops would run both one after the other with part of the warp idle.
template <int LANES, typename F> PS_DEVICE void for_each_word_from(int start, int words, F&& f) {
  if (LANES > 1 || start < 0) {
    const int lane = LANES > 1 ? static_cast<int>(PS_THREAD_X % LANES) : 0;
#pragma unroll 4
    for (int k = lane; k < words; k += LANES) f(k);
    return;
  }
  int k = start;
#pragma unroll 4
  for (int i = 0; i < words; ++i) {
    f(k);
    k = k + 1 == words ? 0 : k + 1;
  }
}

// A staged row of n elements in shared memory, read and written a 32-bit word at a time: 16-bit
// rows start at any element, so they are a head value (when the row starts mid-word), whole
// words of two values and a tail value; wider types are words of one value. Two values a word
// halve the shared-memory accesses and conversions of the row's three passes (max, sum,
// outputs), and the max of a pair is one instruction where the vendor has it. Loops run on
// 32-bit indices, unrolled by 4: they are most of this tier's instructions. `start` is the
// word the passes begin at, or -1 (for_each_word_from). LANES consecutive lanes share a row
// (LANES = 1: a thread a row): each takes every LANES-th word, and shuffles merge their (m, d).
template <int OP, typename T, int LANES>
PS_DEVICE void staged_row_in_words(T* row, int n, int start, bool safe) {
  typedef typename compute_of<T>::type C;
  const int G = sizeof(T) == 2 ? 2 : 1;  // values a word
  typedef Vec<T, G> Word;
  int head = G == 2 ? static_cast<int>(reinterpret_cast<unsigned long long>(row) / sizeof(T) % 2) : 0;
  head = head < n ? head : n;
  const int words = (n - head) / G;
  const bool tail = head + G * words < n;
  Word* word = reinterpret_cast<Word*>(row + head);
  start = start < 0 || words == 0 ? -1 : start % words;
  const bool leader = LANES == 1 || PS_THREAD_X % LANES == 0;  // takes the edge values
  // The edge values, -inf where there are none (they add nothing to (m, d)).
  const C first = head ? to_compute(row[0]) : ps_neg_inf<C>();
  const C last = tail ? to_compute(row[n - 1]) : ps_neg_inf<C>();
  C m = ps_max_nan(first, last);
  C v[G];
  if constexpr (PackedMax<T>::native) {
    Word top;
#pragma unroll
    for (int j = 0; j < G; ++j) top.v[j] = from_compute<T>(ps_neg_inf<C>());
    unsigned top_bits;
    memcpy(&top_bits, &top, 4);
    const unsigned* bits = reinterpret_cast<const unsigned*>(word);
    for_each_word_from<LANES>(start, words, [&](int k) { top_bits = PackedMax<T>::max(top_bits, bits[k]); });
    memcpy(&top, &top_bits, 4);
    widen(top, v);
#pragma unroll
    for (int j = 0; j < G; ++j) m = ps_max_nan(m, v[j]);
  } else {
    for_each_word_from<LANES>(start, words, [&](int k) {
      widen(read_word(word + k), v);
#pragma unroll
      for (int j = 0; j < G; ++j) m = ps_max_nan(m, v[j]);
    });
  }
  m = max_over_lanes<LANES>(m);
  C d = C(0);
  // Softmax takes its exps with a factor the row shares where it can (ExpShifted, an instruction a
  // value fewer), and its outputs then as 2^(x log2(e) - h - log2(d)) with the same h.
  bool shifted = false;
  C h = C(0);
  // The sum of exps: an empty row's is 0. Groups that share a warp take other rows (or none),
  // and shuffles need every lane of the warp, so those take no branch on their row: an empty
  // row's exps are taken about 0, where every value's exp is 0.
  auto sum_exps = [&](C about) {
    auto add_exps = [&](const auto& exp_of) {
      if (leader) d = exp_of(first) + exp_of(last);  // exp(-inf - m) = 0
      for_each_word_from<LANES>(start, words, [&](int k) {
        widen(read_word(word + k), v);
#pragma unroll
        for (int j = 0; j < G; ++j) d += exp_of(v[j]);
      });
    };
    if constexpr (OP == kSoftmax && same_type<C, float>::value) {
      if (exp_shift_fits<T>(about)) {
        const ExpShifted exp_shifted(about);
        shifted = true;
        h = exp_shifted.h;
        add_exps(exp_shifted);
      } else {
        add_exps(ExpMinus<C>(about));
      }
    } else {
      add_exps(ExpMinus<C>(about));
    }
    d = sum_over_lanes<LANES>(d);
  };
  if constexpr (kGroupsShareWarp<LANES>) {
    sum_exps(m == ps_neg_inf<C>() ? C(0) : m);
  } else if (m != ps_neg_inf<C>()) {  // the same in every lane of the row
    sum_exps(m);
  }
  MD<C> md = {m, d};
  const RowFinish<OP, T> f(md, safe);
  // The row's outputs, the emptiness test outside the loop (f(x) alone gives an empty row's outputs
  // too, but at a test a value).
  auto write = [&](auto&& out) {
    if (head && leader) row[0] = from_compute<T>(out(first));
    if (tail && leader) row[n - 1] = from_compute<T>(out(last));
    for_each_word_from<LANES>(start, words, [&](int k) {
      widen(read_word(word + k), v);
      Word w;
#pragma unroll
      for (int j = 0; j < G; ++j) w.v[j] = from_compute<T>(out(v[j]));
      word[k] = w;
    });
  };
  if (f.empty) {
    write([&](C) { return f.empty_value(); });
  } else if (OP == kSoftmax && same_type<C, float>::value && shifted) {
    const C log2_d = log2_for<T>(d);
    write([&](C x) { return PS_FAST_EXP2F(fmaf(x, 1.44269504088896341f, -h) - log2_d); });
  } else {
    write([&](C x) { return f.value(x); });
  }
}

// The forward op of the short rows (staged_rows, packed_groups). A staged row is finished in place in
// the tile: into registers where it is short (float-computed rows of up to 8 elements, 16-bit ones up
// to 16: one read of shared memory and one exp an element instead of three reads and two), else a
// word at a time.
template <typename T_, int OP> struct ForwardShortRows {
  typedef T_ T;
  typedef typename compute_of<T>::type C;
  static constexpr int kTiles = 1;  // the input, into which the outputs are written
  const T* x;
  T* y;
  template <int VEC> PS_DEVICE RowSlots<T, VEC> span(int, i64 first, i64 count, i64 cols) const {
    return RowSlots<T, VEC>(x + first * cols, y + first * cols, count * cols);
  }
  template <int N> PS_DEVICE void row_in_registers(C* v, const C*, bool safe) const {
    softmax_in_registers<OP, T, 1, N>(v, safe);
  }
  // n is the block's, so every lane of a group takes the same branch; the registers' count
  // nearest above it, as each costs its instructions.
  template <int LANES> PS_DEVICE void row(T* row, i64, int n, bool skew, int r, bool safe) const {
    if (LANES == 1 && sizeof(C) == 4 && n <= 8) {
      staged_row_in_registers<OP, T, 8>(row, n, safe);
    } else if (LANES == 1 && sizeof(C) == 4 && sizeof(T) == 2 && n <= 12) {
      staged_row_in_registers<OP, T, 12>(row, n, safe);
    } else if (LANES == 1 && sizeof(C) == 4 && sizeof(T) == 2 && n <= 16) {
      staged_row_in_registers<OP, T, 16>(row, n, safe);
    } else {
      staged_row_in_words<OP, T, LANES>(row, n, skew ? r % kSharedBanks : -1, safe);
    }
  }
};

// The spans of a tile's rows into shared memory, Op::kTiles of them tile_slots apart, in place
// when this returns (for this thread; for the block after a barrier). Out-of-span elements read as
// -inf and are never stored.
template <typename T, int VEC, int TILES>
PS_DEVICE void copy_spans_to_cache(const RowSlots<T, VEC> (&spans)[TILES], Vec<T, VEC>* cache, i64 tile_slots) {
#pragma unroll
  for (int a = 0; a < TILES; ++a) {
    Vec<T, VEC>* tile = cache + a * tile_slots;
#if PS_ASYNC_COPY
    if constexpr (kAsyncSlots<T, VEC>) {
      for (i64 k = PS_THREAD_X; k < spans[a].slots; k += PS_BLOCK_DIM_X) copy_slot_to_cache(spans[a], k, &tile[k]);
      continue;
    }
#endif
    for_each_slot<4>(spans[a], 0, spans[a].slots, [&](i64 k, const Vec<T, VEC>& raw) { tile[k] = raw; });
  }
#if PS_ASYNC_COPY
  if constexpr (kAsyncSlots<T, VEC>) async_copy_wait_all();
#endif
}

// Slots of one tile in shared memory: a span of tile_rows rows, and its partial vectors at both ends.
PS_DEVICE i64 staged_tile_slots(i64 tile_rows, i64 cols, int vec) { return (tile_rows * cols + 2 * (vec - 1)) / vec; }

// Rows of a few elements (or an odd number of bytes) give lanes short or misaligned loads.
// When rows are contiguous, tile_rows of them are one contiguous span: the block reads it
// with aligned vectors into shared memory, a thread (LANES = 1) or a group of LANES lanes takes
// each row from there and writes its outputs back, and the block stores the span with vectors.
// The op policy says what a row is:
//   Op::kTiles                       the arrays read, each a span of the tile (all alike aligned);
//                                    the outputs go into the first one's place
//   Op::span<VEC>(a, first, count, cols)  array a's span of rows [first, first + count), the first
//                                    one's with the output array
//   Op::row<LANES>(row, tile_step, n, skew, r, safe)  row r of the first tile finished in place
//                                    (row + tile_step: the same row of the next tile); with skew, its
//                                    thread starts at word r % kSharedBanks (for_each_word_from)
template <typename Op, int VEC, int LANES>
PS_DEVICE void staged_rows(const Op& op, i64 rows, i64 cols, i64 tile_rows, int safe,
                           Vec<typename Op::T, VEC>* cache, int row_shift = -1, int interleave = 0) {
  typedef typename Op::T T;
  // Groups sharing a warp (below) may take rows of 2^row_shift whole slots (row_shift >= 0, the span
  // aligned) with a slot of padding after each row in the tile: rows a whole number of 128-byte
  // lines long would otherwise start every group of a warp on the same banks.
  const bool padded = kGroupsShareWarp<LANES> && row_shift >= 0;
  static_assert(Op::kTiles == 1 || LANES == 1 || kGroupsShareWarp<LANES>, "tiles of several arrays: no padding");
  const i64 tile_slots = Op::kTiles > 1 ? staged_tile_slots(tile_rows, cols, VEC) : 0;
  for (i64 first = (i64)PS_BLOCK_X * tile_rows; first < rows; first += (i64)PS_GRID_DIM_X * tile_rows) {
    const i64 count = rows - first < tile_rows ? rows - first : tile_rows;
    RowSlots<T, VEC> spans[Op::kTiles];
#pragma unroll
    for (int a = 0; a < Op::kTiles; ++a) spans[a] = op.template span<VEC>(a, first, count, cols);
    const RowSlots<T, VEC>& span = spans[0];
    if (padded) {
      for (i64 k = PS_THREAD_X; k < span.slots; k += PS_BLOCK_DIM_X) {
        copy_slot_to_cache(span, k, &cache[k + (k >> row_shift)]);
      }
#if PS_ASYNC_COPY
      if constexpr (kAsyncSlots<T, VEC>) async_copy_wait_all();
#endif
    } else {
      copy_spans_to_cache(spans, cache, tile_slots);
    }
    PS_SYNC();
    T* tile = reinterpret_cast<T*>(cache) + span.pad;  // element i of the span at tile[i]
    const i64 tile_step = tile_slots * VEC;               // the next array's tile, from the first's
    // A tile lies in one block's shared memory: 32-bit indices.
    const int n = static_cast<int>(cols);
    // Rows an even number of words long start each thread at a different word (for_each_word_from).
    const bool skew = LANES == 1 && n * static_cast<int>(sizeof(T)) % 8 == 0;
    if constexpr (kGroupsShareWarp<LANES>) {
      // Groups that share a warp: every thread of the block runs the same count of steps (a
      // group past the tile's last row takes an empty one), so that a warp's groups reach their
      // shuffles together.
      const int groups = PS_BLOCK_DIM_X / LANES;
      const int stride = padded ? n + VEC : n;  // elements from a row's start to the next row's
      // The row of a step this group takes: in order, or (interleave) with the groups of each
      // 32 lanes on rows blockDim / 32 apart, which for some row lengths puts them on fewer
      // common banks (the planner counts both: staged_bank_ways).
      const int g = static_cast<int>(PS_THREAD_X / LANES);
      const int per_window = kNarrowestWarp / LANES, windows = groups / per_window;
      const int mine = interleave ? g % per_window * windows + g / per_window : g;
      for (int first_row = 0; first_row < count; first_row += groups) {
        const int r = first_row + mine;
        const bool live = r < count;
        op.template row<LANES>(tile + (live ? r : 0) * stride, tile_step, live ? n : 0, false, r, safe != 0);
      }
    } else {
      // r is the same in every lane of a group: the group's shuffles see all of its lanes.
      for (int r = PS_THREAD_X / LANES; r < count; r += PS_BLOCK_DIM_X / LANES) {
        op.template row<LANES>(tile + r * n, tile_step, n, skew, r, safe != 0);
      }
    }
    PS_SYNC();
    for (i64 k = PS_THREAD_X; k < span.slots; k += PS_BLOCK_DIM_X) {
      span.store_raw(k, cache[padded ? k + (k >> row_shift) : k]);
    }
    PS_SYNC();  // the next span reuses the tile
  }
}

// ---- a block a row: the row cached in shared memory --------------------------------------
// The row's copies in kBlockCopyGroups commit groups (cache_chunk), so that a block's exps of the
// first groups overlap its copies of the later ones. The on-chip split keeps one wait: its blocks
// already overlap one chunk's copies with another's stores (store_and_prefetch).
template <typename T> constexpr int kBlockCopyGroups = sizeof(T) == 4 ? 4 : 2;
template <typename T, int OP, int WARP, int VEC>
PS_DEVICE void block_rows(const T* x, T* y, i64 rows, i64 cols, i64 x_stride, i64 y_stride, int safe,
                          Vec<T, VEC>* cache) {
  for (i64 row = PS_BLOCK_X; row < rows; row += PS_GRID_DIM_X) {
    const RowSlots<T, VEC> rs(x + row * x_stride, y + row * y_stride, cols);
    const RowFinish<OP, T> f(md_reduce_block<WARP>(cache_chunk<T, VEC, kBlockCopyGroups<T>>(rs, 0, rs.slots, cache)),
                             safe != 0);
    store_from_cache(rs, 0, rs.slots, cache, f);
  }
}

// A slot kept in registers for a while (block_rows_registers): as a vector of 16-bit values nvcc
// held a register a value and spilled, so 16-bit slots are held as 32-bit words and widened from
// them, a pair a word.
template <typename T, int VEC, bool kAsWords = sizeof(T) == 2 && VEC % 2 == 0> struct HeldSlot {
  typedef typename compute_of<T>::type C;
  Vec<T, VEC> raw;
  PS_DEVICE void set(const Vec<T, VEC>& r) { raw = r; }
  PS_DEVICE void load_whole(const T* at) { raw = *reinterpret_cast<const Vec<T, VEC>*>(at); }
  PS_DEVICE void widen_into(C* v) const { widen(raw, v); }
};
template <typename T, int VEC> struct HeldSlot<T, VEC, true> {
  unsigned w[VEC / 2];
  PS_DEVICE void set(const Vec<T, VEC>& r) { memcpy(w, &r, sizeof(w)); }
  // One vector load, as four words: through a Vec nvcc loaded a value at a time, and as the held
  // type itself clang 15 crashed selecting gfx90a instructions.
  PS_DEVICE void load_whole(const T* at) {
    if constexpr (sizeof(w) == sizeof(ps_words4)) {
      const ps_words4 words = *reinterpret_cast<const ps_words4*>(at);
      memcpy(w, words.w, sizeof(w));
    } else {
      set(*reinterpret_cast<const Vec<T, VEC>*>(at));
    }
  }
  PS_DEVICE void widen_into(float* v) const {
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      if constexpr (same_type<T, bfloat16_t>::value) {  // a bfloat16 is the top half of a float32
        const unsigned lo = w[i] << 16, hi = w[i] & 0xffff0000u;
        memcpy(&v[2 * i], &lo, 4);
        memcpy(&v[2 * i + 1], &hi, 4);
      } else {
        const unsigned short lo = static_cast<unsigned short>(w[i] & 0xffffu), hi = static_cast<unsigned short>(w[i] >> 16);
        T a, b;
        memcpy(&a, &lo, 2);
        memcpy(&b, &hi, 2);
        v[2 * i] = to_compute(a);
        v[2 * i + 1] = to_compute(b);
      }
    }
  }
};

// A thread's HELD slots of a chunk's first HELD * blockDim (local slot u * blockDim + thread).
template <typename T, int VEC, int HELD> struct HeldChunkSlots {
  typedef typename compute_of<T>::type C;
  HeldSlot<T, VEC> slots[HELD > 0 ? HELD : 1];
  PS_DEVICE static int local(int u) { return u * static_cast<int>(PS_BLOCK_DIM_X) + static_cast<int>(PS_THREAD_X); }
  // Past the part (or the row): -inf, which adds nothing to (m, d).
  PS_DEVICE void load(const CachedChunk<T, VEC>& part) {
#pragma unroll
    for (int u = 0; u < HELD; ++u) {
      const int j = local(u);
      if (part.full(j)) {
        slots[u].load_whole(part.x0 + j * VEC);
      } else {
        slots[u].set(part.load_partial_raw(j));
      }
    }
  }
  template <typename Sum> PS_DEVICE void add_to(Sum& acc) const {
#pragma unroll
    for (int u = 0; u < HELD; ++u) {
      C v[VEC];
      slots[u].widen_into(v);
      acc.template push_all<VEC>(v);
    }
  }
  template <int OP> PS_DEVICE void store(const CachedChunk<T, VEC>& part, const RowFinish<OP, T>& f) const {
#pragma unroll
    for (int u = 0; u < HELD; ++u) {
      const int j = local(u);
      C v[VEC];
      slots[u].widen_into(v);
      finish_slot<OP, T, VEC>(f, v);
      if (part.full(j)) {
        part.store_whole(j, v);
      } else if (j < part.n) {
        part.store_partial(j, v);
      }
    }
  }
};

// ---- a block a row, past a block's shared memory: the first slots in registers ------------
// A block a row, alone on its multiprocessor, as block_rows, for rows that its shared memory
// alone cannot hold: a thread holds kRowRegisterSlots slots of the row's first
// kRowRegisterSlots * blockDim in registers (slot u * blockDim + thread, loaded first, all in
// flight at once), and the rest is cached in shared memory as block_rows caches a row. The
// registers' (m, d) is taken while the cache's copies land. Such a row is read once by a block
// that waits on no other, where the on-chip split's blocks wait for each other's chunks.
const int kRowRegisterSlots = 8;        // 32 of a thread's 64 registers at 1024 threads
const int kRowRegistersThreads = 1024;  // the launch bound (planner Tuning.row_registers_threads)

template <typename T, int OP, int WARP, int VEC>
PS_DEVICE void block_rows_registers(const T* x, T* y, i64 rows, i64 cols, i64 x_stride, i64 y_stride, int safe,
                                    Vec<T, VEC>* cache) {
  typedef typename compute_of<T>::type C;
  const int threads = PS_BLOCK_DIM_X, thread = PS_THREAD_X;
  for (i64 row = PS_BLOCK_X; row < rows; row += PS_GRID_DIM_X) {
    const RowSlots<T, VEC> rs(x + row * x_stride, y + row * y_stride, cols);
    // Slots [0, held) in registers; the row's last slot always in the cache, so that of the held
    // slots only the first (local slot 0, thread 0's first) can be partial.
    const i64 capacity = (i64)kRowRegisterSlots * threads;
    const i64 held = capacity < rs.slots - 1 ? capacity : rs.slots - 1;
    const CachedChunk<T, VEC> in_registers(rs, 0, held);
    auto slot = [&](int u) { return u * threads + thread; };
    Vec<T, VEC> empty;  // past the held slots: -inf, which adds nothing to (m, d)
#pragma unroll
    for (int e = 0; e < VEC; ++e) empty.v[e] = from_compute<T>(ps_neg_inf<C>());
    // Loaded and stored here, not by HeldChunkSlots' load and store: only slot 0 can be partial.
    HeldChunkSlots<T, VEC, kRowRegisterSlots> held_slots;
    held_slots.slots[0].set(in_registers.load_raw(slot(0)));
#pragma unroll
    for (int u = 1; u < kRowRegisterSlots; ++u) {
      const int j = slot(u);  // whole, or past the held slots
      held_slots.slots[u].set(empty);
      if (j < in_registers.n) held_slots.slots[u].load_whole(in_registers.x0 + j * VEC);
    }
    auto add_registers = [&](OnlineSum<C>& acc) { held_slots.add_to(acc); };  // past the held ones: -inf
    const MD<C> part = cache_chunk<T, VEC, kBlockCopyGroups<T>>(rs, held, rs.slots, cache, false, add_registers);
    const RowFinish<OP, T> f(md_reduce_block<WARP>(part), safe != 0);
#pragma unroll
    for (int u = 0; u < kRowRegisterSlots; ++u) {
      const int j = slot(u);
      C v[VEC];
      held_slots.slots[u].widen_into(v);
      finish_slot<OP, T, VEC>(f, v);
      if (u == 0 && !in_registers.full(j)) {
        if (j < in_registers.n) in_registers.store_partial(j, v);
      } else if (j < in_registers.n) {
        in_registers.store_whole(j, v);
      }
    }
    store_from_cache(rs, held, rs.slots, cache, f);  // a thread's cache slots stay its own from row to row
  }
}

// ---- a row split across blocks: two passes ------------------------------------------------
// Pass 1 writes one (m, d) per chunk of chunk_slots slots; pass 2 merges the
// row's partials with the monoid and normalises its chunk.
// 16-bit slots carry twice the values a byte of 32-bit ones: their thread's four slots in flight are
// taken together, the max first (packed pairs where native), then one rescale, one exp a value
// and one compensated add for all 32 values, where a slot at a time rescales and adds four times.
template <typename T, int VEC>
PS_DEVICE MD<typename compute_of<T>::type> chunk_md(const RowSlots<T, VEC>& rs, i64 begin, i64 end) {
  typedef typename compute_of<T>::type C;
  OnlineSum<C> acc;
  if constexpr (kTwoPassChunk<T, VEC>) {
    constexpr int kDepth = 4, kWords = VEC / 2;
    const i64 step = PS_BLOCK_DIM_X;
    for (i64 k0 = begin + PS_THREAD_X; k0 < end; k0 += kDepth * step) {
      Vec<T, VEC> raw[kDepth];
#pragma unroll
      for (int u = 0; u < kDepth; ++u) raw[u] = k0 + u * step < end ? rs.load_raw(k0 + u * step) : neg_inf_vec<T, VEC>();
      C top;
      if constexpr (PackedMax<T>::native) {
        unsigned w[kDepth][kWords];
        memcpy(w, raw, sizeof(w));
#pragma unroll
        for (int u = 1; u < kDepth; ++u) {
#pragma unroll
          for (int k = 0; k < kWords; ++k) w[0][k] = PackedMax<T>::max(w[0][k], w[u][k]);
        }
#pragma unroll
        for (int k = 1; k < kWords; ++k) w[0][0] = PackedMax<T>::max(w[0][0], w[0][k]);
        Vec<T, 2> pair;
        memcpy(&pair, &w[0][0], 4);
        C two[2];
        widen(pair, two);
        top = ps_max_nan(two[0], two[1]);
      } else {
        top = ps_neg_inf<C>();
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          C v[VEC];
          widen(raw[u], v);
#pragma unroll
          for (int j = 0; j < VEC; ++j) top = ps_max_nan(top, v[j]);
        }
      }
      acc.raise_to(top);
      const ExpMinus<C> exp_minus(acc.m);
      C sum = C(0);
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        C v[VEC];
        widen(raw[u], v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum += exp_minus(v[j]);
      }
      acc.add(sum);
    }
  } else {
    for_each_slot<4>(rs, begin, end, [&](i64, const Vec<T, VEC>& raw) {
      C v[VEC];
      widen(raw, v);
      acc.template push_all<VEC>(v);
    });
  }
  return acc.md();
}

// The regime for every op: the first pass reduces each chunk of chunk_slots slots of a row (a block
// a chunk) to its partial; the second merges a row's partials and finishes each chunk, in the
// reverse of the first pass's order, so that the chunks read last are those the L2 cache still
// holds. The op policy Op says what a chunk reduces to and how it finishes:
//   Op::row<VEC>(r, cols)                       row r's arrays as aligned slots
//   Op::chunk<WARP>(row, begin, end)            a chunk's partial, the block's
//   Op::publish(partials, job, partial)         (thread 0) the partial into scratch
//   Op::merge<WARP>(partials, row, chunks)      a row's partials merged: how its slots finish
//   Op::finish_chunk(row, begin, end, finish)   the chunk's outputs
template <typename Op, int WARP, int VEC, typename P>
PS_DEVICE void split_first_pass(const Op& op, P* partials, i64 rows, i64 cols, i64 chunk_slots, i64 chunks) {
  for (i64 job = PS_BLOCK_X; job < rows * chunks; job += PS_GRID_DIM_X) {
    const i64 row = job / chunks, chunk = job % chunks;
    const auto rs = op.template row<VEC>(row, cols);
    const i64 begin = chunk * chunk_slots;
    const i64 end = begin + chunk_slots < rs.slots ? begin + chunk_slots : rs.slots;
    const auto part = op.template chunk<WARP>(rs, begin, end);
    if (PS_THREAD_X == 0) op.publish(partials, job, part);
  }
}

template <typename Op, int WARP, int VEC, typename P>
PS_DEVICE void split_second_pass(const Op& op, const P* partials, i64 rows, i64 cols, i64 chunk_slots,
                                 i64 chunks) {
  const i64 jobs = rows * chunks;
  for (i64 k = PS_BLOCK_X; k < jobs; k += PS_GRID_DIM_X) {
    const i64 job = jobs - 1 - k;
    const i64 row = job / chunks, chunk = job % chunks;
    const auto finish = op.template merge<WARP>(partials, row, chunks);
    const auto rs = op.template row<VEC>(row, cols);
    const i64 begin = chunk * chunk_slots;
    const i64 end = begin + chunk_slots < rs.slots ? begin + chunk_slots : rs.slots;
    op.finish_chunk(rs, begin, end, finish);
  }
}

// The forward op of the two-pass split: (m, d) partials (the same for softmax and log_softmax),
// merged by every thread of the block.
template <typename T, int OP> struct ForwardSplit {
  typedef typename compute_of<T>::type C;
  const T* x;
  T* y;  // the first pass writes none
  i64 x_stride, y_stride;
  bool safe;
  template <int VEC> PS_DEVICE RowSlots<T, VEC> row(i64 r, i64 cols) const {
    return RowSlots<T, VEC>(x + r * x_stride, y + r * y_stride, cols);
  }
  template <int WARP, int VEC> PS_DEVICE MD<C> chunk(const RowSlots<T, VEC>& rs, i64 begin, i64 end) const {
    return md_reduce_block<WARP>(chunk_md<T, VEC>(rs, begin, end));
  }
  PS_DEVICE void publish(C* partials, i64 job, MD<C> md) const {
    partials[2 * job] = md.m;
    partials[2 * job + 1] = md.d;
  }
  template <int WARP> PS_DEVICE RowFinish<OP, T> merge(const C* partials, i64 row, i64 chunks) const {
    // A row of one chunk (a caller that merged the row's pairs itself: the sharded finish) is its
    // pair: every thread reads it, no block reduction and no barrier before the row's loads.
    if (chunks == 1) return RowFinish<OP, T>(MD<C>{partials[2 * row], partials[2 * row + 1]}, safe);
    MD<C> md = md_identity<C>();
    for (i64 c = PS_THREAD_X; c < chunks; c += PS_BLOCK_DIM_X) {
      MD<C> part = {partials[2 * (row * chunks + c)], partials[2 * (row * chunks + c) + 1]};
      md = md_combine(md, part);
    }
    return RowFinish<OP, T>(md_reduce_block<WARP>(md), safe);
  }
  template <int VEC>
  PS_DEVICE void finish_chunk(const RowSlots<T, VEC>& rs, i64 begin, i64 end, const RowFinish<OP, T>& f) const {
    // Two 8-wide slots in flight, not four: 1024-thread blocks have 64 registers a thread.
    for_each_slot<(VEC >= 8 ? 2 : 4)>(rs, begin, end, [&](i64 k, const Vec<T, VEC>& raw) {
      C v[VEC];
      finish_slot(f, raw, v);
      rs.template store<true>(k, v);
    });
  }
};

// The two passes through a buffer in shared memory, buffer_slots slots of a chunk at a time, filled
// as the block tier fills its row cache (cache_chunk): a thread's whole share of each piece in flight
// at once through asynchronous copies, where streaming through registers keeps two to four slots in
// flight. The first pass's 16-bit values then take their max before their exps (add_cached_two_pass)
// instead of rescaling four slots at a time. Without asynchronous copies, the second pass streams.
template <typename T, int OP> struct ForwardSplitBuffered : ForwardSplit<T, OP> {
  typedef typename compute_of<T>::type C;
  float4* buffer;
  i64 buffer_slots;
  template <int WARP, int VEC> PS_DEVICE MD<C> chunk(const RowSlots<T, VEC>& rs, i64 begin, i64 end) const {
    MD<C> md = md_identity<C>();
    for (i64 piece = begin; piece < end; piece += buffer_slots) {
      const i64 piece_end = piece + buffer_slots < end ? piece + buffer_slots : end;
      md = md_combine(md, cache_chunk<T, VEC, kBlockCopyGroups<T>>(rs, piece, piece_end,
                                                                   reinterpret_cast<Vec<T, VEC>*>(buffer)));
    }
    return md_reduce_block<WARP>(md);
  }
  template <int VEC>
  PS_DEVICE void finish_chunk(const RowSlots<T, VEC>& rs, i64 begin, i64 end, const RowFinish<OP, T>& f) const {
#if PS_ASYNC_COPY
    if constexpr (kAsyncSlots<T, VEC>) {
      Vec<T, VEC>* cache = reinterpret_cast<Vec<T, VEC>*>(buffer);
      for (i64 piece = begin; piece < end; piece += buffer_slots) {
        const i64 piece_end = piece + buffer_slots < end ? piece + buffer_slots : end;
        const CachedChunk<T, VEC> part(rs, piece, piece_end);
        const auto partial = part.fetch_partial();
        part.copy_whole(part.first_whole_of_thread(), part.whole_end(), cache);
        part.place_partial(partial, cache);
        async_copy_wait_all();
        store_from_cache(rs, piece, piece_end, cache, f);  // a thread reads back only the slots it copied
      }
      return;
    }
#endif
    ForwardSplit<T, OP>::template finish_chunk<VEC>(rs, begin, end, f);
  }
};

// ---- a row split across blocks: on chip, the blocks co-resident ---------------------------
// Each block caches its chunk in shared memory, publishes the chunk's (m, d) and
// waits only for the other chunks of the same row, then normalises from the cache:
// one read and one write of the row. The launch keeps every block resident
// (rows advance in rounds of gridDim / chunks), so the wait always ends.
// The chunks' pairs meet in PublishedPairs (below). A block's stores of one
// row refill its cache with its chunk of the next (store_and_prefetch).

// One thread of a block counts the block's arrival and waits until `blocks` blocks have arrived;
// with `fence`, writes made visible (fenced) before the arrival are visible to it after the wait.
// Without it (readers that poll each word until it lands, PublishedPairs' float pairs) the wait
// ends sooner: the fence waits for every earlier write of the thread.
PS_DEVICE void arrive_and_wait(unsigned* arrivals, i64 blocks, bool fence = true) {
  PS_ATOMIC_ADD(arrivals, 1u);
  while (PS_ATOMIC_ADD(arrivals, 0u) < (unsigned)blocks) PS_SPIN_PAUSE();
  if (fence) PS_THREAD_FENCE();
}

// After the last row (or tile) a block takes, once it has read that row's pairs: the block counts
// its departure on the row's count, past the `counted` arrivals it holds (the blocks that wait on
// the count: `blocks`; those that poll the pairs: 0). Whether this block is the row's last to
// leave, which then clears the row's pairs and count.
PS_DEVICE bool depart_last(unsigned* arrivals, i64 blocks, i64 counted) {
  return PS_ATOMIC_ADD(arrivals, 1u) == (unsigned)(blocks + counted - 1);
}

// The (m, d) pairs that the chunks of a row (or of a tile's position) publish to each other, in
// scratch that is zero when the launch starts and that the launch leaves zero (each pair and count
// cleared once every block that reads it is past the read: row_total_across_blocks,
// depart_last), so that one zero fill serves every later launch on the stream. A float pair is
// one 64-bit word, written with one store; a
// reader polls it until it is not zero, which a published pair never is (m = +0 comes with d >= 1,
// d = 0 only with m = -inf). So a float pair needs no fence before its writer counts its arrival
// (arrive_and_wait): the count says when to look, the word whether it has landed. A fence waits for
// every earlier write of the thread, the row's output stores among them. A double pair is two
// words: its writer fences before
// counting (kCounted) and its readers read once after the count.
template <typename C> struct PublishedPairs {
  static constexpr bool kCounted = sizeof(C) != 4;
  C* partials;
  union Word {
    C md[2];
    unsigned long long bits;
  };
  PS_DEVICE void publish(i64 slot, MD<C> md) const {
    if constexpr (kCounted) {
      volatile C* at = partials + 2 * slot;
      at[0] = md.m;
      at[1] = md.d;
      PS_THREAD_FENCE();  // both words visible before the arrival is counted
    } else {
      Word w;
      w.md[0] = md.m;
      w.md[1] = md.d;
      PS_PUBLISH_WORD(partials + 2 * slot, w.bits);
    }
  }
  PS_DEVICE void clear(i64 slot) const {
    if constexpr (kCounted) {
      partials[2 * slot] = C(0);
      partials[2 * slot + 1] = C(0);
    } else {
      PS_PUBLISH_WORD(partials + 2 * slot, 0ull);
    }
  }
  // Double pairs: read after their arrival is counted. Float pairs: waits until it has landed.
  PS_DEVICE MD<C> read(i64 slot) const {
    if constexpr (kCounted) {
      const volatile C* at = partials + 2 * slot;
      return MD<C>{at[0], at[1]};
    } else {
      Word w;
      while ((w.bits = PS_READ_WORD(partials + 2 * slot)) == 0) PS_SPIN_PAUSE();
      return MD<C>{w.md[0], w.md[1]};
    }
  }
};

// The (m, d) of a whole row from its chunks' partials (`local`: this thread's, not yet reduced):
// publish this block's, wait for the row's other chunks, merge them all. One thread waits on the
// count while the others sit at a barrier (threads polling the pairs themselves would take issue
// slots from the block's loads). The block's pair and the row's total are reduced in warp 0 alone:
// four barriers a row, where two block reductions take six.
// previous_row (or -1): the row these blocks took before, whose scratch this block clears here.
template <int WARP, typename C>
PS_DEVICE MD<C> row_total_across_blocks(MD<C> local, C* partials, unsigned* arrivals, i64 row, i64 chunk,
                                        i64 chunks, i64 previous_row) {
  const PublishedPairs<C> pairs{partials};
  const MD<C> part = md_reduce_to_first_warp<WARP>(local);
  if (PS_THREAD_X == 0) {
    pairs.publish(row * chunks + chunk, part);
    arrive_and_wait(arrivals + row, chunks, PublishedPairs<C>::kCounted);
    // Every block of this row has arrived, so each has read the previous row's pairs: this block's
    // pair of that row, and (chunk 0) its count, go back to zero.
    if (previous_row >= 0) {
      pairs.clear(previous_row * chunks + chunk);
      if (chunk == 0) arrivals[previous_row] = 0u;
    }
  }
  PS_SYNC();
  MD<C> md = md_identity<C>();
  if (PS_THREAD_X < WARP) {
    for (i64 c = PS_THREAD_X; c < chunks; c += WARP) {
      md = md_combine(md, c == chunk ? part : pairs.read(row * chunks + c));
    }
    md = md_reduce_lanes<WARP>(md);
  }
  return md_from_first_warp<WARP>(md);
}

// HELD > 0 (split_cached_registers): a thread also holds HELD slots of its chunk in registers,
// the chunk's first HELD * blockDim slots (slot begin + u * blockDim + thread), and the cache the
// rest. So a multiprocessor holds more blocks' chunks at the same chunk size (its registers beside
// its shared memory): the split's figure rises with the blocks a multiprocessor. The next row's
// held slots are loaded as this row's are stored, as store_and_prefetch refills the cache. The
// built (held slots, blocks) pairs are _variants.SPLIT_REGISTERS_CONFIGS: more held slots under
// fewer blocks, or slots spilled under the register cap, would lose the gain.
const int kSplitRegistersThreads = 256;  // the launch bound (planner Tuning.split_registers_threads)

// A block's first row, whose copies no earlier row's stores issued: float32 chunks in two commit
// groups (cache_chunk), so that the first half's exps overlap the second half's copies. 16-bit
// chunks keep one: the groups' one-pass sum would replace their cheaper two-pass one.
template <typename T> constexpr int kSplitFirstRowGroups = sizeof(T) == 4 ? 2 : 1;

template <typename T, int OP, int WARP, int VEC, int HELD = 0>
PS_DEVICE void split_cached(const T* x, T* y, typename compute_of<T>::type* partials, unsigned* arrivals,
                            i64 rows, i64 cols, i64 x_stride, i64 y_stride, i64 chunk_slots, i64 chunks,
                            int safe, Vec<T, VEC>* cache) {
  const i64 rows_per_round = PS_GRID_DIM_X / chunks;
  const i64 chunk = PS_BLOCK_X % chunks;
  if ((i64)PS_BLOCK_X / chunks >= rows_per_round) return;  // the grid's remainder: idle blocks
  const i64 begin = chunk * chunk_slots;
  // slots [begin, cached) of the chunk in registers (HELD > 0), [cached, end) in the cache
  typedef typename compute_of<T>::type C;
  const i64 held = (i64)HELD * PS_BLOCK_DIM_X;
  const i64 cached = HELD == 0 ? begin : begin + (held < chunk_slots ? held : chunk_slots);
  auto clip = [](i64 v, i64 end) { return v < end ? v : end; };
  HeldChunkSlots<T, VEC, HELD> in_registers;
  bool issued = false;       // this row's copies were issued by the previous row's stores
  bool held_loaded = false;  // and its held slots loaded
  for (i64 row = PS_BLOCK_X / chunks; row < rows; row += rows_per_round) {
    const RowSlots<T, VEC> rs(x + row * x_stride, y + row * y_stride, cols);
    const i64 end = clip(begin + chunk_slots, rs.slots);
    if (HELD > 0 && !held_loaded) in_registers.load(CachedChunk<T, VEC>(rs, begin, clip(cached, end)));
    MD<C> part;
    if constexpr (HELD > 0) {
      part = cache_chunk<T, VEC, kSplitFirstRowGroups<T>>(rs, cached, end, cache, issued,
                                                          [&](OnlineSum<C>& acc) { in_registers.add_to(acc); });
    } else {
      part = cache_chunk<T, VEC, kSplitFirstRowGroups<T>>(rs, begin, end, cache, issued);
    }
    const auto md = row_total_across_blocks<WARP>(part, partials, arrivals, row, chunk, chunks,
                                                  row >= rows_per_round ? row - rows_per_round : -1);
    const RowFinish<OP, T> f(md, safe != 0);
    const i64 next_row = row + rows_per_round < rows ? row + rows_per_round : row;  // row: no next row
    const RowSlots<T, VEC> next(x + next_row * x_stride, y + next_row * y_stride, cols);
    const i64 next_slots = clip(begin + chunk_slots, next.slots);
    if constexpr (HELD > 0) {
      in_registers.template store<OP>(CachedChunk<T, VEC>(rs, begin, clip(cached, end)), f);
      held_loaded = next_row != row;
      if (held_loaded) in_registers.load(CachedChunk<T, VEC>(next, begin, clip(cached, next_slots)));
    }
    issued = store_and_prefetch(rs, cached, end, cache, f, next, next_row == row ? cached : next_slots);
    if (next_row == row && PS_THREAD_X == 0 && depart_last(arrivals + row, chunks, chunks)) {
      // The last row's pairs, read by every block of the row before it left: the scratch as found.
      const PublishedPairs<typename compute_of<T>::type> pairs{partials};
      for (i64 c = 0; c < chunks; ++c) pairs.clear(row * chunks + c);
      arrivals[row] = 0u;
    }
  }
}

// A partial kept in shared memory as two arrays, one a field (the forward's (m, d); a gradient's
// (sum, top) in backward.cuh), so that column groups merge alike for every op.
template <typename P> struct PartialFields;
template <typename C> struct PartialFields<MD<C>> {
  typedef C First;
  typedef C Second;
  PS_DEVICE static MD<C> get(const C* m, const C* d, int at) { MD<C> r = {m[at], d[at]}; return r; }
  PS_DEVICE static void put(C* m, C* d, int at, MD<C> md) { m[at] = md.m; d[at] = md.d; }
  PS_DEVICE static MD<C> identity() { return md_identity<C>(); }
  PS_DEVICE static MD<C> combine(MD<C> a, MD<C> b) { return md_combine(a, b); }
};

// The partial of tile position q over the column groups' partials in the scratch ([group][position]).
template <typename P, typename F = PartialFields<P>>
PS_DEVICE P merge_column_groups(const typename F::First* first, const typename F::Second* second, int q, int groups,
                                int width) {
  P total = F::identity();
  for (int g = 0; g < groups; ++g) total = F::combine(total, F::get(first, second, g * width + q));
  return total;
}

// The on-chip strided tier's merges over `rows` rows of (m, d) pairs in the scratch ([row][position])
// for each of `width` positions, in two steps so that no thread merges a long chain while the
// block waits at the barrier after it: first the block's threads side by side, a thread a
// (position, slice of the rows) in the slice's first row (which no other thread reads), then
// (after a barrier) a thread a position over the slices (merge_column_groups). `slices` is
// merge_slices_of(rows, width). One warp merging a tile's rows alone would hold the block's other
// warps at those barriers.
PS_DEVICE int merge_slices_of(int rows, int width) {
  const int threads_a_position = PS_BLOCK_DIM_X / width;
  return threads_a_position < rows ? (threads_a_position > 1 ? threads_a_position : 1) : rows;
}
template <typename P, typename F = PartialFields<P>>
PS_DEVICE void merge_rows_in_slices(typename F::First* first, typename F::Second* second, int rows, int width,
                                    int slices) {
  for (int t = PS_THREAD_X; t < slices * width; t += PS_BLOCK_DIM_X) {
    const int q = t % width, s = t / width;  // neighbouring lanes, neighbouring positions: no bank conflict
    P part = F::identity();
    for (int r = s; r < rows; r += slices) part = F::combine(part, F::get(first, second, r * width + q));
    F::put(first, second, s * width + q, part);
  }
}

// ---- a strided axis: column groups of a block, two reads ---------------------------------
// The arrays are (outer, cols, inner). A block takes a tile of inner_tile neighbouring inner
// positions (coalesced loads) and splits the reduced axis among blockDim / inner_tile column
// groups, whose partials merge in shared memory (PartialFields); then it reads the tile again to
// finish it. The regime for every op; the op policy Op says what a position's column is:
//   Op::Value, Op::Accumulator          what a thread loads of an element; a thread's running partial
//   Op::Partial                         the partial of a column (or of a group's part of it)
//   op.column(o, i) / op.output(o, i)   the input column(s) and the output column of position i of
//                                       outer index o
//   op.load(column, c) / Op::absent()   element c of a column, and a value that adds nothing
//   Op::add<N>(acc, values), Op::partial(acc)   N values into a running partial; the partial
//   Op::Finish(total, safe)             how the column's elements finish
//   op.store(output, c, finish, value)  element c's output
// The policies are those of strided_thread too.
template <typename Op>
PS_DEVICE void strided_axis(const Op& op, i64 outer, i64 cols, i64 inner, int inner_tile, int safe) {
  typedef typename Op::Partial P;
  typedef PartialFields<P> F;
  PS_SHARED typename F::First part_first[1024];
  PS_SHARED typename F::Second part_second[1024];
  const int tx = PS_THREAD_X % inner_tile;
  const int ty = PS_THREAD_X / inner_tile;
  const int groups = PS_BLOCK_DIM_X / inner_tile;
  const i64 tiles_per_outer = (inner + inner_tile - 1) / inner_tile;
  for (i64 tile = PS_BLOCK_X; tile < outer * tiles_per_outer; tile += PS_GRID_DIM_X) {
    const i64 o = tile / tiles_per_outer;
    const i64 i = (tile % tiles_per_outer) * inner_tile + tx;
    const bool active = i < inner;
    const auto column = op.column(o, i);
    typename Op::Accumulator acc;
    const int kDepth = 4;  // loads in flight per thread before their dependent use
    if (active) {
      for (i64 c0 = ty; c0 < cols; c0 += kDepth * groups) {
        typename Op::Value v[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) v[u] = c0 + u * groups < cols ? op.load(column, c0 + u * groups) : Op::absent();
        Op::template add<kDepth>(acc, v);
      }
    }
    F::put(part_first, part_second, PS_THREAD_X, Op::partial(acc));
    PS_SYNC();
    if (ty == 0) {  // each thread merges the groups of its own inner position
      F::put(part_first, part_second, tx, merge_column_groups<P>(part_first, part_second, tx, groups, inner_tile));
    }
    PS_SYNC();
    const P total = F::get(part_first, part_second, tx);
    PS_SYNC();  // the next tile reuses the scratch
    if (active) {
      const typename Op::Finish f(total, safe != 0);
      const auto out = op.output(o, i);
      for (i64 c0 = ty; c0 < cols; c0 += kDepth * groups) {
        typename Op::Value v[kDepth];  // all loads before the first store, which might alias them (in place)
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          if (c0 + u * groups < cols) v[u] = op.load(column, c0 + u * groups);
        }
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          if (c0 + u * groups < cols) op.store(out, c0 + u * groups, f, v[u]);
        }
      }
    }
  }
}

// The passes of strided_thread. The one-GPU ops make both: each position's partial, then its
// outputs. An axis sharded across ranks makes them apart, with the collective between: the first
// publishes each position's partial (op.publish(at, partial)), the second finishes each position
// from a given one (op.given(line, at), the position's line beside it); `at` = o * inner + i, the
// positions' order as a contiguous (outer, inner) array.
enum StridedPasses { kBothPasses, kFirstPass, kSecondPass };

// ---- a strided axis, short: a thread per inner vector -------------------------------------
// Where the reduced axis is short (a few rows) and inner long, strided_axis's column groups idle
// and its barriers come every few values. Here a thread takes LINES vectors of VEC neighbouring
// inner positions (one load a row each; the host checks that every row is VEC-aligned), the
// block's LINES x 256 vectors side by side so that each of a thread's loads is coalesced across
// the block, and the whole reduced axis: no shared memory, no barrier. The variants take 16 bytes
// of positions a thread (VEC x LINES), so that narrower vectors keep as many loads in flight.
// kStridedHeld rows (of all the lines) stay in registers from the (m, d) pass to the outputs;
// longer axes read theirs again (a warp's rows were just read: mostly from the L2).
const int kStridedThreadThreads = 256;  // the launch's block size
const int kStridedHeld = 8;             // vectors a thread holds
const int kStridedPassHeld = 4;  // ... in the passes apart, whose chunks of the axis give the device more threads

// The op policy Op says what a thread holds and how a position finishes:
//   Op::Line, op.line(o, i)                 the arrays' columns at inner position i of outer index o
//   Op::Held<VEC>, op.load_vector<VEC>(line, c)   a row's VEC positions as loaded (a vector an array)
//   Op::absent_vector<VEC>()                ... for a row past the axis: values that add nothing
//   Op::Value, Op::value(held, j)           position j of a held row, widened
//   Op::Accumulator, Op::add<N>(acc, values)    N values into a running partial
//   Op::Partial, Op::partial(acc)           the partial of a position's whole axis
//   Op::Finish(partial, safe)               how a position's elements finish
//   op.store_vector<VEC>(line, c, finish, held)   row c's outputs of the line's VEC positions
//   Op::kPasses, op.publish(at, partial), op.given(line, at)   the passes it makes (StridedPasses)
//   Op::kHeld                               vectors a thread holds a step (of all its lines)
template <typename Op, int VEC, int LINES>
PS_DEVICE void strided_thread(const Op& op, i64 outer, i64 cols, i64 inner, int safe) {
  typedef typename Op::template Held<VEC> H;
  typedef typename Op::Finish F;
  constexpr int kRows = Op::kHeld > LINES ? Op::kHeld / LINES : 1;  // rows of each line a step
  const i64 vectors_per_outer = (inner + VEC - 1) / VEC;  // inner is a multiple of VEC where VEC > 1
  const i64 lines = outer * vectors_per_outer;
  const i64 block_lines = (i64)PS_BLOCK_DIM_X * LINES;
  for (i64 base = (i64)PS_BLOCK_X * block_lines; base < lines; base += (i64)PS_GRID_DIM_X * block_lines) {
    typename Op::Line line[LINES];
    bool live[LINES];
    i64 first[LINES];  // the index of the line's first position (the passes apart: StridedPasses)
#pragma unroll
    for (int l = 0; l < LINES; ++l) {
      const i64 at = base + l * PS_BLOCK_DIM_X + PS_THREAD_X;
      live[l] = at < lines;
      const i64 o = at / vectors_per_outer, i = (at % vectors_per_outer) * VEC;
      line[l] = op.line(o, i);
      first[l] = o * inner + i;
    }
    H held[LINES][kRows];
    typename Op::Accumulator acc[LINES][VEC];
    for (i64 c0 = 0; Op::kPasses != kSecondPass && c0 < cols; c0 += kRows) {
#pragma unroll
      for (int l = 0; l < LINES; ++l) {
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          held[l][u] = live[l] && c0 + u < cols ? op.template load_vector<VEC>(line[l], c0 + u)
                                                : Op::template absent_vector<VEC>();
        }
      }
#pragma unroll
      for (int l = 0; l < LINES; ++l) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          typename Op::Value v[kRows];
#pragma unroll
          for (int u = 0; u < kRows; ++u) v[u] = Op::value(held[l][u], j);
          Op::template add<kRows>(acc[l][j], v);
        }
      }
    }
    // Each position's finish, made once; past 8 positions a thread a line's finish is made where
    // its outputs are (the axes those variants take fit one step), which holds fewer registers.
    constexpr bool kFinishOnce = LINES * VEC <= 8;
    typename Op::Partial part[LINES][VEC];
    F finish_once[kFinishOnce ? LINES : 1][VEC];
#pragma unroll
    for (int l = 0; l < LINES; ++l) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (Op::kPasses == kSecondPass) {
          if (live[l]) part[l][j] = op.given(line[l], first[l] + j);
        } else {
          part[l][j] = Op::partial(acc[l][j]);
        }
        if constexpr (Op::kPasses == kFirstPass) {
          if (live[l]) op.publish(first[l] + j, part[l][j]);
        } else if constexpr (kFinishOnce) {
          finish_once[l][j] = F(part[l][j], safe != 0);
        }
      }
    }
    for (i64 c0 = 0; Op::kPasses != kFirstPass && c0 < cols; c0 += kRows) {
      // all loads before the first store, which might alias them (in place)
      if (cols > kRows || Op::kPasses == kSecondPass) {
#pragma unroll
        for (int l = 0; l < LINES; ++l) {
#pragma unroll
          for (int u = 0; u < kRows; ++u) {
            if (live[l] && c0 + u < cols) held[l][u] = op.template load_vector<VEC>(line[l], c0 + u);
          }
        }
      }
#pragma unroll
      for (int l = 0; l < LINES; ++l) {
        F finish[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if constexpr (kFinishOnce) {
            finish[j] = finish_once[l][j];
          } else {
            finish[j] = F(part[l][j], safe != 0);
          }
        }
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          if (live[l] && c0 + u < cols) op.template store_vector<VEC>(line[l], c0 + u, finish, held[l][u]);
        }
      }
    }
  }
}

// The forward op of the strided axis (strided_axis and strided_thread): one input, (m, d) partials.
template <typename T, int OP> struct ForwardStrided {
  typedef typename compute_of<T>::type C;
  typedef T Element;
  typedef PublishedPairs<C> Published;
  typedef C Value;
  typedef OnlineSum<C> Accumulator;
  typedef MD<C> Partial;
  typedef RowFinish<OP, T> Finish;
  static constexpr int kPasses = kBothPasses;
  static constexpr int kHeld = kStridedHeld;  // strided_thread's vectors a thread
  struct Line { const T* x; T* y; };
  template <int VEC> using Held = Vec<T, VEC>;
  const T* x;
  T* y;
  i64 xs_outer, xs_col, xs_inner, ys_outer, ys_col, ys_inner;
  template <int N> PS_DEVICE static void add(Accumulator& acc, const C* v) { acc.template push_all<N>(v); }
  PS_DEVICE static MD<C> partial(const Accumulator& acc) { return acc.md(); }
  // strided_axis: an element at a time
  PS_DEVICE const T* column(i64 o, i64 i) const { return x + o * xs_outer + i * xs_inner; }
  PS_DEVICE T* output(i64 o, i64 i) const { return y + o * ys_outer + i * ys_inner; }
  PS_DEVICE C load(const T* xl, i64 c) const { return to_compute(xl[c * xs_col]); }
  PS_DEVICE static C absent() { return ps_neg_inf<C>(); }
  PS_DEVICE void store(T* yl, i64 c, const Finish& f, C v) const { yl[c * ys_col] = from_compute<T>(f(v)); }
  // strided_thread: vectors of VEC positions
  PS_DEVICE Line line(i64 o, i64 i) const { return Line{x + o * xs_outer + i * xs_inner, y + o * ys_outer + i * ys_inner}; }
  template <int VEC> PS_DEVICE Vec<T, VEC> load_vector(const Line& l, i64 c) const {
    return *reinterpret_cast<const Vec<T, VEC>*>(l.x + c * xs_col);
  }
  template <int VEC> PS_DEVICE static Vec<T, VEC> absent_vector() { return neg_inf_vec<T, VEC>(); }
  template <int VEC> PS_DEVICE static C value(const Vec<T, VEC>& held, int j) { return to_compute(held.v[j]); }
  template <int VEC>
  PS_DEVICE void store_vector(const Line& l, i64 c, const Finish (&f)[VEC], const Vec<T, VEC>& held) const {
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_compute<T>(f[j](to_compute(held.v[j])));
    *reinterpret_cast<Vec<T, VEC>*>(l.y + c * ys_col) = out;
  }
  // strided_cached: a tile's rows through shared memory
  PS_DEVICE i64 output_col() const { return ys_col; }
  PS_DEVICE const T* advance(const T* at, i64 rows) const { return at + rows * xs_col; }
  template <int VEC> PS_DEVICE void store_held(T* out_at, const Finish (&f)[VEC], const Vec<T, VEC>& raw) const {
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_compute<T>(f[j](to_compute(raw.v[j])));
    *reinterpret_cast<Vec<T, VEC>*>(out_at) = out;
  }
#if PS_ASYNC_COPY
  template <int VEC> PS_DEVICE static void prefetch(Vec<T, VEC>* at, const T* from) {
    async_copy<sizeof(Vec<T, VEC>)>(at, from);
  }
#endif
};

// The forward's strided passes apart (StridedPasses), for an axis sharded across ranks: each
// position's (m, d) as two values of C side by side in `pairs`, position `at` at pairs[2 * at].
// The first pass is the same for both ops (OP = kSoftmax) and writes no y.
template <typename T, int OP, int PASSES> struct ForwardStridedPass : ForwardStrided<T, OP> {
  typedef typename compute_of<T>::type C;
  static constexpr int kPasses = PASSES;
  static constexpr int kHeld = kStridedPassHeld;
  C* pairs;
  PS_DEVICE void publish(i64 at, MD<C> md) const {
    pairs[2 * at] = md.m;
    pairs[2 * at + 1] = md.d;
  }
  template <typename Line> PS_DEVICE MD<C> given(const Line&, i64 at) const {
    return MD<C>{pairs[2 * at], pairs[2 * at + 1]};
  }
};

// A pass policy (ForwardStridedPass, GradientStridedPass) over chunks of the axis, so that the few
// lines of a long axis still fill the device: strided_thread's outer index is (o, k), k < chunks, and
// its line (o, k, i) covers rows [k * chunk_cols, (k + 1) * chunk_cols) of position (o, i) (the last
// chunk fewer). The first pass publishes each (o, k, i)'s partial in that order, for the caller to
// merge a position's chunks; the second finishes each line from its position's given partial.
template <typename Pass> struct StridedChunks : Pass {
  i64 chunks, chunk_cols, cols, inner;
  // `shift`: how far the kernel's index of the line's positions, (o * chunks + k) * inner + i, lies
  // past theirs, o * inner + i
  struct Line { typename Pass::Line at; i64 first, rows, shift; };
  PS_DEVICE Line line(i64 ok, i64 i) const {
    const i64 o = chunks == 1 ? ok : ok / chunks, k = ok - o * chunks;  // one chunk: no division
    const i64 first = k * chunk_cols;
    return Line{Pass::line(o, i), first, cols - first < chunk_cols ? cols - first : chunk_cols, (ok - o) * inner};
  }
  template <int VEC> PS_DEVICE typename Pass::template Held<VEC> load_vector(const Line& l, i64 c) const {
    return c < l.rows ? Pass::template load_vector<VEC>(l.at, l.first + c) : Pass::template absent_vector<VEC>();
  }
  template <int VEC>
  PS_DEVICE void store_vector(const Line& l, i64 c, const typename Pass::Finish (&f)[VEC],
                              const typename Pass::template Held<VEC>& held) const {
    if (c < l.rows) Pass::template store_vector<VEC>(l.at, l.first + c, f, held);
  }
  PS_DEVICE typename Pass::Partial given(const Line& l, i64 at) const { return Pass::given(l.at, at - l.shift); }
};

// ---- a strided axis, on chip: chunks of the axis on co-resident blocks -------------------
// strided_axis reads the tensor twice. Here a tile's reduced axis is split into `chunks` chunks
// of chunk_cols, each cached in shared memory by one of the tile's co-resident blocks (as
// stored, [chunk_cols][inner_tile * VEC]), which publishes one (m, d) per inner position, waits
// only for the tile's other chunks and normalises from its cache: one read and one write, as
// split_cached does for rows. A thread takes VEC neighbouring inner positions with one vector
// load per row (the host checks that every row of the tile is VEC-aligned, else VEC = 1).
// The chunks' pairs meet in PublishedPairs, as in split_cached (or polled pair by pair).
const int kStridedCachedThreads = 256;  // the launch's block size, which sizes the (m, d) scratch

// The op policy Op is the strided_thread one (Held<VEC>, line, load_vector, absent_vector, value,
// add, partial, Finish), and also says where a tile's outputs go and how its next tile's inputs are
// copied to the cache:
//   Op::Element                        the arrays' element type
//   Op::Published                      the partials as the chunks publish them to each other
//   op.output(o, i), op.output_col()   a position's output column and its stride along the axis
//   op.column(o, i), op.advance(at, k) a position's input column(s), k rows further
//   op.prefetch<VEC>(held, column)     a row of the inputs to the cache by asynchronous copies
//   op.store_held<VEC>(out, finish, held)   a row's outputs
template <typename Op, int VEC>
PS_DEVICE void strided_cached(const Op& op, typename Op::Published published, unsigned* arrivals, i64 outer,
                              i64 cols, i64 inner, int inner_tile, i64 chunk_cols, i64 chunks, int safe,
                              typename Op::template Held<VEC>* cache) {
  typedef typename Op::Element T;
  typedef typename Op::Partial P;
  typedef PartialFields<P> F;
  typedef typename Op::template Held<VEC> Held;
  static_assert(Op::kPasses == kBothPasses, "a strided axis on chip makes both passes (its point is one read)");
  PS_SHARED typename F::First part_m[kStridedCachedThreads * VEC];  // the partial of each thread's positions
  PS_SHARED typename F::Second part_d[kStridedCachedThreads * VEC];
  const int kDepth = VEC == 1 ? 8 : 4;  // rows in flight per thread before their use: 8 values or 4 vectors
  const int tx = PS_THREAD_X % inner_tile;
  const int ty = PS_THREAD_X / inner_tile;
  const int groups = PS_BLOCK_DIM_X / inner_tile;
  const int width = inner_tile * VEC;  // inner positions of a tile
  const i64 tiles_per_outer = (inner + width - 1) / width;
  const i64 tiles_per_round = PS_GRID_DIM_X / chunks;
  const i64 chunk = PS_BLOCK_X % chunks;
  if ((i64)PS_BLOCK_X / chunks >= tiles_per_round) return;  // the grid's remainder: idle blocks
  const i64 c_begin = chunk * chunk_cols;
  const i64 c_end = c_begin + chunk_cols < cols ? c_begin + chunk_cols : cols;
  const i64 tiles = outer * tiles_per_outer;
  const int group_slices = merge_slices_of(groups, width);
  const int chunk_slices = merge_slices_of((int)chunks, width);  // chunks <= multiprocessors (planner)
  // The variants that refill their cache asynchronously poll each pair as it lands and count no
  // arrivals (their pairs land as the refill goes on); the others wait on the tile's count.
  const typename Op::Published pairs = published;
  constexpr bool poll_pairs = kAsyncSlots<T, VEC> && !Op::Published::kCounted;
  // The first position of this thread in a tile (inner positions past `inner` read as empty).
  auto first_position = [&](i64 t) { return (t % tiles_per_outer) * width + (i64)tx * VEC; };
  // This tile's rows were copied to the cache by the previous tile's stores (only where copies
  // are asynchronous: elsewhere the loops below keep no branch for it).
  bool issued = false;
  for (i64 tile = PS_BLOCK_X / chunks; tile < tiles; tile += tiles_per_round) {
    const bool from_cache = kAsyncSlots<T, VEC> && issued;
    const i64 o = tile / tiles_per_outer;
    const i64 i = first_position(tile);
    const bool active = i < inner;  // all VEC positions or none (inner is a multiple of VEC)
    const auto line = op.line(o, i);
    typename Op::Accumulator acc[VEC];
#if PS_ASYNC_COPY
    if (from_cache) async_copy_wait_all();
#endif
    auto push_rows = [&](const Held* raw) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        typename Op::Value v[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) v[u] = Op::template value<VEC>(raw[u], j);
        Op::template add<kDepth>(acc[j], v);
      }
    };
    const int chunk_rows = (int)(c_end - c_begin);  // the chunk is in shared memory: an int
    const int cache_step = groups * inner_tile;      // a column group's next row in the cache
    if (from_cache) {
      // The rows from the cache alone, in 32-bit indices, tested only in the last round: one
      // loop with the global reads' tests and 64-bit addresses in it took about 26 instructions
      // a float32 value.
      const Held* at = cache + ty * inner_tile + tx;
      int r = ty;
      for (; r + (kDepth - 1) * groups < chunk_rows; r += kDepth * groups, at += kDepth * cache_step) {
        Held raw[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) raw[u] = at[u * cache_step];
        push_rows(raw);
      }
      if (r < chunk_rows) {
        Held raw[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) raw[u] = r + u * groups < chunk_rows ? at[u * cache_step] : Op::template absent_vector<VEC>();
        push_rows(raw);
      }
    } else {
      for (i64 c0 = c_begin + ty; c0 < c_end; c0 += kDepth * groups) {
        Held raw[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          const i64 c = c0 + u * groups;
          raw[u] = active && c < c_end ? op.template load_vector<VEC>(line, c)
                                       : Op::template absent_vector<VEC>();  // past `inner`
        }
#pragma unroll
        for (int u = 0; u < kDepth; ++u) {
          const i64 c = c0 + u * groups;
          if (c < c_end) cache[(c - c_begin) * inner_tile + tx] = raw[u];
        }
        push_rows(raw);
      }
    }
    // This chunk's partial per inner position: the column groups merge in shared memory.
#pragma unroll
    for (int j = 0; j < VEC; ++j) F::put(part_m, part_d, PS_THREAD_X * VEC + j, Op::partial(acc[j]));
    PS_SYNC();
    merge_rows_in_slices<P>(part_m, part_d, groups, width, group_slices);
    PS_SYNC();
    for (int q = PS_THREAD_X; q < width; q += PS_BLOCK_DIM_X) {  // q: a position of the tile
      pairs.publish((tile * chunks + chunk) * width + q, merge_column_groups<P>(part_m, part_d, q, group_slices, width));
    }
    PS_SYNC();  // the scratch is read above before it is written below
    if constexpr (!poll_pairs) {
      if (PS_THREAD_X == 0) arrive_and_wait(arrivals + tile, chunks);
      PS_SYNC();
    }
    // The tile's partial per position: a thread a (position, slice of the chunks) merges the
    // slice's published pairs, then a thread a position the slices.
    for (int t = PS_THREAD_X; t < chunk_slices * width; t += PS_BLOCK_DIM_X) {
      const int q = t % width, s = t / width;
      P part = F::identity();
      for (i64 c = s; c < chunks; c += chunk_slices) part = F::combine(part, pairs.read((tile * chunks + c) * width + q));
      F::put(part_m, part_d, s * width + q, part);
    }
    PS_SYNC();
    // Every chunk of this tile has published its pairs (counted, or read above), so each has read
    // the previous tile's: this block's pairs of that tile, and (chunk 0) its count, back to zero.
    if (tile >= tiles_per_round) {
      const i64 previous = tile - tiles_per_round;
      for (int q = PS_THREAD_X; q < width; q += PS_BLOCK_DIM_X) pairs.clear((previous * chunks + chunk) * width + q);
      if (!poll_pairs && chunk == 0 && PS_THREAD_X == 0) arrivals[previous] = 0u;
    }
    for (int q = PS_THREAD_X; q < width; q += PS_BLOCK_DIM_X) {  // row 0 of the scratch, read by every group below
      F::put(part_m, part_d, q, merge_column_groups<P>(part_m, part_d, q, chunk_slices, width));
    }
    PS_SYNC();
    // The outputs; where copies are asynchronous, each row's place in the cache is refilled with
    // the same row of the block's next tile once its output is stored, so that the next tile's
    // loads are in flight while these stores drain (a thread refills only what it read).
    const i64 next_tile = tile + tiles_per_round;
    const bool prefetch = kAsyncSlots<T, VEC> && next_tile < tiles;
    const i64 next_i = first_position(next_tile);
    const bool next_active = next_i < inner;
    const auto next_in = op.column(next_tile / tiles_per_outer, next_i);
    typename Op::Finish finish[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) finish[j] = typename Op::Finish(F::get(part_m, part_d, tx * VEC + j), safe != 0);
    T* yl = op.output(o, i);
    if (active || prefetch) {
      // Addresses stepped a column group's rows at a time (a 64-bit multiply each, before).
      Held* at = cache + ty * inner_tile + tx;
      T* out_at = yl + (c_begin + ty) * op.output_col();
      auto next_at = op.advance(next_in, c_begin + ty);
      const i64 out_step = groups * op.output_col();
      for (int r = ty; r < chunk_rows; r += groups, at += cache_step, out_at += out_step,
               next_at = op.advance(next_at, groups)) {
        if (active) {
          const Held raw = *at;
          op.template store_held<VEC>(out_at, finish, raw);
        }
#if PS_ASYNC_COPY
        if constexpr (kAsyncSlots<T, VEC>) {
          if (prefetch && next_active) {
            op.template prefetch<VEC>(at, next_at);
          } else if (prefetch) {
            *at = Op::template absent_vector<VEC>();
          }
        }
#endif
      }
    }
    issued = prefetch;
    PS_SYNC();  // the next tile reuses the scratch
    if (next_tile >= tiles) {  // this block's last tile: the last of its chunks to leave clears it
      // The answer reaches the block through part_m, free here: a shared flag of its own would take
      // shared memory a multiprocessor's fourth block needs.
      typedef typename F::First Flag;
      if (PS_THREAD_X == 0) part_m[0] = depart_last(arrivals + tile, chunks, poll_pairs ? 0 : chunks) ? Flag(1) : Flag(0);
      PS_SYNC();
      if (part_m[0] != Flag(0)) {
        for (i64 k = PS_THREAD_X; k < chunks * width; k += PS_BLOCK_DIM_X) pairs.clear(tile * chunks * width + k);
        if (PS_THREAD_X == 0) arrivals[tile] = 0u;
      }
    }
  }
}

// Launch bounds of the tiers that cache rows in shared memory: the most threads a block the
// planner gives them (its Tuning: block_tier_max_threads, staged_threads, cached_threads_by_itemsize)
// and how many such blocks a multiprocessor must hold, which caps registers a thread (NVIDIA: 40,
// 56, 42): enough blocks resident to keep loads in flight, and no spills.
const int kBlockTierThreads = 512, kBlockTierMinBlocks = 3;
const int kStagedThreads = 128, kStagedMinBlocks = 9;
const int kCachedThreads = 384, kCachedMinBlocks = 4;
// float64 kernels need their registers (they spilled under these bounds): one block.
template <typename T> constexpr int min_blocks(int blocks) { return sizeof(T) == 8 ? 1 : blocks; }
// The on-chip strided tier's float32 and 16-bit variants that refill their cache asynchronously
// need a cap of 64 registers a thread to keep the planner's 4 blocks a multiprocessor
// (Tuning.strided_chunks_per_sm; without it they take 74-78). The 16-bit scalar variant takes a
// cap of 85 (3 blocks): without one, ptxas settles on 64 registers and spills; with 4 its code is
// worse. The others compile with no minimum (0): float64 needs its registers.
template <typename T, int VEC> constexpr int strided_cached_min_blocks() {
  return kAsyncSlots<T, VEC> && sizeof(T) <= 4 ? 4 : (sizeof(T) == 2 ? 3 : 0);
}

}  // namespace ps

// ---- extern "C" entry points ----------------------------------------------------
// The generated lists (softmax_<dtype>.cu) name each instantiation through these.
#define PS_WARP_ENTRY(DT, T, OPN, OP, W, L, S, V)                                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(256) ps_warp_##DT##_##OPN##_w##W##_l##L##_s##S##_v##V(            \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 xs, ps::i64 ys, int safe) {              \
    ps::rows_in_registers<ps::ForwardRows<T, OP>, W, L, S, V, ps::WarpBatch<T, S, V>::rows>(         \
        ps::ForwardRows<T, OP>{x, y, xs, ys, safe != 0}, rows, cols);                                \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_warp_##DT##_##OPN##_w##W##_l##L##_s##S##_v##V)

// The same, a group taking one row a step (its lanes hold fewer than 32 bytes of it).
#define PS_WARP_ONE_ROW_ENTRY(DT, T, OPN, OP, W, L, S, V)                                           \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(256) ps_warp_##DT##_##OPN##_w##W##_l##L##_s##S##_v##V##_b1(       \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 xs, ps::i64 ys, int safe) {              \
    ps::rows_in_registers<ps::ForwardRows<T, OP>, W, L, S, V, 1>(                                     \
        ps::ForwardRows<T, OP>{x, y, xs, ys, safe != 0}, rows, cols);                                \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_warp_##DT##_##OPN##_w##W##_l##L##_s##S##_v##V##_b1)

// The rows regime's passes apart (RowsPartials, RowsFromPartials): a warp a row.
#define PS_ROWS_PARTIALS_ENTRY(DT, T, W, S, V)                                                      \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(256) ps_rows_partials_##DT##_w##W##_s##S##_v##V(                  \
      const T* x, compute_of<T>::type* partials, ps::i64 rows, ps::i64 cols, ps::i64 xs) {           \
    ps::rows_in_registers<ps::RowsPartials<T>, W, W, S, V, ps::WarpBatch<T, S, V>::rows>(            \
        ps::RowsPartials<T>{{x, (T*)0, xs, 0, false}, partials}, rows, cols);                         \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_rows_partials_##DT##_w##W##_s##S##_v##V)

#define PS_ROWS_FINISH_ENTRY(DT, T, OPN, OP, W, S, V)                                               \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(256) ps_rows_finish_##DT##_##OPN##_w##W##_s##S##_v##V(            \
      const T* x, T* y, const compute_of<T>::type* partials, ps::i64 rows, ps::i64 cols, ps::i64 xs, \
      ps::i64 ys, int safe) {                                                                        \
    ps::rows_in_registers<ps::RowsFromPartials<T, OP>, W, W, S, V, ps::WarpBatch<T, S, V>::rows>(    \
        ps::RowsFromPartials<T, OP>{{x, y, xs, ys, safe != 0}, partials}, rows, cols);               \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_rows_finish_##DT##_##OPN##_w##W##_s##S##_v##V)

#define PS_BLOCK_ENTRY(DT, T, OPN, OP, W, V)                                                         \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kBlockTierThreads, ps::min_blocks<T>(ps::kBlockTierMinBlocks)) \
  ps_block_##DT##_##OPN##_w##W##_v##V(                                                               \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 xs, ps::i64 ys, int safe) {              \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::block_rows<T, OP, W, V>(x, y, rows, cols, xs, ys, safe, reinterpret_cast<ps::Vec<T, V>*>(ps_cache)); \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_block_##DT##_##OPN##_w##W##_v##V)

#define PS_BLOCK_REGISTERS_ENTRY(DT, T, OPN, OP, W, V)                                               \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kRowRegistersThreads, 1) ps_block_registers_##DT##_##OPN##_w##W##_v##V( \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 xs, ps::i64 ys, int safe) {              \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::block_rows_registers<T, OP, W, V>(x, y, rows, cols, xs, ys, safe,                           \
                                          reinterpret_cast<ps::Vec<T, V>*>(ps_cache));              \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_block_registers_##DT##_##OPN##_w##W##_v##V)

#define PS_SPLIT_ENTRY(DT, T, OPN, OP, W, V)                                                         \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(1024) ps_split_normalize_##DT##_##OPN##_w##W##_v##V(               \
      const T* x, T* y, const compute_of<T>::type* partials, ps::i64 rows, ps::i64 cols, ps::i64 xs, \
      ps::i64 ys, ps::i64 chunk_slots, ps::i64 chunks, int safe) {                                  \
    ps::split_second_pass<ps::ForwardSplit<T, OP>, W, V>(ps::ForwardSplit<T, OP>{x, y, xs, ys, safe != 0}, \
                                                         partials, rows, cols, chunk_slots, chunks);  \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_split_normalize_##DT##_##OPN##_w##W##_v##V)

#define PS_PARTIALS_ENTRY(DT, T, W, V)                                                               \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(1024) ps_split_partials_##DT##_w##W##_v##V(                        \
      const T* x, compute_of<T>::type* partials, ps::i64 rows, ps::i64 cols, ps::i64 xs,            \
      ps::i64 chunk_slots, ps::i64 chunks) {                                                         \
    ps::split_first_pass<ps::ForwardSplit<T, ps::kSoftmax>, W, V>(                                    \
        ps::ForwardSplit<T, ps::kSoftmax>{x, (T*)0, xs, 0, false}, partials, rows, cols, chunk_slots, chunks); \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_split_partials_##DT##_w##W##_v##V)

#define PS_SPLIT_BUFFERED_ENTRY(DT, T, OPN, OP, W, V)                                                \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(1024) ps_split_normalize_buffered_##DT##_##OPN##_w##W##_v##V(      \
      const T* x, T* y, const compute_of<T>::type* partials, ps::i64 rows, ps::i64 cols, ps::i64 xs, \
      ps::i64 ys, ps::i64 chunk_slots, ps::i64 chunks, int safe, ps::i64 buffer_slots) {            \
    PS_DYNAMIC_SHARED_BYTES(ps_buffer);                                                              \
    ps::split_second_pass<ps::ForwardSplitBuffered<T, OP>, W, V>(                                    \
        ps::ForwardSplitBuffered<T, OP>{{x, y, xs, ys, safe != 0}, ps_buffer, buffer_slots}, partials, rows, cols, \
        chunk_slots, chunks);                                                                        \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_split_normalize_buffered_##DT##_##OPN##_w##W##_v##V)

#define PS_PARTIALS_BUFFERED_ENTRY(DT, T, W, V)                                                      \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(1024) ps_split_partials_buffered_##DT##_w##W##_v##V(               \
      const T* x, compute_of<T>::type* partials, ps::i64 rows, ps::i64 cols, ps::i64 xs,            \
      ps::i64 chunk_slots, ps::i64 chunks, ps::i64 buffer_slots) {                                   \
    PS_DYNAMIC_SHARED_BYTES(ps_buffer);                                                              \
    ps::split_first_pass<ps::ForwardSplitBuffered<T, ps::kSoftmax>, W, V>(                           \
        ps::ForwardSplitBuffered<T, ps::kSoftmax>{{x, (T*)0, xs, 0, false}, ps_buffer, buffer_slots}, partials, rows, \
        cols, chunk_slots, chunks);                                                                  \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_split_partials_buffered_##DT##_w##W##_v##V)

#define PS_STRIDED_ENTRY(DT, T, OPN, OP)                                                             \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(1024) ps_strided_##DT##_##OPN(                                      \
      const T* x, T* y, ps::i64 outer, ps::i64 cols, ps::i64 inner, ps::i64 xso, ps::i64 xsc,       \
      ps::i64 xsi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, int inner_tile, int safe) {                \
    ps::strided_axis(ps::ForwardStrided<T, OP>{x, y, xso, xsc, xsi, yso, ysc, ysi}, outer, cols, inner,      \
                     inner_tile, safe);                                                              \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_strided_##DT##_##OPN)

#define PS_STRIDED_THREAD_ENTRY(DT, T, OPN, OP, V, L)                                                \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kStridedThreadThreads) ps_strided_thread_##DT##_##OPN##_v##V##_l##L( \
      const T* x, T* y, ps::i64 outer, ps::i64 cols, ps::i64 inner, ps::i64 xso, ps::i64 xsc,       \
      ps::i64 xsi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, int safe) {                                \
    ps::strided_thread<ps::ForwardStrided<T, OP>, V, L>(ps::ForwardStrided<T, OP>{x, y, xso, xsc, xsi, yso, ysc, ysi}, \
                                                        outer, cols, inner, safe);                   \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_strided_thread_##DT##_##OPN##_v##V##_l##L)

// A sharded axis's strided passes (StridedChunks of ForwardStridedPass): the first writes the (m, d)
// of each chunk of each position to `pairs`; the second finishes each position with the pair it
// finds there.
#define PS_STRIDED_PARTIALS_ENTRY(DT, T, V, L)                                                          \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kStridedThreadThreads) ps_strided_partials_##DT##_v##V##_l##L(      \
      const T* x, compute_of<T>::type* pairs, ps::i64 outer, ps::i64 cols, ps::i64 inner, ps::i64 xso,   \
      ps::i64 xsc, ps::i64 xsi, ps::i64 chunks, ps::i64 chunk_cols) {                                    \
    typedef ps::StridedChunks<ps::ForwardStridedPass<T, ps::kSoftmax, ps::kFirstPass>> Op;               \
    ps::strided_thread<Op, V, L>(Op{{{x, (T*)0, xso, xsc, xsi, 0, 0, 0}, pairs}, chunks, chunk_cols, cols, inner}, \
                                 outer * chunks, chunk_cols, inner, 0);                                  \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_strided_partials_##DT##_v##V##_l##L)

#define PS_STRIDED_FINISH_ENTRY(DT, T, OPN, OP, V, L)                                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kStridedThreadThreads) ps_strided_finish_##DT##_##OPN##_v##V##_l##L( \
      const T* x, T* y, compute_of<T>::type* pairs, ps::i64 outer, ps::i64 cols, ps::i64 inner,          \
      ps::i64 xso, ps::i64 xsc, ps::i64 xsi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, int safe,            \
      ps::i64 chunks, ps::i64 chunk_cols) {                                                              \
    typedef ps::StridedChunks<ps::ForwardStridedPass<T, OP, ps::kSecondPass>> Op;                        \
    ps::strided_thread<Op, V, L>(Op{{{x, y, xso, xsc, xsi, yso, ysc, ysi}, pairs}, chunks, chunk_cols, cols, inner}, \
                                 outer * chunks, chunk_cols, inner, safe);                               \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_strided_finish_##DT##_##OPN##_v##V##_l##L)

#define PS_CACHED_ENTRY(DT, T, OPN, OP, W, V)                                                        \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kCachedThreads, ps::min_blocks<T>(ps::kCachedMinBlocks)) \
  ps_split_cached_##DT##_##OPN##_w##W##_v##V(                                                        \
      const T* x, T* y, compute_of<T>::type* partials, unsigned* arrivals, ps::i64 rows, ps::i64 cols,\
      ps::i64 xs, ps::i64 ys, ps::i64 chunk_slots, ps::i64 chunks, int safe) {                       \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::split_cached<T, OP, W, V>(x, y, partials, arrivals, rows, cols, xs, ys, chunk_slots, chunks, safe, \
                                  reinterpret_cast<ps::Vec<T, V>*>(ps_cache));                        \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_split_cached_##DT##_##OPN##_w##W##_v##V)

// The on-chip split with H slots of each chunk a thread in registers (split_cached's HELD), at
// least B blocks a multiprocessor.
#define PS_CACHED_REGISTERS_ENTRY(DT, T, OPN, OP, W, V, H, B)                                        \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kSplitRegistersThreads, B)                                 \
  ps_split_cached_registers_##DT##_##OPN##_w##W##_v##V##_h##H##_b##B(                                \
      const T* x, T* y, compute_of<T>::type* partials, unsigned* arrivals, ps::i64 rows, ps::i64 cols,\
      ps::i64 xs, ps::i64 ys, ps::i64 chunk_slots, ps::i64 chunks, int safe) {                       \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::split_cached<T, OP, W, V, H>(x, y, partials, arrivals, rows, cols, xs, ys, chunk_slots, chunks, safe, \
                                     reinterpret_cast<ps::Vec<T, V>*>(ps_cache));                    \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_split_cached_registers_##DT##_##OPN##_w##W##_v##V##_h##H##_b##B)

#define PS_STAGED_ENTRY(DT, T, OPN, OP, V)                                                           \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kStagedThreads, ps::min_blocks<T>(ps::kStagedMinBlocks)) \
  ps_staged_##DT##_##OPN##_v##V(                                                                     \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 tile_rows, int safe) {                   \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::staged_rows<ps::ForwardShortRows<T, OP>, V, 1>(ps::ForwardShortRows<T, OP>{x, y}, rows, cols, tile_rows, safe, \
                                                    reinterpret_cast<ps::Vec<T, V>*>(ps_cache));              \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_staged_##DT##_##OPN##_v##V)

// The staged tier with a warp a row (longer rows: the lanes share a row's words).
#define PS_STAGED_WARP_ENTRY(DT, T, OPN, OP, W, V)                                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kStagedThreads, ps::min_blocks<T>(ps::kStagedMinBlocks)) \
  ps_staged_warp_##DT##_##OPN##_w##W##_v##V(                                                         \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 tile_rows, int safe) {                   \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::staged_rows<ps::ForwardShortRows<T, OP>, V, W>(ps::ForwardShortRows<T, OP>{x, y}, rows, cols, tile_rows, safe, \
                                                    reinterpret_cast<ps::Vec<T, V>*>(ps_cache));              \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_staged_warp_##DT##_##OPN##_w##W##_v##V)

// The staged tier with a group of L lanes a row, fewer than a warp; row_shift and interleave as
// staged_rows.
#define PS_STAGED_GROUP_ENTRY(DT, T, OPN, OP, L, V)                                                  \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kStagedThreads, ps::min_blocks<T>(ps::kStagedMinBlocks)) \
  ps_staged_lanes_##DT##_##OPN##_l##L##_v##V(                                                        \
      const T* x, T* y, ps::i64 rows, ps::i64 cols, ps::i64 tile_rows, int row_shift, int interleave,  \
      int safe) {                                                                                    \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::staged_rows<ps::ForwardShortRows<T, OP>, V, L>(ps::ForwardShortRows<T, OP>{x, y}, rows, cols, tile_rows, safe, \
                                                    reinterpret_cast<ps::Vec<T, V>*>(ps_cache), row_shift,    \
                                                    interleave);                                              \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_staged_lanes_##DT##_##OPN##_l##L##_v##V)

#define PS_PACKED_ENTRY(DT, T, OPN, OP, C, V)                                                        \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kPackedThreads, (ps::packed_min_blocks<C, V>()))         \
  ps_packed_##DT##_##OPN##_c##C##_v##V(                                                            \
      const T* x, T* y, ps::i64 rows, int safe, int stages) {                                        \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::packed_rows<ps::ForwardShortRows<T, OP>, C, V>(ps::ForwardShortRows<T, OP>{x, y}, rows, safe, stages,     \
                                                       reinterpret_cast<ps::Vec<T, V>*>(ps_cache));          \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_packed_##DT##_##OPN##_c##C##_v##V)

#define PS_STRIDED_CACHED_ENTRY(DT, T, OPN, OP, V)                                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kStridedCachedThreads, (ps::strided_cached_min_blocks<T, V>())) \
  ps_strided_cached_##DT##_##OPN##_v##V(                                                           \
      const T* x, T* y, compute_of<T>::type* partials, unsigned* arrivals, ps::i64 outer, ps::i64 cols, \
      ps::i64 inner, ps::i64 xso, ps::i64 xsc, ps::i64 xsi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi,   \
      int inner_tile, ps::i64 chunk_cols, ps::i64 chunks, int safe) {                                \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                               \
    ps::strided_cached<ps::ForwardStrided<T, OP>, V>(ps::ForwardStrided<T, OP>{x, y, xso, xsc, xsi, yso, ysc, ysi}, \
                                                     ps::PublishedPairs<compute_of<T>::type>{partials}, arrivals, outer, \
                                                     cols, inner, inner_tile, chunk_cols, chunks, safe,   \
                                                     reinterpret_cast<ps::Vec<T, V>*>(ps_cache));          \
  }                                                                                                  \
  PS_EXPORT_KERNEL(ps_strided_cached_##DT##_##OPN##_v##V)
