// Thin wrappers over the sm_90 PTX the GEMM engine uses: mbarriers, TMA tensor loads, wgmma
// fences and shared-memory descriptors, system-scope flag accesses, %globaltimer.
// Device-only; include from .cu files compiled for sm_90a.
#pragma once

#include <cuda.h>  // CUtensorMap (type only; libcuda is not linked)
#include <cuda_bf16.h>

#include <cstdint>

namespace fusedcomm::kernels::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier -------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
// Makes the inits visible to the async proxy (TMA) and to the other threads after a barrier.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// The spin on mbarrier.try_wait.parity (operands: %0 the barrier's shared::cta address, %1 the
// parity); `sem` is the try_wait's semantics qualifier ("" = acquire at CTA scope).
#define FC_MBAR_WAIT_ASM(sem)          \
  "{\n"                                \
  ".reg .pred done;\n"                 \
  "WAIT_%=:\n"                         \
  "mbarrier.try_wait.parity" sem       \
  ".shared::cta.b64 done, [%0], %1;\n" \
  "@!done bra WAIT_%=;\n"              \
  "}\n"

// Blocks until the phase with the given parity has completed (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(FC_MBAR_WAIT_ASM("")::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

// Whether the phase with the given parity has completed, without waiting (acquire, CTA scope,
// when it has).
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// ---- clusters (CTA pairs that share operand tiles) -------------------------------------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of the variable at shared::cta address `addr` in CTA `rank`.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// Arrival on an mbarrier of another CTA of the cluster (address from mapa_shared), releasing
// this thread's prior accesses at cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
// Arrival on another CTA's mbarrier with the default semantics (release at CTA scope: no
// cluster-scope fence, which stalled the consumer warps for half their cycles as a per-slice
// release). Enough where the arrival only says "this CTA no longer reads a buffer that the
// partner's TMA will overwrite" and the reads are complete (wgmma_wait) before it.
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}
// mbar_wait with cluster-scope acquire: for barriers that other CTAs of the cluster arrive on.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(FC_MBAR_WAIT_ASM(".acquire.cluster")::"r"(smem_u32(bar)), "r"(parity) : "memory");
}
// Every thread of every CTA of the cluster (not .aligned: threads arrive from different
// branches); release/acquire at cluster scope.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// ---- TMA ------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// 2-D tile load: box at (c0 = inner coordinate, c1 = outer) into smem, completing on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                            int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// tma_load_2d into the same CTA-relative offset of every CTA in `cta_mask` (cluster ranks),
// completing `bytes` on the mbarrier at bar's offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                      int32_t c0, int32_t c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// 2-D tile store from shared memory (bulk group); out-of-bounds parts of the box are clipped.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int32_t c0,
                                             int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}
// As tma_store_2d, but the box is added into global memory (element type from the map; the
// adds are atomic per element, in no defined order between different bulk operations).
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, const void* src, int32_t c0,
                                                  int32_t c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until the committed bulk stores have finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Waits until at most the kKeep most recently committed bulk groups have not finished reading
// shared memory.
template <int kKeep>
__device__ __forceinline__ void bulk_wait_read_keep() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kKeep) : "memory");
}
// Waits until the committed bulk stores are complete.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Waits until at most the kKeep most recently committed bulk groups are incomplete (every older
// group's stores are complete).
template <int kKeep>
__device__ __forceinline__ void bulk_wait_keep() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kKeep) : "memory");
}
// Per-thread asynchronous copies, global → shared, 16 bytes through L2 only (cp.async.cg:
// other SMs wrote the source). A thread sees its own copies' data after a wait that covers
// their group; no other thread is ordered by it.
__device__ __forceinline__ void cp_async_cg16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most the kKeep most recently committed groups are incomplete.
template <int kKeep>
__device__ __forceinline__ void cp_async_wait_keep() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kKeep) : "memory");
}
__device__ __forceinline__ float4 lds_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
// Orders this thread's generic shared-memory writes before later async-proxy reads (TMA store).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ __nv_bfloat162 ld_shared_bf16x2(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return *reinterpret_cast<__nv_bfloat162*>(&v);
}

// ---- wgmma ----------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma fences.
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor with 128-byte swizzle (PTX ISA "matrix descriptor"):
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle mode (1 = 128B). The tile base must be 1024-byte aligned.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= 1ull << 62;
  return d;
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- launch order (programmatic dependent launch, early_launch.h) ---------------------------
// A kernel launched with programmatic stream serialization may be scheduled while the stream's
// previous kernel still runs. pdl_wait blocks until every kernel it may overlap has completed
// and its memory operations are visible to this grid: the same guarantee as the kernel boundary
// it replaces. A kernel launched without the attribute passes it at once.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the stream's next kernel, if launched early, be scheduled once every CTA of this grid has
// executed this (or exited). Only the scheduling moves: that kernel still runs pdl_wait before
// its first global access, so nothing of this grid's memory becomes visible sooner.
__device__ __forceinline__ void pdl_release_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- flags and time -------------------------------------------------------------------------
// 64-bit flag loads and stores with a memory-order qualifier ("acquire.sys", ...).
#define FC_FLAG_LOAD(name, qual)                                                    \
  __device__ __forceinline__ uint64_t name(const uint64_t* p) {                     \
    uint64_t v;                                                                     \
    asm volatile("ld." qual ".global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); \
    return v;                                                                       \
  }
#define FC_FLAG_STORE(name, qual)                                                 \
  __device__ __forceinline__ void name(uint64_t* p, uint64_t v) {                 \
    asm volatile("st." qual ".global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); \
  }
FC_FLAG_LOAD(ld_acquire_sys, "acquire.sys")
FC_FLAG_STORE(st_release_sys, "release.sys")
// Relaxed at system scope: single-copy atomic, no ordering (launch signatures, CommFlags::launch).
FC_FLAG_LOAD(ld_relaxed_sys, "relaxed.sys")
FC_FLAG_STORE(st_relaxed_sys, "relaxed.sys")
// GPU scope, for flags that a CTA of this GPU writes and another reads (polls of these are
// much cheaper for the rest of the GPU than .sys ones: NVLink pulls beside polling producers
// ran ~10x faster).
FC_FLAG_LOAD(ld_acquire_gpu, "acquire.gpu")
FC_FLAG_STORE(st_release_gpu, "release.gpu")
#undef FC_FLAG_LOAD
#undef FC_FLAG_STORE
// Release / acquire fence at GPU scope: with a relaxed atomic after (before) it, a release
// (acquire) pattern; cheaper than __threadfence() (fence.sc.gpu), which also orders unrelated
// locations sequentially consistently, which the counters here never need.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// The same at system scope: what a release needs before a flag that a peer GPU acquires.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ uint32_t ld_volatile_u32(const volatile uint32_t* p) { return *p; }
// 16 bytes that another agent may have rewritten (e.g. mapped host memory a NIC or proxy writes
// into): every load goes to memory.
__device__ __forceinline__ uint4 ld_volatile_v4(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// ld.global.cg (L2 only) with a 256-byte L2 prefetch size: a miss also brings the next
// 128-byte line, for walks over consecutive lines.
__device__ __forceinline__ float2 ld_cg_l2_256(const float2* p) {
  float2 v;
  asm volatile("ld.global.cg.L2::256B.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ __nv_bfloat162 ld_cg_l2_256(const __nv_bfloat162* p) {
  __nv_bfloat162 v;
  asm volatile("ld.global.cg.L2::256B.b32 %0, [%1];" : "=r"(*reinterpret_cast<uint32_t*>(&v)) : "l"(p));
  return v;
}
// Orders this thread's generic-proxy accesses (e.g. a flag acquire) before its later
// async-proxy global accesses (TMA loads).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace fusedcomm::kernels::detail
