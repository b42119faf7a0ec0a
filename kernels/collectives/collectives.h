// GPU-driven collectives among processes of one host over NVLink (CUDA IPC peer mappings):
// allGather, reduceScatter, allReduce, allToAll, each ONE launch of a persistent kernel on the
// caller's stream, moving data with SM loads/stores (no copy engine, no NCCL, no NVSHMEM).
//
// The communicator state a kernel needs is a `CommDevice` (trivially copyable, passed by value):
// one symmetric region per rank, every region mapped in every process (the host object that
// builds it is executor-native's SymmetricMemory). Region layout, identical on every rank:
//
//   offset                         size                          what
//   0                              sizeof(CommFlags) (<=16 KiB)   flags, written by PEERS (below)
//   kCommControlOffset (16 KiB)    sizeof(CommControl)            local launch control (this rank)
//   kFusedFlagsOffset (32 KiB)     sizeof(FusedFlags)             the fused ops' flags (fused.h)
//   staging_offset (1 MiB)         2 * world * slot_bytes         one-shot receive slots
//                                                                 [parity][source rank]
//   data_offset                    data_bytes                     the callers' inputs (in_offset)
//   scratch_offset                 data_bytes                     allReduce reduced slices
//   (data_offset and scratch_offset are 4 KiB aligned; region_bytes = scratch_offset + data_bytes)
//
// Contract of every op
// - All ranks launch the same sequence of ops with the same (op, dtype, count, in_offset, algo)
//   on one stream each; launches on one CommDevice never overlap (one stream per rank).
// - Input: `count`-derived elements at byte offset `in_offset` of the data area, same offset on
//   every rank (the producer writes them there); for one-shot launches, anywhere
//   (CollectiveArgs::input). Output: any device pointer of this process
//   (need not be symmetric); it must not overlap the symmetric region's data read by peers.
//   The input is left unchanged (except in place: an allReduce whose output is its input's
//   place in the data area). When the launch returns on the stream (stream order), this
//   rank's peers have finished reading its input: it may be overwritten right away.
// - Sizes, with W = world, r = rank, and the uneven-split rule of executor-native's split.h
//   (n items over W ranks: rank r gets n/W + (r < n%W), starting at r*(n/W) + min(r, n%W)):
//     allGather(count):     input split_count(count,W,r) elements; output count elements, rank
//                           p's block at split_offset(count,W,p).
//     reduceScatter(count): input count elements; output the split_count(count,W,r) elements of
//                           block r of the element-wise sum.
//     allReduce(count):     input and output count elements (sum).
//     allToAll(count):      input count elements in W blocks (split rule); block p goes to rank
//                           p. Output W blocks of split_count(count,W,r) elements, block p (from
//                           rank p) at p * split_count(count,W,r).
//   count >= 0 (0: no data, the launch still synchronises). Any alignment: 16-byte vector
//   accesses where the pointers allow, element accesses elsewhere.
// - Reductions sum in fp32 (bf16 inputs are widened) in rank order 0..W-1, then round once, so
//   allReduce gives bitwise-identical outputs on every rank.
// - Algorithms, chosen by size (CommAlgo::kAuto) or forced for tests:
//   one-shot (small): each rank PUSHES its data into every peer's staging slot [parity][r]
//     (parity = epoch & 1) with 16-byte stores, then a release flag per (source, CTA); each
//     receiving CTA waits for the flags of its part and reduces/copies from local staging.
//     One synchronisation per launch, no end barrier. Needs the per-slot payload <= slot_bytes.
//   two-phase (large, bandwidth-optimal): start barrier (every rank's input is ready), then each
//     rank PULLS what it needs from peers' data areas with 16-byte loads: allGather copies every
//     peer's block, reduceScatter reduces its block over all peers, allToAll reads its block
//     from every peer, allReduce = reduceScatter into its own scratch (+ output) then a grid
//     barrier and an allGather of the peers' scratch slices. End barrier: every peer has
//     finished reading this rank's memory before any rank's launch completes.
//   Chunk-pipelined variants (kAuto picks the push allReduce at W = 2 from 256 MiB, with
//     128 KiB chunks; otherwise forced only). CTAs [0, P) are
//     producers, [P, P + C) consumers; producer c handles chunks k = c + j*P in round j and,
//     after each round, releases CommFlags::pipe[rank][c] in every peer (a per-chunk flag, no
//     grid barrier); consumers wait for those flags. P, C and the chunk depend only on (op,
//     dtype, count, world, num_ctas, chunk_bytes), never on the rank or the GPU, so every rank
//     derives the same plan. Producers never wait on consumers, so progress needs no
//     co-residency (all P + C CTAs are resident with the defaults anyway).
//   two-phase push (kTwoPhasePush): start barrier, then
//     allReduce: producers pull-reduce chunk k of this rank's slice from every rank's data
//       area (as two-phase), store it to the output and PUSH it (16-byte remote stores) into
//       every peer's scratch at the slice position; consumers copy the peers' chunks from local
//       scratch to the output as their flags arrive. No grid barrier, no end barrier: a
//       consumer's last flag from peer p also says p finished reading this rank's input.
//     allGather: producers push this rank's block into every peer's scratch (output layout)
//       and copy it to the output; consumers copy the peers' blocks scratch -> output.
//       Needs count * elem_size <= data_bytes (the scratch holds the gathered tensor).
//     reduceScatter / allToAll: producers push block p of the input into peer p's scratch slot
//       [(r - p - 1) mod W] (slots round_up(split_count(count,W,0), 16 B) + 16 B apart; a
//       block starts as many bytes into its slot as it sits off the 16-byte grid in the input);
//       consumers reduce (rank order, own block read in place) or copy them to the output.
//       Needs (W-1) * slot elements * elem_size <= data_bytes.
//     Push: every rank reads only its own data area except in allReduce's phase 1. Every
//     push / pipelined launch waits for each peer's arrive flag of that launch, so the
//     one-shot slot-reuse argument (CommFlags::ready) holds across mixed algorithms.
//   direct (kDirect, allReduce IN PLACE only: output == this rank's data area at in_offset,
//     on every rank; cudaErrorInvalidValue otherwise): start barrier; producers push block p
//     of the input into peer p's scratch slot (as the push reduceScatter); consumers reduce
//     this rank's block chunk by chunk from its own input and the slots (rank order, fp32,
//     rounded once) and store the sums into EVERY rank's data area at the block's place (its
//     own included), so only stores cross NVLink (NVLink reads top out ~8 % below stores on
//     H200: docs/performance.md). End barrier (CommFlags::done): a peer's done flag follows
//     all its stores into this rank's data area. Overwriting peer p's input block r is safe:
//     p pushed that chunk to this rank (its chunk flag) before this rank's consumer could
//     reduce it. Needs (W-1) * slot elements * elem_size <= data_bytes. kAuto takes it for a
//     large in-place allReduce where measured faster (collective_choose_algo); in-placeness is
//     a local fact, so it must agree across ranks (a rank that differs gets the launch-mismatch
//     error naming both launches).
//   two-shot (kTwoShot, allReduce; other ops run two-phase): no grid barrier. CTA c of every
//     rank meets CTA c of every peer (start handshake: CommFlags::pipe[p][c] tag round 1), reduces
//     its share of this rank's slice from every rank's data area (rank order, fp32, rounded
//     once) and stores the sums into every rank: in place into their data areas at the slice's
//     place, else into their scratch (at in_offset + the slice's offset); then an end
//     handshake (tag round 2: the CTA's stores and reads are complete), after which (out of
//     place) the CTA copies from its own scratch to the output the shares that the peers'
//     same CTA stored there. The grid (CollectiveArgs::num_ctas, or from the size; at most
//     kCommMaxPipeCtas and the SM count) depends only on rank-uniform values.
//   pipelined (kPipelined, allReduce; other ops run two-phase): start barrier; producers
//     reduce chunks into output + OWN scratch and release the chunk flag; consumers PULL the
//     peers' chunks from their scratch as the flags arrive (the two phases overlap chunk by
//     chunk, no grid barrier); end barrier as two-phase (peers read this rank's scratch).
// - Protocol (docs/architecture.md): each launch gets a 64-bit epoch = this rank's launch count on the
//   CommDevice, kept on the device (CommControl::epoch: read by every CTA at start, bumped by
//   the last CTA to finish), so back-to-back launches and CUDA-graph replay get fresh epochs
//   without host involvement, and every rank computes the same epoch for the same launch.
//   Flags are compared `>= epoch` and never reset. The ordering argument for each flag is
//   written beside CommFlags below and in detail/comm_protocol.cuh.
// - Every wait is bounded (comm_protocol.cuh): spin with backoff, re-read the error claim every
//   16 polls and the host-mapped abort word and the clock every 20 us of waiting, give up after timeout_ns (0: the GEMM's
//   kDefaultWaitTimeoutNs). The first CTA to give up records rank, peer, op, step, epoch and
//   the observed value in *error (host-mapped); every other waiting CTA of this rank stops too.
//   The kernel then exits normally (no trap): the stream stays usable, the outputs are
//   incomplete, and this CommDevice's flags are inconsistent: the host must discard it and
//   build a fresh symmetric memory (SymmetricMemory::raise_if_failed throws kTimeout).
// - Launch signatures: a launch whose op, dtype, size or algorithm differs from a peer's launch
//   of the same epoch is reported, naming both launches, instead of moving the wrong bytes or
//   hanging until the timeout. Each launch carries a 64-bit signature (comm_launch_signature:
//   op, dtype, resolved algorithm, count; fused ops: a hash of their rank-uniform sizes),
//   which one thread stores into every peer's CommFlags::launch slot before that thread's
//   first release of the launch (ordering beside CommFlags::launch). Checks: (1) the CTA that
//   observes a peer's first flag of the launch compares the peer's slot with its own signature
//   (one local load per peer); (2) a wait that has not succeeded compares the awaited peer's
//   slot at each slow check (every 20 us), so a peer stuck in a different op's protocol is
//   named within microseconds, not after the timeout. A mismatch records kCommLaunchMismatch
//   (the peer's signature in CommErrorRecord::observed, this launch's in ::launch_sig); the
//   host throws Error(kCommunicator) describing both launches.
// - The launch is asynchronous; the return value reports argument and launch errors only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/gemm.h"  // kDefaultWaitTimeoutNs, GemmErrorCode (shared codes)

namespace fusedcomm::kernels {

inline constexpr int kCommMaxRanks = 8;
inline constexpr int kCommMaxOneShotCtas = 64;  // one-shot grid cap (flags per source)
inline constexpr uint64_t kCommControlOffset = 16 << 10;
inline constexpr uint64_t kCommStagingOffset = 1 << 20;

enum class CommOp : uint32_t { kAllGather = 1, kReduceScatter = 2, kAllReduce = 3, kAllToAll = 4 };
enum class CommDtype : uint32_t { kF32 = 0, kBF16 = 1 };
// kTwoPhasePush, kPipelined and kDirect: the chunk-pipelined variants above (kAuto: the push allReduce
// at W = 2 from 256 MiB; the rest are measurement candidates). kTwoShot: the two-shot allReduce
// above (kAuto: W = 2, medium sizes).
enum class CommAlgo : uint32_t {
  kAuto = 0,
  kOneShot = 1,
  kTwoPhase = 2,
  kTwoPhasePush = 3,
  kPipelined = 4,
  kDirect = 5,
  kTwoShot = 6,
};

// Chunk-pipelined variants: at most kCommMaxPipeCtas producer CTAs (one flag each per source
// rank), and a chunk flag holds (epoch << kCommPipeRoundBits) | rounds_done, so a producer does
// at most kCommPipeMaxRounds rounds per launch (the launcher grows the chunk to stay below);
// tags stay monotone for 2^44 launches per CommDevice.
inline constexpr int kCommMaxPipeCtas = 128;
inline constexpr int kCommPipeRoundBits = 20;
inline constexpr int64_t kCommPipeMaxRounds = (int64_t{1} << kCommPipeRoundBits) - 2;

// Where a wait gave up (CommErrorRecord::step).
enum CommStep : uint32_t {
  kCommStepArrive = 1,  // two-phase start barrier: peer's input not ready
  kCommStepReady = 2,   // one-shot: peer's pushed data not arrived
  kCommStepPhase = 3,   // two-phase allReduce: peer's reduced slice not ready
  kCommStepDone = 4,    // two-phase end barrier: peer still reading our memory
  kCommStepChunk = 5,   // pipelined variants: peer's chunk flag (CommErrorRecord::epoch holds
                        // the awaited (epoch << kCommPipeRoundBits) | round)
};

// CommErrorRecord::code beyond GemmErrorCode (kGemmWaitTimeout, kGemmAborted): a peer's launch
// of this epoch has a different signature (see "Launch signatures" above).
inline constexpr uint32_t kCommLaunchMismatch = 3;
// The awaited peer had given up first (its error claim, read by the collectives' waits; its code
// in CommErrorRecord::observed). A rank that gave up publishes nothing more: its collectives
// return at entry, so its peers name it here instead of moving stale bytes.
inline constexpr uint32_t kCommPeerFailed = 4;
// This rank's step between hosts failed (launch_comm_fail_if after the proxy's collective; the
// link's own error names the remote rank).
inline constexpr uint32_t kCommHostsFailed = 5;

// ---- launch signatures ----------------------------------------------------------------------
// 64 bits: [63:56] epoch & 0xFF (which launch; set on the device), [55:53] zero, [52:50] the
// resolved algorithm (CommAlgo, or FusedAlgo for the fused ops), [49:48] dtype (CommDtype),
// [47:43] op (CommOp 1-4, fused.h's kFusedOp* 16-18, kernels/moe/moe.h's kMoeOp* 19-21,
// kernels/attention/ring.h's kRingOp 22), [42:0] size: the element count for the
// collectives (counts are < 2^43 since they fit a data area), a hash of the rank-uniform sizes
// for the fused ops. Two launches match iff their signatures are equal.
// The algorithm field of an in-place two-shot allReduce (it stores into the peers' data areas,
// an out-of-place one into their scratch: ranks that differ must not pass for one launch).
inline constexpr uint32_t kSigAlgoTwoShotInPlace = 7;
inline constexpr int kSigSizeBits = 43;
inline constexpr uint64_t kSigSizeMask = (uint64_t{1} << kSigSizeBits) - 1;
inline constexpr uint64_t kSigBodyMask = (uint64_t{1} << 56) - 1;  // everything but the epoch

__host__ __device__ constexpr uint64_t comm_launch_signature(uint32_t op, uint32_t dtype, uint32_t algo,
                                                             uint64_t size) {
  return (uint64_t{algo & 7u} << 50) | (uint64_t{dtype & 3u} << 48) | (uint64_t{op & 31u} << 43) |
         (size & kSigSizeMask);
}
__host__ __device__ constexpr uint64_t comm_signature_at(uint64_t body, uint64_t epoch) {
  return (body & kSigBodyMask) | ((epoch & 0xFF) << 56);
}
__host__ __device__ constexpr uint32_t comm_sig_epoch8(uint64_t sig) { return uint32_t(sig >> 56); }
__host__ __device__ constexpr uint32_t comm_sig_algo(uint64_t sig) { return uint32_t(sig >> 50) & 7u; }
__host__ __device__ constexpr uint32_t comm_sig_dtype(uint64_t sig) { return uint32_t(sig >> 48) & 3u; }
__host__ __device__ constexpr uint32_t comm_sig_op(uint64_t sig) { return uint32_t(sig >> 43) & 31u; }
__host__ __device__ constexpr uint64_t comm_sig_size(uint64_t sig) { return sig & kSigSizeMask; }
// A 43-bit hash of sizes that must agree across ranks (the fused ops' M, K or N, offsets).
__host__ __device__ constexpr uint64_t comm_sig_hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  const uint64_t v[3] = {a, b, c};
  for (uint64_t x : v) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
  }
  return (h ^ (h >> 29)) & kSigSizeMask;
}

// Flags of one rank's region. Written ONLY by peers (and by this rank for itself where noted),
// read by this rank with ld.acquire.sys. Values are epochs; `>= epoch` means "done for this
// launch"; monotone, never reset (a fresh region is zeroed once at allocation).
struct alignas(64) CommFlags {
  // arrive[p] = e: rank p has started launch e, so (stream order) its input for e is written
  // and its launch e-1 has finished reading everything it read. Writer: p's CTA 0 thread 0,
  // fence.sc.sys then st.release.sys; reader: acquire.sys, then bar.sync to the CTA.
  uint64_t arrive[kCommMaxRanks];
  // phase[p] = e: rank p's reduced slice of launch e is in p's scratch (allReduce two-phase).
  // Writer: the last of p's CTAs to finish phase 1; every CTA did bar.sync then (thread 0)
  // fence.sc.sys before its atomicAdd on CommControl::phase_count, so (fence-fence through the
  // counter) all their stores precede the last CTA's st.release.sys of the flag.
  uint64_t phase[kCommMaxRanks];
  // done[p] = e: rank p has finished every read of this rank's memory for launch e. Writer:
  // the last of p's CTAs, same counter pattern (exit_count); loads that fed stores are
  // complete before the fence. Only then may this rank's launch e finish.
  uint64_t done[kCommMaxRanks];
  // ready[p][c] = e: rank p's CTA c has pushed its part of launch e into this rank's staging
  // slot [e & 1][p]. Writer: p's CTA c stores, bar.sync, then thread 0 fence.acq_rel.sys and
  // st.relaxed.sys (a release pattern, cumulative over the CTA's stores, ordered before it by
  // the barrier). Reuse of slot parity e&1 at e+2 is safe: rank p
  // reaches launch e+2 only after its launch e+1 completed, which waited for a flag that this
  // rank wrote in ITS launch e+1, i.e. after this rank's launch e (and its reads) finished.
  uint64_t ready[kCommMaxRanks][kCommMaxOneShotCtas];
  // pipe[p][c] = (e << kCommPipeRoundBits) | (j + 1): producer CTA c of rank p has finished its
  // rounds 0..j of launch e (kTwoPhasePush, kPipelined): its chunks' stores into this rank's
  // scratch (push) or into p's own scratch (pipelined) are done, and so are its loads from
  // every rank's data area for those chunks. Writer: p's CTA c, all data threads store,
  // bar.sync, then thread 0 fence.sc.sys and st.release.sys (the publish pattern of
  // comm_protocol.cuh; one writer per flag, rounds in program order, so the value only grows).
  // Reader: a lane of the consumer CTA's control warp ld.acquire.sys until >= the awaited tag,
  // then bar.sync, then the data threads read. Monotone across launches because j + 1 <
  // 2^kCommPipeRoundBits (launcher) and epochs grow: any tag of launch e exceeds every tag of
  // e - 1. Scratch reuse: a producer writes a peer's scratch in launch e only after that peer's
  // arrive >= e, i.e. after the peer's launch e - 1 (which read it) completed.
  // Two-shot (kTwoShot) uses the same flags, tags rounds 1 and 2: pipe[p][c] >= (e << 20) | 1:
  // p's CTA c has started launch e (st.relaxed.sys, no fence: p's kernel has started, so its
  // input is complete and its launch e - 1 has finished with this rank's memory, every access
  // of which preceded that launch's round-2 release); >= (e << 20) | 2: p's CTA c has stored
  // all its sums of launch e into this rank and finished reading it (bar.sync, fence.acq_rel.sys,
  // st.relaxed.sys). Reader: thread 0 of this rank's CTA c, ld.acquire.sys, then bar.sync.
  uint64_t pipe[kCommMaxRanks][kCommMaxPipeCtas];
  // launch[p][e & 1] = comm_signature_at(p's signature, e): what rank p launched as its launch
  // e. Writer: the one thread of p's launch e that does its first release (CTA 0 thread 0 of a
  // collective, before arrive / ready / its two-shot start flag, whose end flag is the release
  // its peers check the slot after; of allGatherGemm, the first communication CTA's, before
  // arrive; of gemmReduceScatter, CTA 0 thread 0 in rs_start, before arrive), with st.relaxed.sys
  // (single-copy atomic: the slow check may read it at any time). Ordering: program order puts
  // it before that thread's fence.sc.sys and release, so whoever acquires that flag (>= e)
  // observes it; since p cannot start launch e + 2 before this rank has started launch e + 1
  // (the one-shot slot-reuse argument), slot e & 1 then holds exactly launch e's signature.
  // Unordered reads (the slow check) see e's value, an older one (epoch byte differs: no
  // verdict) or nothing new; never a newer launch's, for the same reason.
  uint64_t launch[kCommMaxRanks][2];
  // ring[p] = (e << kCommPipeRoundBits) | j: in the GPU ring attention of launch e, rank p
  // holds the K/V block of its ring step j - 1 in its buffer (j - 1) & 1, and (j >= 2) has
  // finished reading the buffer of its predecessor that it pulled that block from. Writer: p's
  // one-thread sync kernel (kernels/attention/ring.h), stream-ordered after the copy,
  // fence.sc.sys then st.release.sys into its neighbours' regions (j = 1: every peer's);
  // reader: this rank's sync kernel, ld.acquire.sys, before its next copy is enqueued behind
  // it. Monotone as pipe[]. The ring backward (op kRingBwdOp) uses the same flags with its own
  // tags (ring.h: K/V block held, dK/dV partial added, own partial read back).
  uint64_t ring[kCommMaxRanks];
};
static_assert(sizeof(CommFlags) == 8 * (3 * kCommMaxRanks + kCommMaxRanks * kCommMaxOneShotCtas +
                                        kCommMaxRanks * kCommMaxPipeCtas + 2 * kCommMaxRanks + kCommMaxRanks),
              "CommFlags layout is shared between ranks");
static_assert(sizeof(CommFlags) <= kCommControlOffset, "flags overlap the control block");

// Local launch control (this rank only; device memory, zeroed at allocation).
struct alignas(64) CommControl {
  uint64_t epoch;        // last completed launch's epoch; launch e reads e-1 here
  uint32_t exit_count;   // CTAs of the current launch that finished (last one bumps epoch)
  uint32_t phase_count;  // CTAs that finished allReduce phase 1
  uint32_t error_claim;  // 0, or the GemmErrorCode of the first CTA that gave up (device-local
                         // atomicCAS: no atomics on host memory are needed)
  uint32_t reserved[11];
};
static_assert(sizeof(CommControl) == 64, "CommControl layout");

// Host-visible error record (host-mapped pinned memory). Zeroed by the host; the first CTA
// that gives up fills it (fields first, then code, then a system fence).
struct alignas(16) CommErrorRecord {
  uint32_t code;        // kGemmWaitTimeout, kGemmAborted, kCommLaunchMismatch, kCommPeerFailed or
                        // kCommHostsFailed; 0: no error
  uint32_t rank;        // this rank
  uint32_t peer;        // the rank whose flag was awaited (mismatch: whose launch differs)
  uint32_t op;          // CommOp (or fused.h's kFusedOp*)
  uint32_t step;        // CommStep (or fused.h's kFusedStep*)
  uint32_t cta;         // blockIdx.x of the waiting CTA
  uint64_t epoch;       // the awaited value (mismatch: the launch's epoch)
  uint64_t observed;    // last value read from the flag (mismatch: the peer's signature)
  uint64_t elapsed_ns;  // %globaltimer time spent waiting
  uint64_t launch_sig;  // this launch's signature (with its epoch byte)
  uint64_t reserved;
};
static_assert(sizeof(CommErrorRecord) == 64, "CommErrorRecord layout is shared with the host");

// The device handle: everything a collective kernel needs, by value (trivially copyable).
struct CommDevice {
  uint8_t* base[kCommMaxRanks];  // every rank's region as mapped in THIS process (own included)
  uint64_t slot_bytes;           // one-shot staging slot size (multiple of 16)
  uint64_t data_offset;          // data area (callers' inputs)
  uint64_t data_bytes;
  uint64_t scratch_offset;              // allReduce scratch, data_bytes long
  uint64_t timeout_ns;                  // every wait; 0: kDefaultWaitTimeoutNs
  const volatile uint32_t* abort_word;  // host-mapped; non-zero stops every wait (may be null)
  CommErrorRecord* error;               // host-mapped; required
  int32_t rank;
  int32_t world;  // 1..kCommMaxRanks
  int32_t sm_count;
  int32_t reserved;
  // This launch's signature without its epoch byte (comm_launch_signature). The launchers set
  // it in the copy they pass to the kernel; callers leave it 0. (A fused op's decomposed path
  // sets it so that its collective carries the fused op's signature: launch_collective keeps a
  // non-zero value.)
  uint64_t launch_sig;
};
static_assert(sizeof(CommDevice) == 8 * kCommMaxRanks + 8 * 8 + 16, "device-handle layout");

struct CollectiveArgs {
  CommOp op = CommOp::kAllReduce;
  CommDtype dtype = CommDtype::kBF16;
  int64_t count = 0;       // see the size rules above
  uint64_t in_offset = 0;  // byte offset of the input in the data area (same on every rank)
  void* output = nullptr;  // this process's device memory
  CommAlgo algo = CommAlgo::kAuto;
  int num_ctas = 0;         // 0: from the size and the SM count. kTwoPhasePush / kPipelined / kDirect:
                            // producer CTAs (consumers derived), at most kCommMaxPipeCtas
  int64_t chunk_bytes = 0;  // kTwoPhasePush / kPipelined / kDirect: target bytes per producer chunk
                            // (0: about 64 KiB); same value on every rank. Ignored otherwise.
  // reduceScatter of fp32 input only (one-shot or two-phase, e.g. kAuto): write the output in
  // bf16, each fp32 sum rounded once (what the fused ops' decomposed gemmReduceScatter needs;
  // saves a conversion pass). `output` then holds bf16 elements. A local choice: ranks may
  // differ. cudaErrorInvalidValue with another op, dtype or algorithm.
  bool out_bf16 = false;
  // One-shot only (kOneShot, or kAuto where collective_choose_algo picks it): this rank's input
  // is read here, device memory of this process, instead of at in_offset of the data area. A
  // one-shot launch pushes its input into the peers' staging slots and reads it locally; no
  // peer reads a data area. So a caller whose input lies elsewhere can skip copying it in. It
  // must not overlap `output`. A local choice (ranks may differ); in_offset is then unused.
  // cudaErrorInvalidValue with another algorithm.
  const void* input = nullptr;
};

// Elements of the output of `op` on rank `rank` (see the size rules).
int64_t collective_output_count(CommOp op, int64_t count, int world, int rank);
// Elements of the input of `op` on rank `rank`.
int64_t collective_input_count(CommOp op, int64_t count, int world, int rank);
// The algorithm kAuto picks (kOneShot, kTwoPhase, kTwoShot for a medium allReduce at W = 2,
// kDirect for a large in-place allReduce where enabled, or kTwoPhasePush for a large allReduce
// at W = 2) for these arguments, from rank-uniform values (and in-placeness, which callers keep
// the same on every rank) only; a forced algorithm is returned as is.
CommAlgo collective_choose_algo(const CommDevice& dev, const CollectiveArgs& args);

// Enqueues one collective on `stream` (see the contract above). cudaErrorInvalidValue for bad
// arguments (world, sizes outside the data area, a forced one-shot whose payload exceeds a slot,
// a forced kTwoPhasePush whose scratch need exceeds data_bytes, an `input` outside one-shot).
// Launched early (detail/early_launch.h; not on the legacy default stream): the kernel may be
// scheduled while the stream's previous kernel runs, touches memory only once it has completed,
// and lets the stream's next kernel be scheduled early too.
cudaError_t launch_collective(const CommDevice& dev, const CollectiveArgs& args, cudaStream_t stream);
// One thread, stream-ordered: if *word (device-visible; e.g. the proxy's status) is non-zero,
// claims this rank's error record with `code` (observed: the word), so that the collectives
// enqueued after it publish nothing and their peers stop (kCommPeerFailed).
cudaError_t launch_comm_fail_if(const CommDevice& dev, const uint32_t* word, uint32_t code,
                                cudaStream_t stream);

inline const char* comm_op_name(uint32_t op) {
  switch (op) {
    case 1: return "allGather";
    case 2: return "reduceScatter";
    case 3: return "allReduce";
    case 4: return "allToAll";
    default: return "?";
  }
}
inline const char* comm_step_name(uint32_t step) {
  switch (step) {
    case kCommStepArrive: return "arrive (start barrier)";
    case kCommStepReady: return "ready (one-shot data)";
    case kCommStepPhase: return "phase (reduced slice)";
    case kCommStepDone: return "done (end barrier)";
    case kCommStepChunk: return "chunk (pipelined data)";
    default: return "?";
  }
}

}  // namespace fusedcomm::kernels
