// flashcute/sm90/pipeline.hpp: the synchronisation of the sm90a kernels, as types.
//
// - PipelineState: a position in a ring of buffers (which buffer, which phase of its barriers).
// - TmaPipeline: a ring's full/empty mbarrier pairs, with the producer's and the consumers' steps.
// - NamedBarriers: every named-barrier id the kernels use, in one place.
// - WarpgroupTurns: the ping-pong order of two consumer warpgroups' GEMMs.
#pragma once

#include <cstdint>

#include <cute/config.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>

namespace flashcute::sm90 {

// Named-barrier ids (CUTLASS's NamedBarrier adds its reserved ones).
struct NamedBarriers {
  static constexpr uint32_t kTurn = 0;       // + consumer warpgroup 0/1: ping-pong turns, 256 threads
  static constexpr uint32_t kWarpgroup = 2;  // + consumer warpgroup 0-3: its own 128 threads
  // Both consumer warpgroups (256 threads) have read the V buffer the o_via_v epilogue stages O in;
  // configs with o_via_v have two consumer warpgroups, so kWarpgroup + 3 is free.
  static constexpr uint32_t kVBufferFree = 5;
  // The backward (its own kernel, so its ids may repeat the forward's). kBwdDsReady + dS buffer
  // 0/1: the MMA warpgroups' halves of dS are in shared memory (all MMA threads; with dq_one_wg,
  // warpgroup 0 arrives and 1 waits). kBwdDsFree + buffer (dq_one_wg): warpgroup 1's dQ has read
  // the buffer, which warpgroup 0 may overwrite. kBwdDqFull / kBwdDqEmpty + half 0/1: a step's
  // half of dQ is in shared memory / the writer warp has read it out (its warpgroup and the
  // writer, 128 + 32 threads).
  static constexpr uint32_t kBwdDsReady = 0;
  static constexpr uint32_t kBwdDsFree = 2;
  static constexpr uint32_t kBwdDqFull = 4;
  static constexpr uint32_t kBwdDqEmpty = 6;
  // + MMA warpgroup 0/1: its dK and dV staged (128 threads); kBwdDsReady's ids, which are free
  // once both warpgroups have left the main loop.
  static constexpr uint32_t kBwdEpilogue = 0;
  // + MMA warpgroup 0/1, not dq_one_wg: its dV staged, while the other may still be in the main
  // loop (kBwdDsFree's ids, which only dq_one_wg configs use).
  static constexpr uint32_t kBwdEpilogueV = 2;
  static constexpr uint32_t kBwdDqTurn = 7;  // split_d, deterministic: the MMA threads around a dQ add
};

// A position in a ring of kStages buffers, counted in loads from zero: buffer count % kStages,
// phase parity (count / kStages) % 2. Producer and consumers count the same loads, so equal counts
// name the same buffer and phase.
template <int kStages>
struct PipelineState {
  int count = 0;
  CUTE_HOST_DEVICE int index() const { return count % kStages; }
  CUTE_HOST_DEVICE uint32_t phase() const { return uint32_t(count / kStages) & 1; }
  CUTE_HOST_DEVICE PipelineState& operator++() {
    ++count;
    return *this;
  }
  CUTE_HOST_DEVICE PipelineState operator+(int n) const { return {count + n}; }
  CUTE_HOST_DEVICE PipelineState operator-(int n) const { return {count - n}; }
};

// The barriers of one ring: full[s], the TMA's bytes for buffer s have landed (a transaction
// barrier the producer arms); empty[s], every consumer warp has finished reading buffer s.
template <int kStages>
struct PipelineBarriers {
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

// A ring of kStages shared-memory buffers filled by TMA: one producer thread, `consumer_warps`
// consumer warps that each release a buffer once.
template <int kStages>
struct TmaPipeline {
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  using State = PipelineState<kStages>;
  PipelineBarriers<kStages>& bar;

  // By one thread, before any other thread waits on or arrives at them (then fence and sync).
  CUTE_DEVICE static void init(PipelineBarriers<kStages>& b, int consumer_warps) {
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      TxBarrier::init(&b.full[s], 1);  // the producer's arrive, with its expected bytes
      Barrier::init(&b.empty[s], consumer_warps);
    }
  }

  // Producer: waits until every consumer warp has released the buffer's previous load (a fresh
  // barrier passes the wait for parity 1 at once), then arms `full` with the bytes the TMA will
  // write. Returns the barrier the TMA load signals.
  CUTE_DEVICE uint64_t& producer_acquire(State s, uint32_t bytes) const {
    producer_wait(s);
    TxBarrier::arrive_and_expect_tx(&bar.full[s.index()], bytes);
    return bar.full[s.index()];
  }
  // The two halves of producer_acquire for a buffer the producer fills some other way: wait until
  // it is free, then (its writes made visible to the async proxy) arrive with no bytes expected.
  CUTE_DEVICE void producer_wait(State s) const { Barrier::wait(&bar.empty[s.index()], s.phase() ^ 1); }
  CUTE_DEVICE void producer_commit(State s) const { Barrier::arrive(&bar.full[s.index()]); }
  CUTE_DEVICE void consumer_wait(State s) const { TxBarrier::wait(&bar.full[s.index()], s.phase()); }
  // After the warp's reads (its wgmma waited for) and with every lane past them. By buffer index
  // where the caller holds it already.
  CUTE_DEVICE void consumer_release(int buffer) const {
    __syncwarp();
    if (cute::elect_one_sync()) Barrier::arrive(&bar.empty[buffer]);
  }
  CUTE_DEVICE void consumer_release(State s) const { consumer_release(s.index()); }
  // Every consumer thread arrives (a ring initialised with the consumer thread count): for a
  // buffer the threads read with generic loads, whose reads each thread's own arrive releases.
  CUTE_DEVICE void consumer_release_thread(State s) const { Barrier::arrive(&bar.empty[s.index()]); }
  // Hands a buffer back unread, once its load has landed: released before, the arrival would
  // count toward the buffer's previous load.
  CUTE_DEVICE void consumer_skip(State s) const {
    consumer_wait(s);
    consumer_release(s);
  }
};

// Ping-pong: consumer warpgroup wg may issue its GEMMs once the other has issued its own (named
// barrier kTurn + wg: its 128 threads wait, the other's 128 arrive). Warpgroup 0 goes first:
// warpgroup 1 passes once before any GEMM (start), and warpgroup 0 takes that turn after its
// last GEMM (finish), so that no arrival is left pending. Without kEnabled, every step is empty.
template <bool kEnabled>
struct WarpgroupTurns {
  int wg;
  CUTE_DEVICE void wait() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(256, NamedBarriers::kTurn + wg);
  }
  CUTE_DEVICE void pass() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::arrive(256, NamedBarriers::kTurn + 1 - wg);
  }
  CUTE_DEVICE void start() const {
    if (wg == 1) pass();
  }
  CUTE_DEVICE void finish() const {
    if (wg == 0) wait();
  }
};

}  // namespace flashcute::sm90
