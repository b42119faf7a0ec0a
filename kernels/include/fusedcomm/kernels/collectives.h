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
//   staging_offset (64 KiB)        2 * world * slot_bytes         one-shot receive slots
//                                                                 [parity][source rank]
//   data_offset                    data_bytes                     the callers' inputs (in_offset)
//   scratch_offset                 data_bytes                     allReduce reduced slices
//   (data_offset and scratch_offset are 4 KiB aligned; region_bytes = scratch_offset + data_bytes)
//
// Contract of every op
// - All ranks launch the same sequence of ops with the same (op, dtype, count, in_offset, algo)
//   on one stream each; launches on one CommDevice never overlap (one stream per rank).
// - Input: `count`-derived elements at byte offset `in_offset` of the data area, same offset on
//   every rank (the producer writes them there). Output: any device pointer of this process
//   (need not be symmetric); it must not overlap the symmetric region's data read by peers.
//   The input is left unchanged. When the launch returns on the stream (stream order), this
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
//   Chunk-pipelined variants (forced only; kAuto does not pick them yet). CTAs [0, P) are
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
//       [(r - p - 1) mod W] (slots round_up(split_count(count,W,0), 16 B) elements apart);
//       consumers reduce (rank order, own block read in place) or copy them to the output.
//       Needs (W-1) * slot elements * elem_size <= data_bytes.
//     Push: every rank reads only its own data area except in allReduce's phase 1. Every
//     push / pipelined launch waits for each peer's arrive flag of that launch, so the
//     one-shot slot-reuse argument (CommFlags::ready) holds across mixed algorithms.
//   pipelined (kPipelined, allReduce; other ops run two-phase): start barrier; producers
//     reduce chunks into output + OWN scratch and release the chunk flag; consumers PULL the
//     peers' chunks from their scratch as the flags arrive (the two phases overlap chunk by
//     chunk, no grid barrier); end barrier as two-phase (peers read this rank's scratch).
// - Protocol (DESIGN.md §3): each launch gets a 64-bit epoch = this rank's launch count on the
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
// - The launch is asynchronous; the return value reports argument and launch errors only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fusedcomm/kernels/gemm.h"  // kDefaultWaitTimeoutNs, GemmErrorCode (shared codes)

namespace fusedcomm::kernels {

inline constexpr int kCommMaxRanks = 8;
inline constexpr int kCommMaxOneShotCtas = 64;     // one-shot grid cap (flags per source)
inline constexpr uint64_t kCommControlOffset = 16 << 10;
inline constexpr uint64_t kCommStagingOffset = 64 << 10;

enum class CommOp : uint32_t { kAllGather = 1, kReduceScatter = 2, kAllReduce = 3, kAllToAll = 4 };
enum class CommDtype : uint32_t { kF32 = 0, kBF16 = 1 };
// kTwoPhasePush and kPipelined: the chunk-pipelined variants above (measurement candidates).
enum class CommAlgo : uint32_t {
  kAuto = 0,
  kOneShot = 1,
  kTwoPhase = 2,
  kTwoPhasePush = 3,
  kPipelined = 4,
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
  kCommStepArrive = 1,   // two-phase start barrier: peer's input not ready
  kCommStepReady = 2,    // one-shot: peer's pushed data not arrived
  kCommStepPhase = 3,    // two-phase allReduce: peer's reduced slice not ready
  kCommStepDone = 4,     // two-phase end barrier: peer still reading our memory
  kCommStepChunk = 5,    // pipelined variants: peer's chunk flag (CommErrorRecord::epoch holds
                         // the awaited (epoch << kCommPipeRoundBits) | round)
};

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
  // slot [e & 1][p]. Writer: p's CTA c stores, bar.sync, then thread 0 fence.sc.sys and
  // st.release.sys (cumulative over the CTA's stores, ordered before it by the barrier). Reuse of slot parity e&1 at e+2 is safe: rank p
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
  uint64_t pipe[kCommMaxRanks][kCommMaxPipeCtas];
};
static_assert(sizeof(CommFlags) == 8 * (3 * kCommMaxRanks + kCommMaxRanks * kCommMaxOneShotCtas +
                                        kCommMaxRanks * kCommMaxPipeCtas),
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
  uint32_t code;        // GemmErrorCode: kGemmWaitTimeout or kGemmAborted; 0: no error
  uint32_t rank;        // this rank
  uint32_t peer;        // the rank whose flag was awaited
  uint32_t op;          // CommOp
  uint32_t step;        // CommStep
  uint32_t cta;         // blockIdx.x of the waiting CTA
  uint64_t epoch;       // the awaited value
  uint64_t observed;    // last value read from the flag
  uint64_t elapsed_ns;  // %globaltimer time spent waiting
};
static_assert(sizeof(CommErrorRecord) == 48, "CommErrorRecord layout is shared with the host");

// The device handle: everything a collective kernel needs, by value (trivially copyable).
struct CommDevice {
  uint8_t* base[kCommMaxRanks];  // every rank's region as mapped in THIS process (own included)
  uint64_t slot_bytes;           // one-shot staging slot size (multiple of 16)
  uint64_t data_offset;          // data area (callers' inputs)
  uint64_t data_bytes;
  uint64_t scratch_offset;       // allReduce scratch, data_bytes long
  uint64_t timeout_ns;           // every wait; 0: kDefaultWaitTimeoutNs
  const volatile uint32_t* abort_word;  // host-mapped; non-zero stops every wait (may be null)
  CommErrorRecord* error;               // host-mapped; required
  int32_t rank;
  int32_t world;  // 1..kCommMaxRanks
  int32_t sm_count;
  int32_t reserved;
};
static_assert(sizeof(CommDevice) == 8 * kCommMaxRanks + 7 * 8 + 16, "device-handle layout");

struct CollectiveArgs {
  CommOp op = CommOp::kAllReduce;
  CommDtype dtype = CommDtype::kBF16;
  int64_t count = 0;       // see the size rules above
  uint64_t in_offset = 0;  // byte offset of the input in the data area (same on every rank)
  void* output = nullptr;  // this process's device memory
  CommAlgo algo = CommAlgo::kAuto;
  int num_ctas = 0;        // 0: from the size and the SM count. kTwoPhasePush / kPipelined:
                           // producer CTAs (consumers derived), at most kCommMaxPipeCtas
  int64_t chunk_bytes = 0; // kTwoPhasePush / kPipelined: target bytes per producer chunk
                           // (0: about 64 KiB); same value on every rank. Ignored otherwise.
};

// Elements of the output of `op` on rank `rank` (see the size rules).
int64_t collective_output_count(CommOp op, int64_t count, int world, int rank);
// Elements of the input of `op` on rank `rank`.
int64_t collective_input_count(CommOp op, int64_t count, int world, int rank);
// The algorithm kAuto picks (kOneShot or kTwoPhase) for these arguments; a forced algorithm
// is returned as is.
CommAlgo collective_choose_algo(const CommDevice& dev, const CollectiveArgs& args);

// Enqueues one collective on `stream` (see the contract above). cudaErrorInvalidValue for bad
// arguments (world, sizes outside the data area, a forced one-shot whose payload exceeds a slot,
// a forced kTwoPhasePush whose scratch need exceeds data_bytes).
cudaError_t launch_collective(const CommDevice& dev, const CollectiveArgs& args,
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
