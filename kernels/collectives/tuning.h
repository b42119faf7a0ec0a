// The collectives' tuned values (collectives.h: the algorithms; select.cu: kAuto's choice;
// collectives.cu: the launch). Chosen on H200 (2 and 4 GPUs, NVLink); docs/performance.md has
// the measurements.
#pragma once

#include <cstdint>

namespace fusedcomm::kernels::tuning {

// Threads per CTA of every collective kernel.
inline constexpr int kCollectiveThreads = 512;

// ---- one-shot ----------------------------------------------------------------------------------
// Vectors in flight per thread in the one-shot copies (small parts).
inline constexpr int kOneShotCopyUnroll = 4;
// CTAs: about this many bytes per CTA and peer (remote stores from few SMs do not fill NVLink).
inline constexpr int64_t kOneShotBytesPerCta = 8192;
// kAuto: one-shot up to these total message bytes (it moves (W-1)× the payload per rank but
// needs a single flag exchange; two-phase is bandwidth-optimal but needs two or three).
inline constexpr int64_t kOneShotMaxAllReduceBytesW2 = 512 << 10;
inline constexpr int64_t kOneShotMaxAllReduceBytes = 256 << 10;  // W >= 3
inline constexpr int64_t kOneShotMaxBytesW2 = 1 << 20;           // the other ops
inline constexpr int64_t kOneShotMaxBytes = 512 << 10;           // the other ops, W >= 3

// ---- two-phase ---------------------------------------------------------------------------------
// 16-byte loads in flight per thread: copies (NVLink reads need many), and reductions (per
// source; NS × this many in flight).
inline constexpr int kTwoPhaseCopyUnroll = 8;
inline constexpr int kTwoPhaseRedUnroll = 2;
// Resident CTAs per SM (the launch bounds; the allReduce's grid barrier needs every CTA
// resident).
inline constexpr int kTwoPhaseCtasPerSm = 1;
// CTAs that pull from peers, by world: more CTAs keep more NVLink reads outstanding and go
// slower (measured on 4 GPUs).
inline constexpr int kTwoPhasePullCtasW2 = 64;
inline constexpr int kTwoPhasePullCtas = 48;  // W >= 3
// Work items: from 8 KiB, doubled while every CTA keeps two items of each phase, up to this.
inline constexpr int64_t kTwoPhaseMaxChunkBytes = int64_t{64} << 10;

// ---- chunk-pipelined variants (kTwoPhasePush, kPipelined, kDirect) ------------------------------
// Vectors in flight per data thread: copies, and loads of a reduction (over all its sources).
inline constexpr int kPipeCopyUnroll = 8;
inline constexpr int kPipeRedLoads = 8;
// Producers (CollectiveArgs::num_ctas overrides): push allReduce ...
inline constexpr int kPushProducersW2 = 64;
inline constexpr int kPushProducers = 48;  // W >= 3
// ... with one consumer (local copies) per kPushCopyDiv producers; pipelined: as many consumers
// (pulls of peers' scratch) as producers, so that about as many CTAs pull as in two-phase.
inline constexpr int kPushCopyDiv = 2;
inline constexpr int kPipeProducersW2 = 32;
inline constexpr int kPipeProducers = 24;  // W >= 3
// The default chunk (CollectiveArgs::chunk_bytes overrides).
inline constexpr int64_t kPipeChunkBytes = int64_t{64} << 10;
// Direct allReduce: producers, and reducers as a percentage of them. Both halves only store over
// NVLink; a store-only probe needed 96-132 CTAs. With 128 + 128 (more CTAs than SMs: the
// producers take the SMs first, the reducers follow as they finish, so the two halves run
// nearly one after the other, each on every SM) the kernel matched the probe on 2 GPUs (341 /
// 358 / 365 GB/s bus bandwidth at 64 MiB / 256 MiB / 1 GiB; 64 + 64: 315 / 327 / 353). Producers
// never wait for reducers, so the reducers need not be resident with them.
inline constexpr int kDirectProducers = 128;
inline constexpr int kDirectReducersPct = 100;

// ---- two-shot (allReduce) ---------------------------------------------------------------------
// 16-byte loads in flight per thread over all sources (vectors per source: this / the world
// rounded up to 2, 4 or 8, at least 1).
inline constexpr int kTwoShotLoads = 8;
// CTAs: about this many bytes of this rank's slice per CTA, between 1 and kTwoShotMaxCtas. On 2
// GPUs 32 CTAs were within 3 % of the best of 8-128 from 512 KiB to 32 MiB; 8 KiB per CTA
// below (16 at 256 KiB: 10.3 us, 8: 11.2, 32: 10.5).
// (CollectiveArgs::num_ctas overrides, up to kCommMaxPipeCtas: one flag per CTA and source; the
// launch refuses more CTAs than SMs: a CTA's handshakes need the peers' same CTA resident).
inline constexpr int64_t kTwoShotBytesPerCta = 8 << 10;
inline constexpr int kTwoShotMaxCtas = 32;

// ---- kAuto (select.cu) -------------------------------------------------------------------------
// allReduce in place from this size: the direct variant (only stores cross NVLink), with the
// default chunk. It moved 341 / 358 / 365 GB/s at 64 MiB / 256 MiB / 1 GiB on 2 GPUs against
// two-phase's 300 / 317 / 329 and NCCL's 267 / 297 / 327; 325 / 339 / 340 on 4 GPUs against
// two-phase's 292 / 317 / 327 and NCCL's 311 / 338 / 355. On 2 GPUs also below: 0.036 / 0.064 /
// 0.077 / 0.105 ms at 6.9 / 16 / 22 / 32 MB against two-phase's 0.051 / 0.078 / 0.142 / 0.173
// (and NCCL's 0.051 / 0.075 / 0.095 / 0.131); smaller sizes not measured. W >= 3: measured from
// 64 MiB only. 0: never.
inline constexpr int64_t kAutoDirectMinBytesW2 = int64_t{13} << 19;  // 6.5 MiB
inline constexpr int64_t kAutoDirectMinBytes = int64_t{64} << 20;    // W >= 3
// allReduce at W = 2 above the one-shot limit and up to these sizes: two-shot, in place (it
// precedes direct) and out of place (then it copies the peers' sums from scratch). On 2 GPUs
// it took 9.7 / 13.0 / 19.7 / 32.4 / 57.1 us in place at 1 / 2 / 4 / 8 / 16 MiB against
// two-phase's 18.2 / 22.4 / 29.2 / 41.0 / 67.0 and direct's 20.6 / 21.6 / 27.6 / 39.3 / 64.1;
// at 32 MiB 106.6 against direct's 107.9 (a tie: direct keeps it). Out of place 12.0 / 16.1 /
// 23.3 / 38.9 / 70.2: the last above two-phase.
inline constexpr int64_t kAutoTwoShotMaxBytesW2 = int64_t{16} << 20;
inline constexpr int64_t kAutoTwoShotMaxOutOfPlaceBytesW2 = int64_t{8} << 20;
// allReduce at W = 2 from this size: the push variant with these chunks (2-3 % more bus
// bandwidth than two-phase at 256 MiB and 1 GiB; two-phase led at 64 MiB, and at W = 4 at every
// size).
inline constexpr int64_t kAutoPushMinBytes = int64_t{256} << 20;
inline constexpr int64_t kAutoPushChunkBytes = int64_t{128} << 10;

}  // namespace fusedcomm::kernels::tuning
