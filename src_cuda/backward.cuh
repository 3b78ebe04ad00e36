// backward.cuh: the gradients of softmax and log_softmax, dx from the output y and its gradient dy.
//
//   softmax:      dx = y * (dy - sum(dy * y))
//   log_softmax:  dx = dy - exp(y) * sum(dy)
//
// A row reduces to one GradSum (the sum, and for log_softmax the max of y, which tells a row with
// NaN and a safe row of all -inf), merged by an associative operator like the forward's (m, d), so
// the regimes split a row across lanes, warps and blocks as the forward's do. The op policy
// (Backward<OP>) says what an element adds to the sum and how it finishes. Three arrays share a row
// layout: dy, y and dx start at the same offset from a VEC-aligned address (else the host launches
// VEC = 1), and dx may be dy or y itself (every kernel reads a value before it writes its place).
#pragma once
#include "softmax.cuh"

namespace ps {

// The sum is taken in double, a term at a time: a log_softmax row's sum of dy can be large beside the
// exp(y) * sum that nearly cancels dy, so any float32 rounding of a partial sum (even of a slot's few
// terms) would show in dx. A term itself (dy, or the product dy * y) is rounded once, relatively.
template <typename C> struct GradSum { double sum; C top; };

template <typename C> PS_DEVICE GradSum<C> grad_identity() { return GradSum<C>{0.0, ps_neg_inf<C>()}; }
template <typename C> PS_DEVICE GradSum<C> grad_combine(GradSum<C> a, GradSum<C> b) {
  return GradSum<C>{a.sum + b.sum, ps_max_nan(a.top, b.top)};
}

template <int OP> struct Backward;

template <> struct Backward<kSoftmax> {
  static constexpr bool kTop = false;  // NaN in y reaches the sum, and so every element
  template <typename C> PS_DEVICE static C term(C dy, C y) { return dy * y; }
  template <typename C> struct Finish {
    C sum;
    PS_DEVICE Finish() : sum(C(0)) {}
    PS_DEVICE Finish(GradSum<C> total, bool) : sum(static_cast<C>(total.sum)) {}
    // A safe row of all -inf has y = 0 and so dx = 0.
    PS_DEVICE C operator()(C dy, C y) const { return y * (dy - sum); }
  };
};

template <> struct Backward<kLogSoftmax> {
  static constexpr bool kTop = true;  // the sum holds no y: NaN and empty rows come from the max
  template <typename C> PS_DEVICE static C term(C dy, C) { return dy; }
  // The double sum is held as sum + low, two values of C: Σ dy grows with the row, and where
  // exp(y) * sum nearly cancels dy, the sum's rounding to float32 would be the error of dx.
  template <typename C> struct Finish {
    C sum, low;
    bool zero;  // a safe log_softmax's row of all -inf is constant: its gradient is 0
    ExpMinus<C> exp;  // float: the hardware base-2 exponential (float64: the precise one)
    PS_DEVICE Finish() : sum(C(0)), low(C(0)), zero(false), exp(C(0)) {}
    PS_DEVICE Finish(GradSum<C> total, bool safe)
        : sum(total.top != total.top ? ps_nan<C>() : static_cast<C>(total.sum)),
          low(sum - sum == C(0) ? static_cast<C>(total.sum - static_cast<double>(sum)) : C(0)),
          zero(safe && total.top == ps_neg_inf<C>()), exp(C(0)) {}
    PS_DEVICE C operator()(C dy, C y) const {
      const C e = exp(y);
      return zero ? C(0) : ps_fma(-e, low, ps_fma(-e, sum, dy));
    }
  };
};

// Adds element values to a GradSum.
template <int OP, typename C> struct GradAccumulator {
  GradSum<C> total = grad_identity<C>();
  // N values, all inside the row: a slot's terms chain in their own double (slots chain apart), then
  // join the thread's sum. kSlotInFloat: the slot's terms chain in C and join the sum once (16-bit
  // elements, whose own rounding is far above a float sum's of a slot's 8 terms).
  template <int N, bool kSlotInFloat = false> PS_DEVICE void add_all(const C* dy, const C* y) {
    typedef typename type_if<kSlotInFloat, C, double>::type Part;
    Part part = Part(0);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      part += static_cast<Part>(Backward<OP>::term(dy[j], y[j]));
      if constexpr (Backward<OP>::kTop) total.top = ps_max_nan(total.top, y[j]);
    }
    total.sum += part;
  }
  PS_DEVICE void add(C dy, C y) { add_all<1>(&dy, &y); }
};

template <int width, typename C> PS_DEVICE GradSum<C> grad_reduce_lanes(GradSum<C> g, bool top) {
  g.sum = sum_over_lanes<width>(g.sum);
  if (top) g.top = max_over_lanes<width>(g.top);
  return g;
}

// Whole-block reduction; every thread ends with the total. Scratch sized from WARP.
template <int OP, int WARP, typename C> PS_DEVICE GradSum<C> grad_reduce_block(GradSum<C> g) {
  PS_SHARED double warp_sum[1024 / WARP];
  PS_SHARED C warp_top[1024 / WARP];
  constexpr bool kTop = Backward<OP>::kTop;
  const int lane = PS_THREAD_X % WARP, warp = PS_THREAD_X / WARP, warps = PS_BLOCK_DIM_X / WARP;
  g = grad_reduce_lanes<WARP>(g, kTop);
  if (lane == 0) { warp_sum[warp] = g.sum; warp_top[warp] = g.top; }
  PS_SYNC();
  GradSum<C> part = grad_identity<C>();
  if (lane < warps) { part.sum = warp_sum[lane]; part.top = warp_top[lane]; }
  part = grad_reduce_lanes<WARP>(part, kTop);  // every warp sums the warps' results itself
  PS_SYNC();  // the scratch may be written again by the next reduction
  return part;
}

// ---- y as a gradient kernel reads it --------------------------------------------------------------
// The forward's output itself, or computed from the forward's input x and the row's (m, d): a
// gradient from x reads x in place of y, one read of each array (and no forward before it under
// jax.grad). A safe log_softmax's row of all -inf gets y = -inf, which its Finish takes for the
// constant row it is (dx = 0); a safe softmax's gets 0 from RowFinish itself.
struct YAsStored {
  template <typename C> PS_DEVICE C operator()(C y) const { return y; }
};

template <int OP, typename T> struct YFromInput {
  typedef typename compute_of<T>::type C;
  RowFinish<OP, T> forward;
  PS_DEVICE C operator()(C x) const {
    return OP == kLogSoftmax && forward.empty && forward.safe ? ps_neg_inf<C>() : forward.value(x);
  }
};

// ---- one row of the three arrays as aligned slots of VEC elements ---------------------------------
template <typename T, int VEC> struct GradRow {
  typedef typename compute_of<T>::type C;
  const T* dy;
  const T* y;
  T* dx;
  i64 cols;
  int pad;    // elements between the aligned slot start and the row start
  i64 slots;  // slots covering [-pad, cols)

  PS_DEVICE GradRow(const T* dy_, const T* y_, T* dx_, i64 cols_) : dy(dy_), y(y_), dx(dx_), cols(cols_) {
    pad = static_cast<int>((reinterpret_cast<unsigned long long>(dy_) / sizeof(T)) % VEC);
    slots = (pad + cols + VEC - 1) / VEC;
  }
  PS_DEVICE bool full(i64 k) const { return k * VEC - pad >= 0 && k * VEC - pad + VEC <= cols; }
  PS_DEVICE bool inside(i64 k, int j) const {
    const i64 i = k * VEC - pad + j;
    return i >= 0 && i < cols;
  }
  // The row's edge elements: those of its partial slots (before its first full slot and after its
  // last), at most 2 (VEC - 1), numbered from the row's start. A kernel that takes them one a thread
  // takes every other slot whole: one path a slot, no test of its elements. An edge element is read
  // again to be finished (held across the row's reduction, its registers made the kernels spill).
  PS_DEVICE i64 head_edges() const {
    const i64 head = pad > 0 ? VEC - pad : 0;
    return head < cols ? head : cols;
  }
  PS_DEVICE i64 tail_start() const {
    const i64 after_full = (pad + cols) / VEC * VEC - pad;
    return after_full > head_edges() ? after_full : head_edges();
  }
  PS_DEVICE i64 edge_at(int e) const {  // the column of edge element e, or -1 where the row has none
    const i64 head = head_edges(), at = e < head ? e : tail_start() + (e - head);
    return e >= 0 && at < cols ? at : -1;
  }
  template <int OP> PS_DEVICE void add_edge(int e, GradAccumulator<OP, C>& acc) const {
    const i64 at = edge_at(e);
    if (at >= 0) acc.add(to_compute(dy[at]), to_compute(y[at]));
  }
  template <typename F, typename YOf = YAsStored>
  PS_DEVICE void store_edge(int e, const F& f, const YOf& y_of = YOf()) const {
    const i64 at = edge_at(e);
    if (at >= 0) dx[at] = from_compute<T>(f(to_compute(dy[at]), y_of(to_compute(y[at]))));
  }
  // Elements outside the row read as 0 (the callers skip them). whole: the caller knows every slot of
  // the row is full (then slot k is, without a test of its own).
  PS_DEVICE void load(i64 k, Vec<T, VEC>& a, Vec<T, VEC>& b, bool whole = false) const {
    const i64 first = k * VEC - pad;
    if (whole || full(k)) {
      a = *reinterpret_cast<const Vec<T, VEC>*>(dy + first);
      b = *reinterpret_cast<const Vec<T, VEC>*>(y + first);
      return;
    }
    if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
      // 16-bit elements assembled into 32-bit words: a vector built element by element would be
      // held as one register an element, twice the registers of the loaded vector
      const unsigned short* dy16 = reinterpret_cast<const unsigned short*>(dy + first);
      const unsigned short* y16 = reinterpret_cast<const unsigned short*>(y + first);
      unsigned wa[VEC / 2], wb[VEC / 2];
#pragma unroll
      for (int w = 0; w < VEC / 2; ++w) {
        const bool lo = inside(k, 2 * w), hi = inside(k, 2 * w + 1);
        wa[w] = (lo ? unsigned(dy16[2 * w]) : 0u) | (hi ? unsigned(dy16[2 * w + 1]) << 16 : 0u);
        wb[w] = (lo ? unsigned(y16[2 * w]) : 0u) | (hi ? unsigned(y16[2 * w + 1]) << 16 : 0u);
      }
      memcpy(&a, wa, sizeof(a));
      memcpy(&b, wb, sizeof(b));
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const bool in = inside(k, j);
        a.v[j] = in ? dy[first + j] : from_compute<T>(C(0));
        b.v[j] = in ? y[first + j] : from_compute<T>(C(0));
      }
    }
  }
  template <int OP, bool kSlotInFloat = false>
  PS_DEVICE void add(i64 k, const Vec<T, VEC>& a, const Vec<T, VEC>& b, GradAccumulator<OP, C>& acc,
                     bool whole = false) const {
    C da[VEC], ya[VEC];
    widen(a, da);
    widen(b, ya);
    if (whole || full(k)) {
      acc.template add_all<VEC, kSlotInFloat>(da, ya);
      return;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (inside(k, j)) acc.add(da[j], ya[j]);
    }
  }
  // y_of: the row's y from what b holds, y itself (YAsStored) or the forward's input x (YFromInput).
  template <typename F, typename YOf = YAsStored>
  PS_DEVICE void store(i64 k, Vec<T, VEC> a, Vec<T, VEC> b, const F& f, const YOf& y_of = YOf(),
                       bool whole = false) const {
    if constexpr (sizeof(T) == 2 && sizeof(a) % 4 == 0) {  // widened anew (ps_opaque), not held since add()
      unsigned words[2][sizeof(a) / 4];
      memcpy(words[0], &a, sizeof(a));
      memcpy(words[1], &b, sizeof(b));
#pragma unroll
      for (int w = 0; w < (int)(sizeof(a) / 4); ++w) {
        ps_opaque(words[0][w]);
        ps_opaque(words[1][w]);
      }
      memcpy(&a, words[0], sizeof(a));
      memcpy(&b, words[1], sizeof(b));
    }
    C da[VEC], ya[VEC];
    widen(a, da);
    widen(b, ya);
    if constexpr (!same_type<YOf, YAsStored>::value) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) ya[j] = y_of(ya[j]);
    }
    const i64 first = k * VEC - pad;
    if (whole || full(k)) {
      Vec<T, VEC> raw;
#pragma unroll
      for (int j = 0; j < VEC; ++j) raw.v[j] = from_compute<T>(f(da[j], ya[j]));
      // 16-bit: one 16-byte store instruction (built element by element, nvcc splits the vector's
      // store into 2-byte ones, each a separate L2 write: L2-bound at a third of the copy's speed)
      store_vector<sizeof(T) == 2>(dx + first, raw);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (inside(k, j)) dx[first + j] = from_compute<T>(f(da[j], ya[j]));
      }
    }
  }
};

// 16-bit elements in 16-byte slots (rows held several slots a thread skip the test of each slot
// where every slot of every row is full; a slot's terms are summed in float before the double sum).
template <typename T, int VEC> constexpr bool kWide16Bit = sizeof(T) == 2 && VEC * sizeof(T) == 16;

// ---- the gradient from the forward's input x, a row held in registers ---------------------------
// The row's max first, then each exp(x - max) once, summed beside the gradient's sum (of dy times it
// for softmax, of dy for log_softmax): two plain reductions and no exp in the shuffles, as the
// forward's rows in registers take it. Rows of x all -inf sum with a shift of 0 (exp(-inf) = 0).
template <int WARP, typename C> PS_DEVICE C max_over_block(C v) {
  PS_SHARED C warp_max[1024 / WARP];
  const int lane = PS_THREAD_X % WARP, warp = PS_THREAD_X / WARP, warps = PS_BLOCK_DIM_X / WARP;
  v = max_over_lanes<WARP>(v);
  if (lane == 0) warp_max[warp] = v;
  PS_SYNC();
  v = max_over_lanes<WARP>(lane < warps ? warp_max[lane] : ps_neg_inf<C>());
  PS_SYNC();  // the scratch may be written again by the next reduction
  return v;
}

template <typename C> struct InputSums {
  double grad;  // sum(dy exp(x - shift)) for softmax, sum(dy) for log_softmax
  C d;          // sum(exp(x - shift))
};

template <int WARP, typename C> PS_DEVICE InputSums<C> sums_over_block(InputSums<C> v) {
  PS_SHARED double warp_grad[1024 / WARP];
  PS_SHARED C warp_d[1024 / WARP];
  const int lane = PS_THREAD_X % WARP, warp = PS_THREAD_X / WARP, warps = PS_BLOCK_DIM_X / WARP;
  v.grad = sum_over_lanes<WARP>(v.grad);
  v.d = sum_over_lanes<WARP>(v.d);
  if (lane == 0) { warp_grad[warp] = v.grad; warp_d[warp] = v.d; }
  PS_SYNC();
  v.grad = sum_over_lanes<WARP>(lane < warps ? warp_grad[lane] : 0.0);
  v.d = sum_over_lanes<WARP>(lane < warps ? warp_d[lane] : C(0));
  PS_SYNC();
  return v;
}

// The stride between a thread's slots of a row: the group's lanes, the block shape's threads, or
// (FITTED) the block's threads as launched: fewer than the shape's, whole warps, where a row would
// leave the shape's last threads empty (planner.resident_launch). A kernel of its own: the shape's,
// its stride a constant, folds each slot's offset into its loads (docs/design.md).
template <int GROUP, bool FITTED> PS_DEVICE int slot_stride() { return FITTED ? PS_BLOCK_DIM_X : GROUP; }
// ... and a slot's index: 32-bit where the stride is not a constant (the fitted float32 kernels took
// 96 registers so, 102 at 64 bits: two blocks of 9 warps a multiprocessor against one)
template <bool FITTED> using SlotIndex = typename type_if<FITTED, int, i64>::type;

// From the row's held dy and x (SLOTS slots a thread): the forward's finish of x (y_of) and the
// gradient's total, as grad_rows then takes them from y. WHOLE: every slot of the row is full (no
// test of each element); a 16-bit slot's terms are summed in float first, as grad_rows' are.
template <int OP, int WARP, int GROUP, int SLOTS, typename T, int VEC, bool WHOLE = false, bool FITTED = false>
struct InputRow {
  typedef typename compute_of<T>::type C;
  typedef typename type_if<kWide16Bit<T, VEC>, C, double>::type Part;
  // float16 rows' max from the raw pairs, two values an instruction, widened once: a float16 value
  // is widened by a conversion instruction (a bfloat16 one by a shift), and x is widened twice more
  static constexpr bool kPackedMax = WHOLE && kWide16Bit<T, VEC> && PackedMax<T>::native &&
                                     same_type<T, half_t>::value;
  YFromInput<OP, T> y_of;
  GradSum<C> total;

  PS_DEVICE InputRow(const GradRow<T, VEC>& g, const Vec<T, VEC>* dy, const Vec<T, VEC>* x, bool active, int lane,
                     bool safe) {
    const int stride = slot_stride<GROUP, FITTED>();
    C top = ps_neg_inf<C>();
    if constexpr (kPackedMax) {
      top = max_of_whole_slots(g, x, active, lane);
    } else {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const SlotIndex<FITTED> k = lane + (SlotIndex<FITTED>)s * stride;
        C v[VEC];
        widen(x[s], v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if (active && k < g.slots && (WHOLE || g.inside(k, j))) top = ps_max_nan(top, v[j]);
        }
      }
    }
    if constexpr (GROUP > WARP) {
      top = max_over_block<WARP>(top);
    } else {
      top = max_over_lanes<GROUP>(top);
    }
    const ExpMinus<C> exp_minus(top == ps_neg_inf<C>() ? C(0) : top);
    InputSums<C> sums = {0.0, C(0)};
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const SlotIndex<FITTED> k = lane + (SlotIndex<FITTED>)s * stride;
      if (!active || k >= g.slots) continue;
      C dv[VEC], v[VEC];
      widen(dy[s], dv);
      widen(x[s], v);
      Part part = Part(0);  // a slot's terms chain apart, as GradAccumulator's
      C d = C(0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (WHOLE || g.full(k) || g.inside(k, j)) {
          const C e = exp_minus(v[j]);
          d += e;
          part += static_cast<Part>(OP == kSoftmax ? dv[j] * e : dv[j]);
        }
      }
      sums.grad += static_cast<double>(part);
      sums.d += d;
    }
    if constexpr (GROUP > WARP) {
      sums = sums_over_block<WARP>(sums);
    } else {
      sums.grad = sum_over_lanes<GROUP>(sums.grad);
      sums.d = sum_over_lanes<GROUP>(sums.d);
    }
    y_of = YFromInput<OP, T>{RowFinish<OP, T>(MD<C>{sums.d == C(0) ? ps_neg_inf<C>() : top, sums.d}, safe)};
    // softmax: sum(dy y) = sum(dy e) / d (0 on an empty row, whose y is 0 or NaN already); the top
    // tells log_softmax's finish a NaN row and a safe empty one
    total.sum = OP == kSoftmax ? (sums.d > C(0) ? sums.grad / static_cast<double>(sums.d) : 0.0) : sums.grad;
    total.top = top != top ? top : (sums.d == C(0) ? ps_neg_inf<C>() : C(0));
  }

  PS_DEVICE static C max_of_whole_slots(const GradRow<T, VEC>& g, const Vec<T, VEC>* x, bool active, int lane) {
    Vec<T, 2> pair;
    const int stride = slot_stride<GROUP, FITTED>();
    pair.v[0] = pair.v[1] = from_compute<T>(ps_neg_inf<C>());
    unsigned top;
    memcpy(&top, &pair, 4);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      if (!active || lane + (SlotIndex<FITTED>)s * stride >= g.slots) continue;
      unsigned words[VEC / 2];
      memcpy(words, &x[s], sizeof(words));
#pragma unroll
      for (int w = 0; w < VEC / 2; ++w) top = PackedMax<T>::max(top, words[w]);
    }
    memcpy(&pair, &top, 4);
    C v[2];
    widen(pair, v);
    return ps_max_nan(v[0], v[1]);
  }
};

// ---- rows in registers: a group of GROUP lanes a row (GROUP <= WARP), or a block a row ----------
// Each thread holds SLOTS slots of dy and y as stored (the group's slots lane, lane + stride, ...),
// so the row is read once and written once. Groups of a warp step through rows together (a row
// past the end takes part in the shuffles and stores nothing).
// FROM_INPUT: y holds the forward's input x (InputRow: the row's max and sums from it, and each
// element's y as the forward's finish of x).
// WHOLE: every slot of every row is full (the launch's rows start on a vector and hold whole
// vectors). For 16-bit elements in 16-byte slots held several a thread, the test of each slot
// (three a slot: load, sum, store) held rows at 62-99% of the copy (docs/design.md).
// FITTED: a block a row launched with the block's threads as its stride (slot_stride).
template <typename T, int OP, int WARP, int GROUP, int SLOTS, int VEC, bool FROM_INPUT, bool WHOLE, bool FITTED>
PS_DEVICE void grad_rows_of(const T* dy, const T* y, T* dx, i64 rows, i64 cols, i64 dys, i64 ys, i64 dxs, int safe) {
  typedef typename compute_of<T>::type C;
  constexpr bool kBlock = GROUP > WARP;
  constexpr bool kSlotInFloat = kWide16Bit<T, VEC>;
  // 16-bit rows of partial slots in 16-byte slots: the slots whole, the edge elements one a lane
  // (where the group has lanes enough for them all). Not in blocks of 2 slots a thread, which are
  // planned for whole rows alone (grad_block_shapes): the registers of a peeled path would cost them
  // blocks. Narrower slots and float32 rows ran no faster so (up to 30 more registers).
  constexpr bool kPeeled = !WHOLE && !FROM_INPUT && kWide16Bit<T, VEC> && GROUP >= 2 * (VEC - 1) &&
                           !(kBlock && SLOTS <= 2);
  constexpr bool kSlotsWhole = WHOLE || kPeeled;
  const int lane = kBlock ? PS_THREAD_X : PS_THREAD_X % GROUP;
  const i64 groups = kBlock ? 1 : PS_BLOCK_DIM_X / GROUP;
  const i64 group = kBlock ? 0 : PS_THREAD_X / GROUP;
  const int stride = slot_stride<GROUP, FITTED>();
  for (i64 base = (i64)PS_BLOCK_X * groups; base < rows; base += (i64)PS_GRID_DIM_X * groups) {
    const i64 row = base + group;
    const bool active = row < rows;
    const i64 r = active ? row : 0;
    const GradRow<T, VEC> g(dy + r * dys, y + r * ys, dx + r * dxs, cols);
    Vec<T, VEC> a[SLOTS], b[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const SlotIndex<FITTED> k = lane + (SlotIndex<FITTED>)s * stride;
      if (active && (kPeeled ? g.full(k) : k < g.slots)) g.load(k, a[s], b[s], kSlotsWhole);
    }
    if constexpr (FROM_INPUT) {
      const InputRow<OP, WARP, GROUP, SLOTS, T, VEC, WHOLE, FITTED> in(g, a, b, active, lane, safe != 0);
      const typename Backward<OP>::template Finish<C> f(in.total, safe != 0);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const SlotIndex<FITTED> k = lane + (SlotIndex<FITTED>)s * stride;
        if (active && k < g.slots) g.store(k, a[s], b[s], f, in.y_of, WHOLE);
      }
      continue;
    }
    GradAccumulator<OP, C> acc;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const SlotIndex<FITTED> k = lane + (SlotIndex<FITTED>)s * stride;
      if (active && (kPeeled ? g.full(k) : k < g.slots)) g.template add<OP, kSlotInFloat>(k, a[s], b[s], acc, kSlotsWhole);
    }
    if constexpr (kPeeled) g.add_edge(active ? lane : -1, acc);
    GradSum<C> total;
    if constexpr (kBlock) {
      total = grad_reduce_block<OP, WARP>(acc.total);
    } else {
      total = grad_reduce_lanes<GROUP>(acc.total, Backward<OP>::kTop);
    }
    const typename Backward<OP>::template Finish<C> f(total, safe != 0);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const SlotIndex<FITTED> k = lane + (SlotIndex<FITTED>)s * stride;
      if (active && (kPeeled ? g.full(k) : k < g.slots)) g.store(k, a[s], b[s], f, YAsStored(), kSlotsWhole);
    }
    if constexpr (kPeeled) g.store_edge(active ? lane : -1, f);
  }
}

template <typename T, int OP, int WARP, int GROUP, int SLOTS, int VEC, bool FROM_INPUT = false, bool FITTED = false>
PS_DEVICE void grad_rows(const T* dy, const T* y, T* dx, i64 rows, i64 cols, i64 dys, i64 ys, i64 dxs, int safe) {
  if constexpr (FROM_INPUT && kWide16Bit<T, VEC>) {
    // built for whole rows alone (planner_backward.plan_backward_from_input plans it for no others),
    // so no element is tested and no second path takes registers
    grad_rows_of<T, OP, WARP, GROUP, SLOTS, VEC, FROM_INPUT, true, FITTED>(dy, y, dx, rows, cols, dys, ys, dxs, safe);
  } else {
    // the layouts planned for whole rows (planner_backward): a warp of 2 slots a lane, or a block
    if constexpr (kWide16Bit<T, VEC> && SLOTS > 1 && (SLOTS <= 2 || GROUP > WARP)) {
      // dy, y and dx share each row's offset in its vectors (the host checks): dy's rows tell
      const bool whole = reinterpret_cast<unsigned long long>(dy) % sizeof(Vec<T, VEC>) == 0 && dys % VEC == 0 &&
                         cols % VEC == 0;
      if (whole) {
        grad_rows_of<T, OP, WARP, GROUP, SLOTS, VEC, FROM_INPUT, true, FITTED>(dy, y, dx, rows, cols, dys, ys, dxs, safe);
        return;
      }
    }
    grad_rows_of<T, OP, WARP, GROUP, SLOTS, VEC, FROM_INPUT, false, FITTED>(dy, y, dx, rows, cols, dys, ys, dxs, safe);
  }
}

// ---- the gradient op of rows_in_registers (softmax.cuh), for groups of one float32 a lane ---------
// Such groups gain from taking several rows a step (WarpBatch, up to kGradMaxBatch), as the
// forward's do; 16-bit and float64 ones, and groups of vector slots, ran no faster or slower so, and
// keep grad_rows (docs/design.md).
template <typename T, int OP> struct GradientRows {
  typedef typename compute_of<T>::type C;
  typedef typename Backward<OP>::template Finish<C> Finish;
  const T* dy;
  const T* y;
  T* dx;
  i64 dys, ys, dxs;
  bool safe;
  static constexpr bool kPastEndViewIsEmpty = true;  // one test a slot: fewer registers than a branch
  template <int VEC> struct View {
    GradRow<T, VEC> g;
    i64 slots;  // a row past the end has none
  };
  template <int SLOTS, int VEC> struct Held {
    Vec<T, VEC> a[SLOTS], b[SLOTS];
  };
  template <int VEC> PS_DEVICE View<VEC> row(i64 row, i64 rows, i64 cols) const {
    const bool active = row < rows;
    const i64 r = active ? row : 0;
    const GradRow<T, VEC> g(dy + r * dys, y + r * ys, dx + r * dxs, cols);
    return View<VEC>{g, active ? g.slots : 0};
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void load(const View<VEC>& view, i64 k, Held<SLOTS, VEC>& held, int s) const {
    view.g.load(k, held.a[s], held.b[s]);
  }
  template <int SLOTS, int VEC> PS_DEVICE void absent(Held<SLOTS, VEC>&, int) const {}
  // The row's GradSum over its group.
  template <int LANES, int SLOTS, int VEC>
  PS_DEVICE GradSum<C> total(const Held<SLOTS, VEC>& held, int lane, i64 row, i64 rows, i64 cols) const {
    const View<VEC> view = this->row<VEC>(row, rows, cols);  // again, not held across the loads: fewer registers
    GradAccumulator<OP, C> acc;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const i64 k = (i64)s * LANES + lane;
      if (k < view.slots) view.g.add(k, held.a[s], held.b[s], acc);
    }
    return grad_reduce_lanes<LANES>(acc.total, Backward<OP>::kTop);
  }
  template <int WARP, int LANES, int SLOTS, int VEC>
  PS_DEVICE Finish finish(Held<SLOTS, VEC>& held, int lane, i64 row, i64 rows, i64 cols) const {
    return Finish(total<LANES>(held, lane, row, rows, cols), safe);
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void store(const View<VEC>& view, i64 k, const Held<SLOTS, VEC>& held, int s, const Finish& f) const {
    view.g.store(k, held.a[s], held.b[s], f);
  }
};

// The rows regime's two passes apart (the sharded softmax's local rows, as the forward's RowsPartials
// and RowsFromPartials): the first writes each row's GradSum to sums[2 row] and [2 row + 1] (as
// GradientSplit publishes a chunk's), the second finishes each row from the sums it then finds there.
template <typename T, int OP> struct GradientRowsSums : GradientRows<T, OP> {
  typedef typename compute_of<T>::type C;
  template <int SLOTS, int VEC> using Held = typename GradientRows<T, OP>::template Held<SLOTS, VEC>;
  template <int VEC> using View = typename GradientRows<T, OP>::template View<VEC>;
  struct Written {};
  double* sums;
  template <int WARP, int LANES, int SLOTS, int VEC>
  PS_DEVICE Written finish(Held<SLOTS, VEC>& held, int lane, i64 row, i64 rows, i64 cols) const {
    const GradSum<C> total = this->template total<LANES>(held, lane, row, rows, cols);
    if (lane == 0 && row < rows) {
      sums[2 * row] = total.sum;
      sums[2 * row + 1] = total.top;
    }
    return Written();
  }
  template <int SLOTS, int VEC>
  PS_DEVICE void store(const View<VEC>&, i64, const Held<SLOTS, VEC>&, int, Written) const {}
};

template <typename T, int OP> struct GradientRowsFromSums : GradientRows<T, OP> {
  typedef typename compute_of<T>::type C;
  typedef typename GradientRows<T, OP>::Finish Finish;
  template <int SLOTS, int VEC> using Held = typename GradientRows<T, OP>::template Held<SLOTS, VEC>;
  const double* sums;
  template <int WARP, int LANES, int SLOTS, int VEC>
  PS_DEVICE Finish finish(Held<SLOTS, VEC>&, int, i64 row, i64 rows, i64) const {
    const i64 r = row < rows ? row : 0;
    return Finish(GradSum<C>{sums[2 * r], static_cast<C>(sums[2 * r + 1])}, this->safe);
  }
};

// Rows a group takes a step in the rows regime (_variants.grad_rows_batch).
const int kGradMaxBatch = 8;
template <typename T, int WARP, int GROUP, int SLOTS, int VEC> struct GradRowsBatch {
  static const int warp_batch = WarpBatch<T, SLOTS, VEC>::rows;
  static const int batch = warp_batch < kGradMaxBatch ? warp_batch : kGradMaxBatch;
  static const int rows = GROUP <= WARP && SLOTS == 1 && VEC == 1 && sizeof(T) == 4 ? batch : 1;
};

// ---- short rows staged through shared memory: the gradient op of staged_rows (softmax.cuh) --------
// A staged row of the gradient: dy's row in the first tile, dx written over it, and y's row
// tile_step elements on (the tiles alike aligned). As the forward's staged_row_in_words, 16-bit rows
// are a head value, whole words of two values and a tail value, and LANES lanes share a row, each
// every LANES-th word; two passes (the sum, then the outputs) where the forward takes three.
template <int OP, typename T, int LANES>
PS_DEVICE void grad_staged_row_in_words(T* dy_row, const T* y_row, int n, int start, bool safe) {
  typedef typename compute_of<T>::type C;
  const int G = sizeof(T) == 2 ? 2 : 1;  // values a word
  typedef Vec<T, G> Word;
  int head = G == 2 ? static_cast<int>(reinterpret_cast<unsigned long long>(dy_row) / sizeof(T) % 2) : 0;
  head = head < n ? head : n;
  const int words = (n - head) / G;
  const bool tail = head + G * words < n;
  Word* dy_words = reinterpret_cast<Word*>(dy_row + head);
  const Word* y_words = reinterpret_cast<const Word*>(y_row + head);
  start = start < 0 || words == 0 ? -1 : start % words;
  const bool leader = LANES == 1 || PS_THREAD_X % LANES == 0;  // takes the edge values
  GradAccumulator<OP, C> acc;
  if (leader && head) acc.add(to_compute(dy_row[0]), to_compute(y_row[0]));
  if (leader && tail) acc.add(to_compute(dy_row[n - 1]), to_compute(y_row[n - 1]));
  C dv[G], yv[G];
  for_each_word_from<LANES>(start, words, [&](int k) {
    widen(read_word(dy_words + k), dv);
    widen(read_word(y_words + k), yv);
    acc.template add_all<G, true>(dv, yv);  // a word's terms in C (one of them, or two 16-bit ones)
  });
  const typename Backward<OP>::template Finish<C> f(grad_reduce_lanes<LANES>(acc.total, Backward<OP>::kTop), safe);
  if (leader && head) dy_row[0] = from_compute<T>(f(to_compute(dy_row[0]), to_compute(y_row[0])));
  if (leader && tail) dy_row[n - 1] = from_compute<T>(f(to_compute(dy_row[n - 1]), to_compute(y_row[n - 1])));
  for_each_word_from<LANES>(start, words, [&](int k) {
    widen(read_word(dy_words + k), dv);
    widen(read_word(y_words + k), yv);
    Word w;
#pragma unroll
    for (int j = 0; j < G; ++j) w.v[j] = from_compute<T>(f(dv[j], yv[j]));
    dy_words[k] = w;
  });
}

// The gradient op of the short rows (softmax.cuh staged_rows and packed_groups).
template <typename T_, int OP> struct GradientShortRows {
  typedef T_ T;
  typedef typename compute_of<T>::type C;
  static constexpr int kTiles = 2;  // dy, into whose place dx is written, and y
  const T* dy;
  const T* y;
  T* dx;
  template <int VEC> PS_DEVICE RowSlots<T, VEC> span(int a, i64 first, i64 count, i64 cols) const {
    return a == 0 ? RowSlots<T, VEC>(dy + first * cols, dx + first * cols, count * cols)
                  : RowSlots<T, VEC>(y + first * cols, nullptr, count * cols);
  }
  // A row of N values of dy (dx written over them) and of y, in registers (packed_groups): a 16-bit
  // row's few terms chain in float, as a slot's do.
  template <int N> PS_DEVICE void row_in_registers(C* dy_values, const C* y_values, bool safe) const {
    GradAccumulator<OP, C> acc;
    acc.template add_all<N, sizeof(T) == 2>(dy_values, y_values);
    const typename Backward<OP>::template Finish<C> f(acc.total, safe);
#pragma unroll
    for (int j = 0; j < N; ++j) dy_values[j] = f(dy_values[j], y_values[j]);
  }
  template <int LANES> PS_DEVICE void row(T* row, i64 tile_step, int n, bool skew, int r, bool safe) const {
    grad_staged_row_in_words<OP, T, LANES>(row, row + tile_step, n, skew ? r % kSharedBanks : -1, safe);
  }
};

// ---- a row split across co-resident blocks, held on chip -----------------------------------------
// Each block holds its chunk of the row (SLOTS slots a thread) in registers, publishes the chunk's
// GradSum, waits for the row's other chunks and finishes from its registers: one read, one write.
// The grid is cut to whole rows of `chunks` resident blocks, which advance in rounds. The scratch
// (a GradSum per chunk of each row, as two PublishedDoubles, and a count per row) is zero at the
// start and left zero: a row's arrivals tell that the previous row's sums are read, so each block
// clears its own; the last block to leave the last row clears that one. From y, every thread of a
// block merges the row's parts, a chunk a thread (so that their polls run side by side).
// Where copies are asynchronous (kAsyncSlots), the block's next row is copied to shared memory once
// this row's total is known, so that its loads are in flight while this row is finished and stored
// (copies issued before the row's chunks meet delay the meeting: docs/design.md); a thread reads
// back only the slots it copied, so no barrier is needed.
// Every slot is taken whole (one path a slot, a 16-bit slot's terms summed in float as grad_rows_of's
// whole rows); the partial slots at a row's two ends are its edge elements, which chunk 0's threads
// take one each (GradRow::edge_at). WHOLE: rows of whole slots alone, so no edge code.
// FROM_INPUT: y holds the forward's input x. A chunk publishes its max of x and its sums relative to
// it (input_chunk_sums) as three doubles, fenced before its arrival is counted, and warp 0 merges
// the row's chunks as (m, d) pairs merge once all have arrived; each element's y is then the
// forward's finish of x (YFromInput), as in the rows held in registers (InputRow).
const int kGradCachedThreads = 256;  // a chunk of the on-chip split (the launch bound)

// The doubles a chunk of the on-chip gradient from y publishes, each one 64-bit word that its readers poll
// until it lands, as PublishedPairs' float pairs: so no fence comes before the arrival is counted
// (a fence waits for every earlier write of the thread, the previous row's stores among them, and
// it sat on the row's path). A word is the double's bits XOR kUnpublished, a NaN pattern that no
// published double carries (a NaN is published as the canonical one), so a landed word is never
// the zero the scratch holds.
struct PublishedDoubles {
  static constexpr unsigned long long kUnpublished = 0x7ff0000000000001ull;  // a signalling NaN
  union Word {
    double value;
    unsigned long long bits;
  };
  double* at;
  PS_DEVICE void publish(i64 i, double v) const {
    Word w;
    w.value = v != v ? ps_nan<double>() : v;
    PS_PUBLISH_WORD(at + i, w.bits ^ kUnpublished);
  }
  // The N words from i once each has landed, as the doubles they hold: the N loads go out together
  // (one round trip, where a poll of each in turn would take N), then each is polled until it lands.
  template <int N> PS_DEVICE void read(i64 i, double (&v)[N]) const {
    Word w[N];
#pragma unroll
    for (int f = 0; f < N; ++f) w[f].bits = PS_READ_WORD(at + i + f);
#pragma unroll
    for (int f = 0; f < N; ++f) {
      while (w[f].bits == 0) {
        PS_SPIN_PAUSE();
        w[f].bits = PS_READ_WORD(at + i + f);
      }
      w[f].bits ^= kUnpublished;
      v[f] = w[f].value;
    }
  }
  PS_DEVICE void clear(i64 i) const { PS_PUBLISH_WORD(at + i, 0ull); }
};

// A chunk's part of the gradient from x: max over its x, the sum of exp(x - max), and the gradient's
// sum relative to that max (of dy exp(x - max) for softmax, of dy for log_softmax), over the block.
template <typename C> struct InputChunk {
  C top, d;
  double grad;
};

template <int OP, int WARP, int SLOTS, bool WHOLE, typename T, int VEC>
PS_DEVICE InputChunk<typename compute_of<T>::type> input_chunk_sums(const GradRow<T, VEC>& g, const Vec<T, VEC>* dy,
                                                                    const Vec<T, VEC>* x, i64 begin, int edge) {
  typedef typename compute_of<T>::type C;
  typedef typename type_if<kWide16Bit<T, VEC>, C, double>::type Part;  // as InputRow's
  auto taken = [&](i64 k) { return WHOLE ? k < g.slots : g.full(k); };
  const i64 at = g.edge_at(edge);
  const C edge_x = at >= 0 ? to_compute(g.y[at]) : ps_neg_inf<C>();
  C top = edge_x;
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    if (!taken(begin + (i64)s * PS_BLOCK_DIM_X)) continue;
    C v[VEC];
    widen(x[s], v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) top = ps_max_nan(top, v[j]);
  }
  top = max_over_block<WARP>(top);
  const ExpMinus<C> exp_minus(top == ps_neg_inf<C>() ? C(0) : top);
  InputSums<C> sums = {0.0, C(0)};
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    if (!taken(begin + (i64)s * PS_BLOCK_DIM_X)) continue;
    C dv[VEC], v[VEC];
    widen(dy[s], dv);
    widen(x[s], v);
    Part part = Part(0);
    C d = C(0);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const C e = exp_minus(v[j]);
      d += e;
      part += static_cast<Part>(OP == kSoftmax ? dv[j] * e : dv[j]);
    }
    sums.grad += static_cast<double>(part);
    sums.d += d;
  }
  if (at >= 0) {
    const C e = exp_minus(edge_x), dv = to_compute(g.dy[at]);
    sums.d += e;
    sums.grad += static_cast<double>(OP == kSoftmax ? dv * e : dv);
  }
  sums = sums_over_block<WARP>(sums);
  return InputChunk<C>{top, sums.d, sums.grad};
}

template <typename T, int OP, int WARP, int SLOTS, int VEC, bool WHOLE = false, bool FROM_INPUT = false>
PS_DEVICE void grad_split_cached(const T* dy, const T* y, T* dx, double* sums,
                                 unsigned* arrivals, i64 rows, i64 cols, i64 dys, i64 ys, i64 dxs, i64 chunks,
                                 int safe) {
  typedef typename compute_of<T>::type C;
  typedef Vec<T, VEC> Slot;
  typedef typename type_if<FROM_INPUT, YFromInput<OP, T>, YAsStored>::type YOf;
  constexpr bool kPrefetch = kAsyncSlots<T, VEC>;
  constexpr int kStaged = kPrefetch ? SLOTS * kGradCachedThreads : 1;
  constexpr int kFields = FROM_INPUT ? 3 : 2;  // a chunk's words: (sum, top), or InputChunk's
  PS_SHARED_COPY_TARGET(Slot, next_dy, kStaged);
  PS_SHARED_COPY_TARGET(Slot, next_y, kStaged);
  PS_SHARED double row_total[kFields];  // from x: the row's sums, as warp 0 merges them
  const i64 rows_per_round = PS_GRID_DIM_X / chunks;
  const i64 chunk = PS_BLOCK_X % chunks;
  if ((i64)PS_BLOCK_X / chunks >= rows_per_round) return;  // the grid's remainder: idle blocks
  const i64 begin = chunk * (i64)PS_BLOCK_DIM_X * SLOTS + PS_THREAD_X;
  // the threads of chunk 0 take the row's edge elements, one each (none where WHOLE)
  const int edge_of_thread = !WHOLE && chunk == 0 ? static_cast<int>(PS_THREAD_X) : -1;
  Vec<T, VEC> a[SLOTS], b[SLOTS];
  {
    const i64 row = PS_BLOCK_X / chunks;
    const GradRow<T, VEC> g(dy + row * dys, y + row * ys, dx + row * dxs, cols);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const i64 k = begin + (i64)s * PS_BLOCK_DIM_X;
      if (WHOLE ? k < g.slots : g.full(k)) g.load(k, a[s], b[s], true);
    }
  }
  for (i64 row = PS_BLOCK_X / chunks; row < rows; row += rows_per_round) {
    const GradRow<T, VEC> g(dy + row * dys, y + row * ys, dx + row * dxs, cols);
    const i64 next_row = row + rows_per_round;
    // thread 0, once this block's part is published: the wait for the row's other blocks, then its
    // part of the previous row back to zero (every block of this row has arrived, so each has read
    // the previous row's parts), and (chunk 0) that row's count. The gradient from y publishes polled
    // words, with no fence; from x, a chunk's three doubles are fenced before its arrival is counted
    // and warp 0 merges them once every chunk has arrived (docs/design.md: why the two differ).
    auto arrive_then_clear = [&] {
      if constexpr (FROM_INPUT) {
        PS_THREAD_FENCE();  // the part visible before the arrival is counted
        arrive_and_wait(arrivals + row, chunks);
      } else {
        arrive_and_wait(arrivals + row, chunks, false);  // the parts are polled words: no fence
      }
      if (row >= rows_per_round) {
        const PublishedDoubles previous{sums + kFields * (row - rows_per_round) * chunks};
#pragma unroll
        for (int field = 0; field < kFields; ++field) previous.clear(kFields * chunk + field);
        if (chunk == 0) arrivals[row - rows_per_round] = 0u;
      }
    };
    double* const row_parts = sums + kFields * row * chunks;  // this row's parts, kFields a chunk
    const PublishedDoubles published{row_parts};
    if constexpr (FROM_INPUT) {
      const InputChunk<C> part = input_chunk_sums<OP, WARP, SLOTS, WHOLE>(g, a, b, begin, edge_of_thread);
      if (PS_THREAD_X == 0) {
        volatile double* at = row_parts + 3 * chunk;
        at[0] = part.top;
        at[1] = part.d;
        at[2] = part.grad;
      }
      if (PS_THREAD_X == 0) arrive_then_clear();
    } else {
      GradAccumulator<OP, C> acc;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const i64 k = begin + (i64)s * PS_BLOCK_DIM_X;
        if (WHOLE ? k < g.slots : g.full(k)) g.template add<OP, kWide16Bit<T, VEC>>(k, a[s], b[s], acc, true);
      }
      g.add_edge(edge_of_thread, acc);
      const GradSum<C> part = grad_reduce_block<OP, WARP>(acc.total);
      if (PS_THREAD_X == 0) {
        published.publish(2 * chunk, part.sum);
        if constexpr (Backward<OP>::kTop) published.publish(2 * chunk + 1, part.top);  // softmax's is unused
        arrive_then_clear();
      }
    }
    PS_SYNC();
    YOf y_of;
    GradSum<C> total = grad_identity<C>();
    if constexpr (FROM_INPUT) {
      if (PS_THREAD_X < WARP) {  // warp 0 merges the chunks' sums, rescaled to the row's max as (m, d) pairs merge
        const volatile double* parts = row_parts;
        C top = ps_neg_inf<C>();
        for (i64 c = PS_THREAD_X; c < chunks; c += WARP) top = ps_max_nan(top, static_cast<C>(parts[3 * c]));
        top = max_over_lanes<WARP>(top);
        const ExpMinus<C> exp_minus(top == ps_neg_inf<C>() ? C(0) : top);
        double grad = 0.0;
        C d = C(0);
        for (i64 c = PS_THREAD_X; c < chunks; c += WARP) {
          const C scale = exp_minus(static_cast<C>(parts[3 * c]));
          d += static_cast<C>(parts[3 * c + 1]) * scale;
          grad += OP == kSoftmax ? parts[3 * c + 2] * static_cast<double>(scale) : parts[3 * c + 2];
        }
        grad = sum_over_lanes<WARP>(grad);
        d = sum_over_lanes<WARP>(d);
        if (PS_THREAD_X == 0) {
          row_total[0] = grad;
          row_total[1] = top;
          row_total[2] = d;
        }
      }
      PS_SYNC();
      // as InputRow: softmax's sum(dy y) = sum(dy e) / d; the top tells log_softmax's finish a NaN row
      // and a safe empty one
      total = GradSum<C>{row_total[0], static_cast<C>(row_total[1])};
      const C top = total.top, d = static_cast<C>(row_total[2]);
      y_of = YOf{RowFinish<OP, T>(MD<C>{d == C(0) ? ps_neg_inf<C>() : top, d}, safe != 0)};
      total.sum = OP == kSoftmax ? (d > C(0) ? total.sum / static_cast<double>(d) : 0.0) : total.sum;
      total.top = top != top ? top : (d == C(0) ? ps_neg_inf<C>() : C(0));
    } else {
      // Every thread merges its chunks' words (a chunk a thread where chunks <= the block), each read
      // as it lands, and the block's reduction hands every thread the row's total: the polls run
      // side by side, where a lane taking several chunks would wait for them one after another.
      constexpr bool kTop = Backward<OP>::kTop;  // softmax reads the sums alone
      for (i64 c = PS_THREAD_X; c < chunks; c += PS_BLOCK_DIM_X) {
        double part[kTop ? 2 : 1];  // (sum, top)
        published.read(2 * c, part);
        total = grad_combine(total, GradSum<C>{part[0], kTop ? static_cast<C>(part[kTop]) : ps_neg_inf<C>()});
      }
      total = grad_reduce_block<OP, WARP>(total);
    }
    const typename Backward<OP>::template Finish<C> f(total, safe != 0);
    if constexpr (FROM_INPUT) PS_SYNC();  // row_total is written again for the next row
#if PS_ASYNC_COPY
    if constexpr (kPrefetch) {
      if (next_row < rows) {
        const GradRow<T, VEC> next(dy + next_row * dys, y + next_row * ys, dx + next_row * dxs, cols);
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const i64 k = begin + (i64)s * PS_BLOCK_DIM_X;
          if (WHOLE ? k < next.slots : next.full(k)) {
            const i64 first = k * VEC - next.pad;
            async_copy<sizeof(Slot)>(&next_dy[s * kGradCachedThreads + PS_THREAD_X], next.dy + first);
            async_copy<sizeof(Slot)>(&next_y[s * kGradCachedThreads + PS_THREAD_X], next.y + first);
          }
        }
      }
    }
#endif
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const i64 k = begin + (i64)s * PS_BLOCK_DIM_X;
      if (WHOLE ? k < g.slots : g.full(k)) g.store(k, a[s], b[s], f, y_of, true);
    }
    g.store_edge(edge_of_thread, f, y_of);
    if (next_row < rows) {  // the next row into registers
      const GradRow<T, VEC> next(dy + next_row * dys, y + next_row * ys, dx + next_row * dxs, cols);
#if PS_ASYNC_COPY
      if constexpr (kPrefetch) async_copy_wait_all();
#endif
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const i64 k = begin + (i64)s * PS_BLOCK_DIM_X;
        if (WHOLE ? k < next.slots : next.full(k)) {
          if (kPrefetch) {
            a[s] = next_dy[s * kGradCachedThreads + PS_THREAD_X];
            b[s] = next_y[s * kGradCachedThreads + PS_THREAD_X];
          } else {
            next.load(k, a[s], b[s], true);
          }
        }
      }
    }
    // The blocks' last row: chunks departures after its chunks arrivals; the last to leave clears it.
    if (row + rows_per_round >= rows && PS_THREAD_X == 0 && depart_last(arrivals + row, chunks, chunks)) {
      for (i64 c = 0; c < kFields * chunks; ++c) published.clear(c);
      arrivals[row] = 0u;
    }
  }
}

// ---- a row split across blocks, two passes: the gradient op -------------------------------------
// Rows too long to hold on chip (softmax.cuh split_first_pass / split_second_pass): a chunk's partial
// is its GradSum (two doubles), merged by warp 0; each pass streams its slots kDepth at a time.
template <typename T, int OP> struct GradientSplit {
  typedef typename compute_of<T>::type C;
  typedef typename Backward<OP>::template Finish<C> Finish;
  static constexpr int kDepth = 4;  // slots in flight a thread before their use
  const T* dy;
  const T* y;
  T* dx;  // the first pass writes none
  i64 dys, ys, dxs;
  bool safe;
  template <int VEC> PS_DEVICE GradRow<T, VEC> row(i64 r, i64 cols) const {
    return GradRow<T, VEC>(dy + r * dys, y + r * ys, dx + r * dxs, cols);
  }
  template <int WARP, int VEC> PS_DEVICE GradSum<C> chunk(const GradRow<T, VEC>& g, i64 begin, i64 end) const {
    GradAccumulator<OP, C> acc;
    for (i64 k0 = begin + PS_THREAD_X; k0 < end; k0 += kDepth * PS_BLOCK_DIM_X) {
      Vec<T, VEC> a[kDepth], b[kDepth];
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const i64 k = k0 + (i64)u * PS_BLOCK_DIM_X;
        if (k < end) g.load(k, a[u], b[u]);
      }
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const i64 k = k0 + (i64)u * PS_BLOCK_DIM_X;
        if (k < end) g.add(k, a[u], b[u], acc);
      }
    }
    return grad_reduce_block<OP, WARP>(acc.total);
  }
  PS_DEVICE void publish(double* sums, i64 job, GradSum<C> part) const {
    sums[2 * job] = part.sum;
    sums[2 * job + 1] = part.top;
  }
  template <int WARP> PS_DEVICE Finish merge(const double* sums, i64 row, i64 chunks) const {
    PS_SHARED double row_total[2];
    if (PS_THREAD_X < WARP) {  // warp 0 merges the row's chunks
      GradSum<C> total = grad_identity<C>();
      for (i64 c = PS_THREAD_X; c < chunks; c += WARP) {
        const double* at = sums + 2 * (row * chunks + c);
        total = grad_combine(total, GradSum<C>{at[0], static_cast<C>(at[1])});
      }
      total = grad_reduce_lanes<WARP>(total, Backward<OP>::kTop);
      if (PS_THREAD_X == 0) {
        row_total[0] = total.sum;
        row_total[1] = total.top;
      }
    }
    PS_SYNC();
    const Finish f(GradSum<C>{row_total[0], static_cast<C>(row_total[1])}, safe);
    PS_SYNC();  // row_total is written again for the next chunk
    return f;
  }
  template <int VEC>
  PS_DEVICE void finish_chunk(const GradRow<T, VEC>& g, i64 begin, i64 end, const Finish& f) const {
    for (i64 k0 = begin + PS_THREAD_X; k0 < end; k0 += kDepth * PS_BLOCK_DIM_X) {
      Vec<T, VEC> a[kDepth], b[kDepth];
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const i64 k = k0 + (i64)u * PS_BLOCK_DIM_X;
        if (k < end) g.load(k, a[u], b[u]);
      }
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const i64 k = k0 + (i64)u * PS_BLOCK_DIM_X;
        if (k < end) g.store(k, a[u], b[u], f);
      }
    }
  }
};

// ---- a strided axis ------------------------------------------------------------------------------
// The forward's strided regimes with the gradient's op: a thread loads dy and y of an element (or
// of a vector of positions), and a position's column reduces to a GradSum: strided_axis (column
// groups of a block, two reads) and strided_thread (short axes, a thread per line of positions).
template <typename C> struct PartialFields<GradSum<C>> {
  typedef double First;
  typedef C Second;
  PS_DEVICE static GradSum<C> get(const double* sum, const C* top, int at) { return GradSum<C>{sum[at], top[at]}; }
  PS_DEVICE static void put(double* sum, C* top, int at, GradSum<C> g) { sum[at] = g.sum; top[at] = g.top; }
  PS_DEVICE static GradSum<C> identity() { return grad_identity<C>(); }
  PS_DEVICE static GradSum<C> combine(GradSum<C> a, GradSum<C> b) { return grad_combine(a, b); }
};

// The GradSums that the chunks of a tile's position publish to each other in strided_cached: two
// doubles, so counted (PublishedPairs' protocol for double pairs): the writer fences before its
// arrival is counted, the readers read once after the count.
template <typename C> struct PublishedGradSums {
  static constexpr bool kCounted = true;
  double* sums;
  PS_DEVICE void publish(i64 slot, GradSum<C> g) const {
    volatile double* at = sums + 2 * slot;
    at[0] = g.sum;
    at[1] = static_cast<double>(g.top);
    PS_THREAD_FENCE();  // both words visible before the arrival is counted
  }
  PS_DEVICE void clear(i64 slot) const {
    sums[2 * slot] = 0.0;
    sums[2 * slot + 1] = 0.0;
  }
  PS_DEVICE GradSum<C> read(i64 slot) const {
    const volatile double* at = sums + 2 * slot;
    return GradSum<C>{at[0], static_cast<C>(at[1])};
  }
};

template <typename T, int OP> struct GradientStrided {
  typedef typename compute_of<T>::type C;
  typedef T Element;
  typedef PublishedGradSums<C> Published;
  struct Value { C dy, y; };
  typedef GradAccumulator<OP, C> Accumulator;
  typedef GradSum<C> Partial;
  typedef typename Backward<OP>::template Finish<C> Finish;
  static constexpr int kPasses = kBothPasses;
  static constexpr int kHeld = kStridedHeld;
  struct Column { const T* dy; const T* y; };
  struct Line { const T* dy; const T* y; T* dx; };
  template <int VEC> struct Held { Vec<T, VEC> dy, y; };
  const T* dy;
  const T* y;
  T* dx;
  i64 dyso, dysc, dysi, yso, ysc, ysi, dxso, dxsc, dxsi;
  template <int N> PS_DEVICE static void add(Accumulator& acc, const Value* v) {
    C a[N], b[N];
#pragma unroll
    for (int j = 0; j < N; ++j) { a[j] = v[j].dy; b[j] = v[j].y; }
    acc.template add_all<N>(a, b);
  }
  PS_DEVICE static GradSum<C> partial(const Accumulator& acc) { return acc.total; }
  // an element that adds no term; for log_softmax, -inf leaves the max of y as it is
  static constexpr bool kAbsentYIsNegInf = Backward<OP>::kTop;
  // strided_axis: an element at a time
  PS_DEVICE Column column(i64 o, i64 i) const { return Column{dy + o * dyso + i * dysi, y + o * yso + i * ysi}; }
  PS_DEVICE T* output(i64 o, i64 i) const { return dx + o * dxso + i * dxsi; }
  PS_DEVICE Value load(const Column& at, i64 c) const {
    return Value{to_compute(at.dy[c * dysc]), to_compute(at.y[c * ysc])};
  }
  PS_DEVICE static Value absent() { return Value{C(0), kAbsentYIsNegInf ? ps_neg_inf<C>() : C(0)}; }
  PS_DEVICE void store(T* dxl, i64 c, const Finish& f, const Value& v) const {
    dxl[c * dxsc] = from_compute<T>(f(v.dy, v.y));
  }
  // strided_thread: vectors of VEC positions
  PS_DEVICE Line line(i64 o, i64 i) const {
    return Line{dy + o * dyso + i * dysi, y + o * yso + i * ysi, dx + o * dxso + i * dxsi};
  }
  template <int VEC> PS_DEVICE Held<VEC> load_vector(const Line& l, i64 c) const {
    return Held<VEC>{*reinterpret_cast<const Vec<T, VEC>*>(l.dy + c * dysc),
                     *reinterpret_cast<const Vec<T, VEC>*>(l.y + c * ysc)};
  }
  template <int VEC> PS_DEVICE static Held<VEC> absent_vector() {
    Held<VEC> h;
    memset(&h.dy, 0, sizeof(h.dy));  // +0 in every floating-point format
    if constexpr (kAbsentYIsNegInf) {
      h.y = neg_inf_vec<T, VEC>();
    } else {
      memset(&h.y, 0, sizeof(h.y));
    }
    return h;
  }
  template <int VEC> PS_DEVICE static Value value(const Held<VEC>& h, int j) {
    return Value{to_compute(h.dy.v[j]), to_compute(h.y.v[j])};
  }
  template <int VEC>
  PS_DEVICE void store_vector(const Line& l, i64 c, const Finish (&f)[VEC], const Held<VEC>& h) const {
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_compute<T>(f[j](to_compute(h.dy.v[j]), to_compute(h.y.v[j])));
    *reinterpret_cast<Vec<T, VEC>*>(l.dx + c * dxsc) = out;
  }
  // strided_cached: a tile's rows of dy and y through shared memory
  PS_DEVICE i64 output_col() const { return dxsc; }
  PS_DEVICE Column advance(const Column& at, i64 rows) const { return Column{at.dy + rows * dysc, at.y + rows * ysc}; }
  template <int VEC> PS_DEVICE void store_held(T* out_at, const Finish (&f)[VEC], const Held<VEC>& h) const {
    Vec<T, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = from_compute<T>(f[j](to_compute(h.dy.v[j]), to_compute(h.y.v[j])));
    *reinterpret_cast<Vec<T, VEC>*>(out_at) = out;
  }
#if PS_ASYNC_COPY
  template <int VEC> PS_DEVICE static void prefetch(Held<VEC>* at, const Column& from) {
    async_copy<sizeof(Vec<T, VEC>)>(&at->dy, from.dy);
    async_copy<sizeof(Vec<T, VEC>)>(&at->y, from.y);
  }
#endif
};

// The gradient's strided passes apart (StridedPasses), for an axis sharded across ranks: each
// position's GradSum as two doubles side by side in `sums` (sum, top), as the two-pass split's.
template <typename T, int OP, int PASSES> struct GradientStridedPass : GradientStrided<T, OP> {
  typedef typename compute_of<T>::type C;
  static constexpr int kPasses = PASSES;
  static constexpr int kHeld = kStridedPassHeld;
  double* sums;
  PS_DEVICE void publish(i64 at, GradSum<C> g) const {
    sums[2 * at] = g.sum;
    sums[2 * at + 1] = g.top;
  }
  template <typename Line> PS_DEVICE GradSum<C> given(const Line&, i64 at) const {
    return GradSum<C>{sums[2 * at], static_cast<C>(sums[2 * at + 1])};
  }
};

// The launch bounds of the kernels above (planner_backward.py holds the same numbers).
const int kGradRowsThreads = 256;         // groups of lanes a row
// Blocks a multiprocessor must hold, which caps registers a thread: enough for at least 512 threads
// (1024, 64 registers, in blocks a row of 16-bit elements in 16-byte slots: their two paths, whole
// rows and any, take no more without spilling, and log_softmax's took 72 where fewer blocks were
// asked, with a quarter fewer resident threads; 768 for the gradient from x, whose log_softmax rows
// ran 1-2 points slower at 1024 but for float16 rows of 6144 columns: docs/design.md).
template <typename T, int VEC, bool BLOCK, bool FROM_INPUT = false>
constexpr int grad_rows_min_blocks(int threads) {
  const int least = kWide16Bit<T, VEC> && BLOCK ? (FROM_INPUT ? 768 : 1024) : 512;
  return threads > 512 ? 1 : (least + threads - 1) / threads;
}
const int kGradCachedMinBlocks = 4;       // ... at least this many a multiprocessor
// ... and three for the 16-bit gradient from x: 80 registers, where four blocks' 64 spilled 112-188
// bytes and ran 5-12 points slower (docs/design.md)
template <typename T, int VEC, bool FROM_INPUT> constexpr int grad_cached_min_blocks() {
  return FROM_INPUT && kWide16Bit<T, VEC> ? 3 : kGradCachedMinBlocks;
}
const int kGradStreamThreads = 256;       // the two-pass split

}  // namespace ps

// ---- extern "C" entry points (the generated softmax_<dtype>.cu files name each instantiation) ----
// Blocks of G threads (a block a row) or kGradRowsThreads (groups of lanes), registers capped by
// grad_rows_min_blocks.
#define PS_GRAD_ROWS_ENTRY(DT, T, OPN, OP, W, G, S, V)                                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN((G > W ? G : ps::kGradRowsThreads),                                \
                                      (ps::grad_rows_min_blocks<T, V, (G > W)>(G > W ? G : ps::kGradRowsThreads))) \
      ps_bwd_rows_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V(const T* dy, const T* y, T* dx, ps::i64 rows,  \
                                                           ps::i64 cols, ps::i64 dys, ps::i64 ys,         \
                                                           ps::i64 dxs, int safe) {                       \
    if constexpr (ps::GradRowsBatch<T, W, G, S, V>::rows > 1) {                                          \
      ps::rows_in_registers<ps::GradientRows<T, OP>, W, G, S, V, ps::GradRowsBatch<T, W, G, S, V>::rows>( \
          ps::GradientRows<T, OP>{dy, y, dx, dys, ys, dxs, safe != 0}, rows, cols);                       \
    } else {                                                                                             \
      ps::grad_rows<T, OP, W, G, S, V>(dy, y, dx, rows, cols, dys, ys, dxs, safe);                       \
    }                                                                                                    \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_rows_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V)

// The gradient from the forward's input x: the same shapes, one row a step.
#define PS_GRAD_ROWS_FROM_INPUT_ENTRY(DT, T, OPN, OP, W, G, S, V)                                        \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN((G > W ? G : ps::kGradRowsThreads),                                \
                                      (ps::grad_rows_min_blocks<T, V, (G > W), true>(G > W ? G            \
                                                                                       : ps::kGradRowsThreads))) \
      ps_bwd_from_input_rows_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V(                                   \
          const T* dy, const T* x, T* dx, ps::i64 rows, ps::i64 cols, ps::i64 dys, ps::i64 xs,           \
          ps::i64 dxs, int safe) {                                                                       \
    ps::grad_rows<T, OP, W, G, S, V, true>(dy, x, dx, rows, cols, dys, xs, dxs, safe);                   \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_from_input_rows_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V)

// A block a row's kernels at fewer threads than the shape's (slot_stride's FITTED), from y and from x.
// They take the shape's launch bound, or (CAPPED: _variants.GRAD_FITTED_CAPPED, from x
// GRAD_FROM_INPUT_FITTED_CAPPED) at most R registers a thread (_variants.grad_fitted_max_registers):
// kernels that took more under the bound, so that their fitted blocks held fewer a multiprocessor.
#define PS_GRAD_ROWS_FITTED_KERNEL(BOUNDS, DT, T, OPN, OP, W, G, S, V)                                   \
  PS_GLOBAL void BOUNDS ps_bwd_rows_fitted_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V(                     \
      const T* dy, const T* y, T* dx, ps::i64 rows, ps::i64 cols, ps::i64 dys, ps::i64 ys, ps::i64 dxs,  \
      int safe) {                                                                                        \
    ps::grad_rows<T, OP, W, G, S, V, false, true>(dy, y, dx, rows, cols, dys, ys, dxs, safe);            \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_rows_fitted_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V)
#define PS_GRAD_ROWS_FITTED_ENTRY(DT, T, OPN, OP, W, G, S, V)                                            \
  PS_GRAD_ROWS_FITTED_KERNEL(PS_LAUNCH_BOUNDS_MIN(G, (ps::grad_rows_min_blocks<T, V, true>(G))), DT, T,  \
                             OPN, OP, W, G, S, V)
#define PS_GRAD_ROWS_FITTED_CAPPED_ENTRY(DT, T, OPN, OP, W, G, S, V, R)                                  \
  PS_GRAD_ROWS_FITTED_KERNEL(PS_MAX_REGISTERS(G, (ps::grad_rows_min_blocks<T, V, true>(G)), R), DT, T,   \
                             OPN, OP, W, G, S, V)
#define PS_GRAD_ROWS_FROM_INPUT_FITTED_KERNEL(BOUNDS, DT, T, OPN, OP, W, G, S, V)                        \
  PS_GLOBAL void BOUNDS ps_bwd_from_input_rows_fitted_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V(          \
      const T* dy, const T* x, T* dx, ps::i64 rows, ps::i64 cols, ps::i64 dys, ps::i64 xs, ps::i64 dxs,  \
      int safe) {                                                                                        \
    ps::grad_rows<T, OP, W, G, S, V, true, true>(dy, x, dx, rows, cols, dys, xs, dxs, safe);             \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_from_input_rows_fitted_##DT##_##OPN##_w##W##_g##G##_s##S##_v##V)
#define PS_GRAD_ROWS_FROM_INPUT_FITTED_ENTRY(DT, T, OPN, OP, W, G, S, V)                                 \
  PS_GRAD_ROWS_FROM_INPUT_FITTED_KERNEL(PS_LAUNCH_BOUNDS_MIN(G, (ps::grad_rows_min_blocks<T, V, true, true>(G))), \
                                        DT, T, OPN, OP, W, G, S, V)
#define PS_GRAD_ROWS_FROM_INPUT_FITTED_CAPPED_ENTRY(DT, T, OPN, OP, W, G, S, V, R)                       \
  PS_GRAD_ROWS_FROM_INPUT_FITTED_KERNEL(PS_MAX_REGISTERS(G, (ps::grad_rows_min_blocks<T, V, true, true>(G)), R), \
                                        DT, T, OPN, OP, W, G, S, V)

#define PS_GRAD_CACHED_KERNEL(NAME, T, OP, W, S, V, WHOLE, FROM_INPUT)                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kGradCachedThreads, (ps::grad_cached_min_blocks<T, V, FROM_INPUT>())) \
      NAME(const T* dy, const T* y, T* dx, double* sums, unsigned* arrivals, ps::i64 rows, ps::i64 cols, \
           ps::i64 dys, ps::i64 ys, ps::i64 dxs, ps::i64 chunks, int safe) {                             \
    ps::grad_split_cached<T, OP, W, S, V, WHOLE, FROM_INPUT>(dy, y, dx, sums, arrivals, rows, cols, dys, ys,     \
                                                             dxs, chunks, safe);                         \
  }                                                                                                      \
  PS_EXPORT_KERNEL(NAME)
#define PS_GRAD_CACHED_ENTRY(DT, T, OPN, OP, W, S, V)                                                    \
  PS_GRAD_CACHED_KERNEL(ps_bwd_cached_##DT##_##OPN##_w##W##_s##S##_v##V, T, OP, W, S, V, false, false)
#define PS_GRAD_CACHED_WHOLE_ENTRY(DT, T, OPN, OP, W, S, V)                                              \
  PS_GRAD_CACHED_KERNEL(ps_bwd_cached_whole_##DT##_##OPN##_w##W##_s##S##_v##V, T, OP, W, S, V, true, false)
// The gradient from the forward's input x (y holds x), built for 16-byte slots: rows with edge
// elements, and for 16-bit ones a kernel of whole rows beside it (as the gradient from y's).
#define PS_GRAD_CACHED_FROM_INPUT_ENTRY(DT, T, OPN, OP, W, S, V)                                         \
  PS_GRAD_CACHED_KERNEL(ps_bwd_from_input_cached_##DT##_##OPN##_w##W##_s##S##_v##V, T, OP, W, S, V, false, true)
#define PS_GRAD_CACHED_FROM_INPUT_WHOLE_ENTRY(DT, T, OPN, OP, W, S, V)                                   \
  PS_GRAD_CACHED_KERNEL(ps_bwd_from_input_cached_whole_##DT##_##OPN##_w##W##_s##S##_v##V, T, OP, W, S, V, true, \
                        true)

// The rows regime's passes apart (GradientRowsSums, then GradientRowsFromSums): a warp a row.
#define PS_GRAD_ROWS_PASSES_ENTRY(DT, T, OPN, OP, W, S, V)                                               \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kGradRowsThreads, (ps::grad_rows_min_blocks<T, V, false>(ps::kGradRowsThreads))) \
      ps_bwd_rows_sums_##DT##_##OPN##_w##W##_s##S##_v##V(const T* dy, const T* y, double* sums, ps::i64 rows, \
                                                         ps::i64 cols, ps::i64 dys, ps::i64 ys) {          \
    ps::rows_in_registers<ps::GradientRowsSums<T, OP>, W, W, S, V, 1>(                                   \
        ps::GradientRowsSums<T, OP>{{dy, y, (T*)0, dys, ys, 0, false}, sums}, rows, cols);               \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_rows_sums_##DT##_##OPN##_w##W##_s##S##_v##V)                                   \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kGradRowsThreads, (ps::grad_rows_min_blocks<T, V, false>(ps::kGradRowsThreads))) \
      ps_bwd_rows_finish_##DT##_##OPN##_w##W##_s##S##_v##V(const T* dy, const T* y, T* dx, const double* sums, \
                                                           ps::i64 rows, ps::i64 cols, ps::i64 dys, ps::i64 ys, \
                                                           ps::i64 dxs, int safe) {                      \
    ps::rows_in_registers<ps::GradientRowsFromSums<T, OP>, W, W, S, V, 1>(                               \
        ps::GradientRowsFromSums<T, OP>{{dy, y, dx, dys, ys, dxs, safe != 0}, sums}, rows, cols);       \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_rows_finish_##DT##_##OPN##_w##W##_s##S##_v##V)

#define PS_GRAD_SPLIT_ENTRY(DT, T, OPN, OP, W, V)                                                        \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kGradStreamThreads) ps_bwd_partials_##DT##_##OPN##_w##W##_v##V(    \
      const T* dy, const T* y, double* sums, ps::i64 rows, ps::i64 cols, ps::i64 dys,                    \
      ps::i64 ys, ps::i64 chunk_slots, ps::i64 chunks) {                                                 \
    ps::split_first_pass<ps::GradientSplit<T, OP>, W, V>(                                                \
        ps::GradientSplit<T, OP>{dy, y, nullptr, dys, ys, 0, false}, sums, rows, cols, chunk_slots, chunks); \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_partials_##DT##_##OPN##_w##W##_v##V)                                           \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kGradStreamThreads) ps_bwd_finish_##DT##_##OPN##_w##W##_v##V(      \
      const T* dy, const T* y, T* dx, const double* sums, ps::i64 rows, ps::i64 cols,                    \
      ps::i64 dys, ps::i64 ys, ps::i64 dxs, ps::i64 chunk_slots, ps::i64 chunks, int safe) {             \
    ps::split_second_pass<ps::GradientSplit<T, OP>, W, V>(                                               \
        ps::GradientSplit<T, OP>{dy, y, dx, dys, ys, dxs, safe != 0}, sums, rows, cols, chunk_slots, chunks); \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_finish_##DT##_##OPN##_w##W##_v##V)

// Contiguous short rows of dy, y and dx alike aligned, staged through shared memory (staged_rows):
// a thread (L = 1) or a group of L lanes a row, the groups' rows in order or interleaved.
#define PS_GRAD_STAGED_ENTRY(DT, T, OPN, OP, L, V)                                                       \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kStagedThreads, ps::min_blocks<T>(ps::kStagedMinBlocks))       \
      ps_bwd_staged_##DT##_##OPN##_l##L##_v##V(const T* dy, const T* y, T* dx, ps::i64 rows, ps::i64 cols, \
                                               ps::i64 tile_rows, int interleave, int safe) {            \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                                   \
    ps::staged_rows<ps::GradientShortRows<T, OP>, V, L>(ps::GradientShortRows<T, OP>{dy, y, dx}, rows, cols,   \
                                                     tile_rows, safe,                                    \
                                                     reinterpret_cast<ps::Vec<T, V>*>(ps_cache), -1,     \
                                                     interleave);                                        \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_staged_##DT##_##OPN##_l##L##_v##V)

// Contiguous rows of C columns, whole rows inside a thread's 16-byte vectors (packed_rows), dy, y and
// dx alike aligned.
#define PS_GRAD_PACKED_ENTRY(DT, T, OPN, OP, C, V)                                                       \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kPackedThreads, (ps::packed_min_blocks<C, V>()))               \
      ps_bwd_packed_##DT##_##OPN##_c##C##_v##V(const T* dy, const T* y, T* dx, ps::i64 rows, int safe) {   \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                                   \
    ps::packed_rows<ps::GradientShortRows<T, OP>, C, V>(ps::GradientShortRows<T, OP>{dy, y, dx}, rows, safe, 1, \
                                                        reinterpret_cast<ps::Vec<T, V>*>(ps_cache));      \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_packed_##DT##_##OPN##_c##C##_v##V)

#define PS_GRAD_STRIDED_ENTRY(DT, T, OPN, OP)                                                            \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(1024) ps_bwd_strided_##DT##_##OPN(                                     \
      const T* dy, const T* y, T* dx, ps::i64 outer, ps::i64 cols, ps::i64 inner, ps::i64 dyso,          \
      ps::i64 dysc, ps::i64 dysi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, ps::i64 dxso, ps::i64 dxsc,     \
      ps::i64 dxsi, int inner_tile, int safe) {                                                          \
    ps::strided_axis(ps::GradientStrided<T, OP>{dy, y, dx, dyso, dysc, dysi, yso, ysc, ysi, dxso, dxsc, dxsi}, \
                     outer, cols, inner, inner_tile, safe);                                              \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_strided_##DT##_##OPN)

#define PS_GRAD_STRIDED_THREAD_ENTRY(DT, T, OPN, OP, V, L)                                               \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kStridedThreadThreads) ps_bwd_strided_thread_##DT##_##OPN##_v##V##_l##L( \
      const T* dy, const T* y, T* dx, ps::i64 outer, ps::i64 cols, ps::i64 inner, ps::i64 dyso,          \
      ps::i64 dysc, ps::i64 dysi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, ps::i64 dxso, ps::i64 dxsc,     \
      ps::i64 dxsi, int safe) {                                                                          \
    ps::strided_thread<ps::GradientStrided<T, OP>, V, L>(                                                \
        ps::GradientStrided<T, OP>{dy, y, dx, dyso, dysc, dysi, yso, ysc, ysi, dxso, dxsc, dxsi}, outer, cols, \
        inner, safe);                                                                                    \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_strided_thread_##DT##_##OPN##_v##V##_l##L)

// A sharded axis's strided passes of the gradient (StridedChunks of GradientStridedPass): the first
// writes the (sum, top) of each chunk of each position to `sums`; the second finishes each position
// with the pair it finds there.
#define PS_GRAD_STRIDED_PASSES_ENTRY(DT, T, OPN, OP, V, L)                                               \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kStridedThreadThreads) ps_bwd_strided_sums_##DT##_##OPN##_v##V##_l##L( \
      const T* dy, const T* y, double* sums, ps::i64 outer, ps::i64 cols, ps::i64 inner, ps::i64 dyso,   \
      ps::i64 dysc, ps::i64 dysi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, ps::i64 chunks, ps::i64 chunk_cols) { \
    typedef ps::StridedChunks<ps::GradientStridedPass<T, OP, ps::kFirstPass>> Op;                         \
    ps::strided_thread<Op, V, L>(                                                                        \
        Op{{{dy, y, (T*)0, dyso, dysc, dysi, yso, ysc, ysi, 0, 0, 0}, sums}, chunks, chunk_cols, cols, inner}, \
        outer * chunks, chunk_cols, inner, 0);                                                           \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_strided_sums_##DT##_##OPN##_v##V##_l##L)                                       \
  PS_GLOBAL void PS_LAUNCH_BOUNDS(ps::kStridedThreadThreads) ps_bwd_strided_finish_##DT##_##OPN##_v##V##_l##L( \
      const T* dy, const T* y, T* dx, double* sums, ps::i64 outer, ps::i64 cols, ps::i64 inner,          \
      ps::i64 dyso, ps::i64 dysc, ps::i64 dysi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi, ps::i64 dxso,     \
      ps::i64 dxsc, ps::i64 dxsi, int safe, ps::i64 chunks, ps::i64 chunk_cols) {                        \
    typedef ps::StridedChunks<ps::GradientStridedPass<T, OP, ps::kSecondPass>> Op;                        \
    ps::strided_thread<Op, V, L>(                                                                        \
        Op{{{dy, y, dx, dyso, dysc, dysi, yso, ysc, ysi, dxso, dxsc, dxsi}, sums}, chunks, chunk_cols, cols, inner}, \
        outer * chunks, chunk_cols, inner, safe);                                                        \
  }                                                                                                      \
  PS_EXPORT_KERNEL(ps_bwd_strided_finish_##DT##_##OPN##_v##V##_l##L)

// The forward's launch bounds (strided_cached_min_blocks): the planner sizes both alike.
#define PS_GRAD_STRIDED_CACHED_ENTRY(DT, T, OPN, OP, V)                                                 \
  PS_GLOBAL void PS_LAUNCH_BOUNDS_MIN(ps::kStridedCachedThreads, (ps::strided_cached_min_blocks<T, V>())) \
  ps_bwd_strided_cached_##DT##_##OPN##_v##V(                                                          \
      const T* dy, const T* y, T* dx, double* sums, unsigned* arrivals, ps::i64 outer, ps::i64 cols,   \
      ps::i64 inner, ps::i64 dyso, ps::i64 dysc, ps::i64 dysi, ps::i64 yso, ps::i64 ysc, ps::i64 ysi,  \
      ps::i64 dxso, ps::i64 dxsc, ps::i64 dxsi, int inner_tile, ps::i64 chunk_cols, ps::i64 chunks,     \
      int safe) {                                                                                       \
    PS_DYNAMIC_SHARED_BYTES(ps_cache);                                                                  \
    typedef ps::GradientStrided<T, OP> Op;                                                              \
    ps::strided_cached<Op, V>(Op{dy, y, dx, dyso, dysc, dysi, yso, ysc, ysi, dxso, dxsc, dxsi},        \
                              ps::PublishedGradSums<compute_of<T>::type>{sums}, arrivals, outer, cols, inner, \
                              inner_tile, chunk_cols, chunks, safe,                                     \
                              reinterpret_cast<Op::Held<V>*>(ps_cache));                                \
  }                                                                                                     \
  PS_EXPORT_KERNEL(ps_bwd_strided_cached_##DT##_##OPN##_v##V)
