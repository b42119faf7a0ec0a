/*
 * fusedcomm: the plain C API of libfusedcomm.so, in the spirit of nccl.h. The JNI layer of the
 * Spark plugin is written against it, and so is any other binding (Python, C++).
 *
 * Objects are opaque handles: a runtime per executor process (transport, GPU), communicators
 * that borrow it, and MoE dispatch results. Every function returns an fc_status_t and never
 * throws; on failure fc_last_error_message() holds the detail (thread-local). Strings and byte
 * arrays a function hands out through `const char**` / `const uint8_t**` are owned by the library
 * and stay valid until the next fusedcomm call on the same thread, unless said otherwise.
 *
 * The enums below are the one definition of their values: the C++ runtime's enums are defined
 * from them (fusedcomm/types.h), and the Java mirrors (io.fusedcomm.api: DType,
 * WeightLayout, PartialPrecision, Backend, Op) carry the same names and values, which a unit
 * test checks against this file. Values never change; new ones are appended.
 *
 * Op semantics, shapes and uneven splits: docs/ops.md. Threading: a communicator's ops are
 * called from one thread at a time; fc_comm_abort() may be called from any thread at any time.
 */
#ifndef FUSEDCOMM_FUSEDCOMM_H_
#define FUSEDCOMM_FUSEDCOMM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FC_API __attribute__((visibility("default")))
#else
#define FC_API
#endif

/* Version of this interface: bumped when a function or a struct changes. */
#define FUSEDCOMM_API_VERSION 3

/* ---- status ------------------------------------------------------------------------------- */
typedef enum {
  FC_STATUS_SUCCESS = 0,
  FC_STATUS_INVALID_ARGUMENT = 1, /* caught before any data moves */
  FC_STATUS_STATE = 2,            /* closed communicator, wrong backend for the call */
  FC_STATUS_COMMUNICATOR = 3,     /* ranks disagree, aborted, unusable after an earlier error */
  FC_STATUS_TIMEOUT = 4,          /* a bounded wait gave up; the message names rank, peer, op */
  FC_STATUS_TRANSPORT = 5,        /* a connection failed or closed */
  FC_STATUS_FATAL_GPU = 6,        /* the executor's GPU context is unusable */
  FC_STATUS_UNAVAILABLE = 7,      /* backend or op not available here; the message says why */
  FC_STATUS_OUT_OF_MEMORY = 8,    /* a host allocation failed */
  FC_STATUS_INTERNAL = 9          /* anything else */
} fc_status_t;

/* A constant name for a status ("invalid argument", ...). */
FC_API const char* fc_status_string(fc_status_t status);
/* The detail of the last failing call on this thread ("" if none); calls that succeed leave it. */
FC_API const char* fc_last_error_message(void);
FC_API fc_status_t fc_get_version(int* version); /* FUSEDCOMM_API_VERSION */

/* ---- enums ---------------------------------------------------------------------------------- */
typedef enum {
  FC_DTYPE_F32 = 0,  /* IEEE-754 binary32 */
  FC_DTYPE_BF16 = 1, /* bfloat16, round to nearest even */
  FC_DTYPE_I32 = 2   /* index tensors only (MoE routing); no op takes it as its dtype */
} fc_dtype_t;

typedef enum {
  FC_LAYOUT_NK = 0, /* C = A · Wᵀ, W: N×K (a linear layer's weight) */
  FC_LAYOUT_KN = 1  /* C = A · B, B: K×N */
} fc_weight_layout_t;

/* gemmReduceScatter's and gemmAllReduce's partial products: the precision they are kept and
 * exchanged in. The sum is fp32 either way, rounded once at the output. */
typedef enum {
  FC_PARTIALS_F32 = 0,
  FC_PARTIALS_BF16 = 1,         /* each rank's partial rounded to bf16 first */
  FC_PARTIALS_F32_ANY_ORDER = 2 /* fp32, summed in any order (cuda fused kernel at W >= 3) */
} fc_partials_t;

typedef enum {
  FC_BACKEND_AUTO = 0, /* cuda where a GPU is assigned and usable, else host (runtime config) */
  FC_BACKEND_CUDA = 1, /* the GPU kernels */
  FC_BACKEND_HOST = 2  /* the C++ reference implementation on the CPU */
} fc_backend_t;

/* The transport between executors (spark.fusedcomm.transport). */
typedef enum {
  FC_TRANSPORT_AUTO = 0,     /* libfabric where an RDMA provider (efa, verbs) answers, else socket */
  FC_TRANSPORT_SOCKET = 1,   /* TCP sockets */
  FC_TRANSPORT_LIBFABRIC = 2 /* libfabric (opened at run time), provider below */
} fc_transport_t;

/* The libfabric provider (spark.fusedcomm.libfabric.provider). */
typedef enum {
  FC_LIBFABRIC_AUTO = 0,  /* efa, else verbs, else tcp */
  FC_LIBFABRIC_EFA = 1,   /* AWS EFA */
  FC_LIBFABRIC_VERBS = 2, /* verbs;ofi_rxm: InfiniBand, RoCE */
  FC_LIBFABRIC_TCP = 3,   /* tcp;ofi_rxm: any network */
  FC_LIBFABRIC_SHM = 4    /* shared memory: ranks of one host */
} fc_libfabric_provider_t;

/* The ops of a communicator. The collectives' values are those of the kernels' CommOp. */
typedef enum {
  FC_OP_ALL_GATHER = 1,
  FC_OP_REDUCE_SCATTER = 2,
  FC_OP_ALL_REDUCE = 3,
  FC_OP_ALL_TO_ALL = 4,
  FC_OP_ALL_GATHER_GEMM = 5, /* fused GEMM + communication */
  FC_OP_GEMM_REDUCE_SCATTER = 6,
  FC_OP_GEMM_ALL_REDUCE = 7,
  FC_OP_MOE_DISPATCH_GEMM = 8,
  FC_OP_MOE_COMBINE = 9,
  FC_OP_RING_ATTENTION = 10
} fc_op_t;

/* ---- handles -------------------------------------------------------------------------------- */
typedef struct fc_runtime* fc_runtime_t;           /* one per executor process */
typedef struct fc_comm* fc_comm_t;                 /* a communicator of `world` ranks */
typedef struct fc_moe_dispatch* fc_moe_dispatch_t; /* fc_moe_dispatch_gemm's result */
/* A CUDA stream (cudaStream_t). NULL: the op runs synchronously (cuda: on the communicator's
 * own stream). The host backend takes NULL only. */
typedef struct CUstream_st* fc_stream_t;

/* Names an op call: a description for error messages and a fingerprint of its global
 * parameters (op, dtype, global shapes). The host backend sends both with every chunk, so a
 * rank whose parameters differ is named on every rank. NULL: "" and 0. */
typedef struct {
  const char* description;
  uint64_t fingerprint;
} fc_op_desc_t;

/* ---- availability, host memory -------------------------------------------------------------- */
/* One line per backend and transport: "name: available|unavailable: reason". */
FC_API fc_status_t fc_availability(const char** report);
/* Host memory for tensors (128-byte aligned, zeroed), counted in fc_memory_stats. */
FC_API fc_status_t fc_host_alloc(size_t bytes, void** out);
FC_API fc_status_t fc_host_free(void* ptr);
FC_API fc_status_t fc_memory_stats(uint64_t* live_bytes, uint64_t* live_allocations);

/* ---- device memory and streams, whoever allocated them --------------------------------------- */
/* Device addresses and CUDA streams from any CUDA user of the process (cuDF/RMM, PyTorch,
 * JCuda, fc_device_alloc) are interchangeable: every CUDA runtime in a process shares each
 * GPU's primary context. These calls let a binding check what it is handed before an op uses it. */
typedef enum {
  FC_MEMORY_UNREGISTERED = 0, /* unknown to CUDA: pageable host memory, or not memory at all */
  FC_MEMORY_HOST = 1,         /* page-locked host memory (cudaMallocHost, cudaHostRegister) */
  FC_MEMORY_DEVICE = 2,       /* GPU memory (cudaMalloc, a pool allocator's block, VMM) */
  FC_MEMORY_MANAGED = 3       /* managed memory (cudaMallocManaged) */
} fc_memory_type_t;
typedef struct {
  fc_memory_type_t type;
  int32_t device;       /* the GPU it lives on (this process's device ordinal); -1: none */
  uint64_t range_base;  /* start of the allocation holding the address; 0: unknown */
  uint64_t range_bytes; /* size of that allocation from range_base; 0: unknown */
} fc_pointer_info_t;
/* What CUDA knows of `ptr` (cudaPointerGetAttributes; the range from cuMemGetAddressRange).
 * FC_STATUS_UNAVAILABLE without a usable GPU. */
FC_API fc_status_t fc_pointer_info(const void* ptr, fc_pointer_info_t* out);
/* The GPU a live CUDA stream belongs to (cudaStreamGetDevice); -1 while the stream is capturing
 * a CUDA graph (CUDA refuses the query then). A freed or made-up handle is undefined behaviour
 * in CUDA itself: pass only streams that are alive. */
FC_API fc_status_t fc_stream_device(fc_stream_t stream, int32_t* device);
/* GPU memory (cudaMalloc, at least one byte) on the calling thread's current GPU, and its free
 * (NULL is a no-op). Out of GPU memory is FC_STATUS_STATE: the GPU stays usable. */
FC_API fc_status_t fc_device_alloc(size_t bytes, void** out);
FC_API fc_status_t fc_device_free(void* ptr);
/* A synchronous copy of `bytes` between host and device memory in either direction
 * (cudaMemcpyDefault). */
FC_API fc_status_t fc_device_copy(void* dst, const void* src, size_t bytes);
/* A synchronous 2D copy (cudaMemcpy2D, cudaMemcpyDefault): `height` rows of `width` bytes, the
 * rows `src_pitch` bytes apart in the source and `dst_pitch` in the destination (each pitch at
 * least `width`). Between device buffers the GPU does it: e.g. columns interleaved into a
 * row-major matrix. */
FC_API fc_status_t fc_device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                     size_t width, size_t height);
/* Free and total memory of the calling thread's current GPU (cudaMemGetInfo). */
FC_API fc_status_t fc_device_memory(uint64_t* free_bytes, uint64_t* total_bytes);

/* ---- runtime -------------------------------------------------------------------------------- */
/* Everything the native side is configured with (built once from the typed Java config). */
typedef struct {
  fc_backend_t backend;
  int64_t timeout_ms;         /* every wait inside an op */
  int64_t connect_timeout_ms; /* building a communicator's connections */
  int64_t chunk_bytes;        /* host backend: staging chunk per peer (>= 4096) */
  int64_t symmetric_bytes;    /* cuda backend: data area of the symmetric memory */
  const char* bind_host;      /* transport listener; NULL or "": this host */
  int32_t transport_streams;  /* TCP streams per direction between hosts: 1..4 */
  int64_t busy_poll_us;       /* threads between hosts poll this long before sleeping */
  int32_t gpu_ordinal;        /* the executor's GPU, -1: none assigned */
  uint64_t job_token;         /* the application's token */
  int32_t allow_shared_gpu;   /* native tests only: ranks of one host may share a GPU */
  int32_t transport;          /* fc_transport_t */
  int32_t libfabric_provider; /* fc_libfabric_provider_t */
  int32_t libfabric_rails;    /* NICs per executor for libfabric: 1..8 */
  int64_t libfabric_peer_timeout_ms; /* libfabric: a peer silent this long fails: 100..600000 */
} fc_runtime_config_t;

/* The defaults (backend auto, no GPU). */
FC_API fc_status_t fc_runtime_config_init(fc_runtime_config_t* config);
/* Resolves the backend (cuda: the GPU must open, else FC_STATUS_UNAVAILABLE with the reason)
 * and starts the transport. */
FC_API fc_status_t fc_runtime_create(const fc_runtime_config_t* config, fc_runtime_t* out);
FC_API fc_status_t fc_runtime_backend(fc_runtime_t rt, fc_backend_t* out); /* cuda or host */
FC_API fc_status_t fc_runtime_describe(fc_runtime_t rt, const char** out);
FC_API fc_status_t fc_runtime_gpu_uuid(fc_runtime_t rt, const char** out); /* "" without GPU */
/* Makes the runtime's GPU current on the calling thread (a no-op without one). */
FC_API fc_status_t fc_runtime_pin_gpu(fc_runtime_t rt);
/* Symmetric regions kept for the next communicator (cuda backend). */
FC_API fc_status_t fc_runtime_pooled_regions(fc_runtime_t rt, int32_t* out);
/* Frees the runtime; its communicators must be closed first. NULL is a no-op. */
FC_API fc_status_t fc_runtime_destroy(fc_runtime_t rt);

/* A single-rank GEMM, c (m×n) = a (m×k) · op(w), synchronous. FC_BACKEND_HOST: host memory,
 * f32 or bf16. FC_BACKEND_CUDA: device memory of the calling thread's current GPU, bf16, any n
 * and k >= 1, 16-byte aligned pointers (rows off a multiple of 8 elements cost a copy). */
FC_API fc_status_t fc_gemm(fc_backend_t backend, fc_dtype_t dtype, const void* a, const void* w, void* c,
                           int64_t m, int64_t n, int64_t k, fc_weight_layout_t layout);

/* A single-rank attention forward (docs/ops.md "attention"). q, o: (B, q_len, Hq, D); k, v:
 * (B, kv_len, Hkv, D); lse: (B, Hq, q_len) fp32, or NULL when not wanted. Causal: query i sees
 * keys j <= i (top-left aligned, as torch's scaled_dot_product_attention). FC_BACKEND_HOST:
 * host memory, f32 or bf16, stream NULL, synchronous. FC_BACKEND_CUDA: device memory of the
 * calling thread's current GPU, bf16, head_dim 64 or 128, 16-byte aligned; enqueued on
 * `stream` (NULL: synchronous). */
typedef struct {
  int64_t batch, q_len, kv_len;
  int64_t q_heads, kv_heads; /* q_heads % kv_heads == 0 */
  int64_t head_dim;
  int32_t causal;
  float scale; /* 0: 1 / sqrt(head_dim) */
  /* fc_attention_backward, FC_BACKEND_CUDA: nonzero gives bit-reproducible gradients (dq in a
   * pass of its own, slower); 0 (the default) the fastest path, whose dq is added up in fp32 in
   * no fixed order: not bit-reproducible from run to run. The forward and the host backend are
   * reproducible either way. */
  int32_t deterministic;
} fc_attention_local_t;
FC_API fc_status_t fc_attention(fc_backend_t backend, fc_dtype_t dtype, const fc_attention_local_t* shape,
                                const void* q, const void* k, const void* v, void* o, float* lse,
                                fc_stream_t stream);
/* Its backward (docs/ops.md "attentionBackward"): from the forward's q, k, v, o, its lse (fp32,
 * required) and d_o (the gradient of o, shaped as o) writes dq (as q), dk and dv (as k and v;
 * with grouped-query heads summed over the query heads sharing a K/V head). Gradients are
 * accumulated in fp32 and rounded once. Backends, dtypes, alignment and stream as fc_attention. */
FC_API fc_status_t fc_attention_backward(fc_backend_t backend, fc_dtype_t dtype,
                                         const fc_attention_local_t* shape, const void* q, const void* k,
                                         const void* v, const void* o, const float* lse, const void* d_o,
                                         void* dq, void* dk, void* dv, fc_stream_t stream);

/* ---- communicator: bootstrap ---------------------------------------------------------------- */
/* Life cycle, every rank the same: create -> endpoint + device handle + FC_AUTH_SHARE_BYTES
 * fresh random bytes (the rank's auth share) into the launcher's allGather -> connect(all ranks'
 * endpoints, shares and handles) -> ops -> close. The shares and the runtime's job token make
 * the communicator's key, which authenticates its connections (challenge-response; the key,
 * the token and the shares never travel on them): keep them secret, as the allGather does. */
#define FC_AUTH_SHARE_BYTES 32
FC_API fc_status_t fc_comm_create(fc_runtime_t rt, int32_t rank, int32_t world, fc_comm_t* out);
/* "host:port#regionKey": what peers need to reach this rank's transport staging region. */
FC_API fc_status_t fc_comm_endpoint(fc_comm_t comm, const char** out);
/* The cuda backend's symmetric memory handle for the bootstrap (empty with the host backend). */
FC_API fc_status_t fc_comm_device_handle(fc_comm_t comm, const uint8_t** data, size_t* bytes);
/* Bytes of GPU memory this communicator's symmetric region takes (0 with the host backend). */
FC_API fc_status_t fc_comm_symmetric_bytes(fc_comm_t comm, uint64_t* out);
/* endpoints[r], auth_shares[r] (FC_AUTH_SHARE_BYTES bytes), device_handles[r]
 * (device_handle_bytes[r] bytes) and host_ids[r] (rank r's host, 0..H-1) for each of the
 * `ranks` ranks; auth_shares NULL: only for a single rank; device_handles or
 * device_handle_bytes NULL: none (host backend); host_ids NULL: every rank on host 0. Builds
 * the connections (bounded by the connect timeout; a peer that cannot prove the key is
 * refused); ends with a barrier of all ranks. */
FC_API fc_status_t fc_comm_connect(fc_comm_t comm, int32_t rank, uint64_t comm_id, int32_t ranks,
                                   const char* const* endpoints, const uint8_t* const* auth_shares,
                                   const uint8_t* const* device_handles, const size_t* device_handle_bytes,
                                   const int32_t* host_ids);

/* ---- communicator: teardown ----------------------------------------------------------------- */
/* Waits for the ops enqueued on streams (cuda) and reports a device failure. */
FC_API fc_status_t fc_comm_synchronize(fc_comm_t comm);
/* Drains: this rank's ops are complete and every rank got here (a barrier). */
FC_API fc_status_t fc_comm_finish(fc_comm_t comm);
/* Stops now: waits in flight on any thread give up; peers learn at once. Close still needed. */
FC_API fc_status_t fc_comm_abort(fc_comm_t comm);
/* Finishes (unless aborted or broken) and frees the communicator whatever happens; a failure
 * of the closing barrier is reported after. NULL is a no-op. */
FC_API fc_status_t fc_comm_close(fc_comm_t comm);

/* ---- collectives: `count` is the element count of the whole (unsplit) tensor ---------------- */
/* in: split_count(count, W, r) elements; out: count elements, rank blocks in rank order. */
FC_API fc_status_t fc_all_gather(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                                 void* out, int64_t count, fc_stream_t stream);
/* in: count elements; out: block r (split_count(count, W, r) elements) of the sum. */
FC_API fc_status_t fc_reduce_scatter(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                     const void* in, void* out, int64_t count, fc_stream_t stream);
/* in, out: count elements (may alias); out = the sum over ranks. */
FC_API fc_status_t fc_all_reduce(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                                 void* out, int64_t count, fc_stream_t stream);
/* in: W blocks (split rule), block p to rank p; out: block r of every rank, in rank order. */
FC_API fc_status_t fc_all_to_all(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                                 void* out, int64_t count, fc_stream_t stream);
/* Diagnostics (cuda backend): `iters` synchronous collectives (op: one of the four above)
 * initiated here; wall nanoseconds in *nanos. */
FC_API fc_status_t fc_comm_time_collective(fc_comm_t comm, fc_op_t op, fc_dtype_t dtype, const void* in,
                                           void* out, int64_t count, int32_t iters, int64_t* nanos);

/* ---- fused GEMM + communication -------------------------------------------------------------- */
/* c (M×N_r) = allGather(a_local) · op(w); a_local: split_count(M, W, r) × K; gathered (M×K)
 * receives the gathered A, or NULL. */
FC_API fc_status_t fc_all_gather_gemm(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                      const void* a_local, const void* w, void* c, void* gathered, int64_t m,
                                      int64_t n_local, int64_t k, fc_weight_layout_t layout,
                                      fc_stream_t stream);
/* c: row block r (split_count(M, W, r) × N) of Σ_s a_s · op(w_s); a: M × K_r. */
FC_API fc_status_t fc_gemm_reduce_scatter(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                          const void* a, const void* w, void* c, int64_t m, int64_t n,
                                          int64_t k_local, fc_weight_layout_t layout, fc_partials_t partials,
                                          fc_stream_t stream);
/* c (M×N) = Σ_s a_s · op(w_s) on every rank, the same bits everywhere. */
FC_API fc_status_t fc_gemm_all_reduce(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                      const void* a, const void* w, void* c, int64_t m, int64_t n,
                                      int64_t k_local, fc_weight_layout_t layout, fc_partials_t partials,
                                      fc_stream_t stream);
/* How a fused op (FC_OP_ALL_GATHER_GEMM: m, n_local, k; FC_OP_GEMM_REDUCE_SCATTER and
 * FC_OP_GEMM_ALL_REDUCE: m, n, k_local) would run on this rank with these sizes, in a phrase
 * for logs (fused or decomposed, and why). Nothing is launched or exchanged. */
FC_API fc_status_t fc_comm_describe_fused(fc_comm_t comm, fc_op_t op, int64_t m, int64_t n, int64_t k,
                                          fc_partials_t partials, const char** out);

/* ---- MoE ------------------------------------------------------------------------------------- */
/* x: tokens × hidden; topk_ids, topk_weights: tokens × topk; w1_local: E_r × ffn × hidden.
 * Host backend: host memory. Cuda backend (the ranks of one host): device memory of the
 * runtime's GPU, bf16, hidden and ffn multiples of 8, x and w1 16-byte aligned; routing runs on
 * the GPU; the result keeps the outputs on the GPU and the layout below is copied to the host
 * when the call returns; a rank receiving more rows than its symmetric data area holds fails on
 * every rank (FC_STATUS_INVALID_ARGUMENT). Both: synchronous. */
FC_API fc_status_t fc_moe_dispatch_gemm(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                        const void* x, int64_t tokens, int64_t hidden,
                                        const int32_t* topk_ids, const float* topk_weights, int32_t topk,
                                        int64_t num_experts, const void* w1_local, int64_t ffn,
                                        fc_moe_dispatch_t* out);
/* fc_moe_dispatch_gemm's options; every rank passes the same. Zero-initialise. */
typedef struct {
  /* > 0: the most routed rows any rank may receive (docs/ops.md "moeDispatchGemm"). The cuda
   * backend sizes the outputs and the receive area by it (at most what the symmetric data area
   * holds). A rank that would receive more fails the op on every rank with
   * FC_STATUS_INVALID_ARGUMENT naming that rank, its rows and the bound; no row moves and the
   * communicator stays usable. 0: no bound (cuda: what the data area holds). */
  int64_t max_recv_rows;
} fc_moe_options_t;
/* fc_moe_dispatch_gemm with options (NULL: as fc_moe_dispatch_gemm). */
FC_API fc_status_t fc_moe_dispatch_gemm_ex(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                           const void* x, int64_t tokens, int64_t hidden,
                                           const int32_t* topk_ids, const float* topk_weights, int32_t topk,
                                           int64_t num_experts, const void* w1_local, int64_t ffn,
                                           const fc_moe_options_t* options, fc_moe_dispatch_t* out);
/* Where the routed rows came from; the arrays stay valid until the dispatch is freed. */
typedef struct {
  int64_t rows;               /* routed rows received by this rank */
  int64_t first_local_expert; /* this rank's experts: [first, first + local_experts) */
  int64_t local_experts;
  int64_t tokens; /* this rank's tokens */
  int32_t topk;
  const int64_t* expert_offsets; /* local_experts + 1 row offsets */
  const int32_t* src_rank;       /* per row */
  const int32_t* src_token;      /* per row */
  const int32_t* src_slot;       /* per row */
  const float* weight;           /* per row */
} fc_moe_layout_t;
FC_API fc_status_t fc_moe_dispatch_layout(fc_moe_dispatch_t dispatch, fc_moe_layout_t* out);
/* Copies the expert outputs (rows × ffn) and the routed tokens (rows × hidden); either NULL.
 * Cuda backend: into host or device memory. */
FC_API fc_status_t fc_moe_dispatch_copy(fc_moe_dispatch_t dispatch, void* expert_out, void* routed_x);
/* Cuda backend: the device memory that holds the expert outputs (rows × ffn) and the routed
 * tokens (rows × hidden), to use in place; valid until fc_moe_dispatch_free, NULL where rows is 0
 * (either output pointer may be NULL). The host backend's dispatch holds them in host memory:
 * FC_STATUS_STATE (copy them out with fc_moe_dispatch_copy). */
FC_API fc_status_t fc_moe_dispatch_device_rows(fc_moe_dispatch_t dispatch, void** expert_out, void** routed_x);
/* expert_out: rows × width in the dispatch's row order; out: tokens × width (cuda backend: device
 * memory, width a multiple of 8, 16-byte aligned; the dispatch from the same communicator). */
FC_API fc_status_t fc_moe_combine(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                  fc_moe_dispatch_t dispatch, const void* expert_out, int64_t width,
                                  void* out);
/* The down projection with the combine (docs/ops.md "moeGemmCombine"): h (rows × k, the
 * dispatch's rows in its order) times each local expert's w2 (local_experts × width × k,
 * FC_LAYOUT_NK, or local_experts × k × width, FC_LAYOUT_KN), those rows then combined into out
 * (tokens × width); bit for bit fc_grouped_gemm over the dispatch's expert_offsets followed by
 * fc_moe_combine on the same backend. Cuda backend: device memory, bf16, k and width multiples
 * of 8, 16-byte aligned pointers. */
FC_API fc_status_t fc_moe_gemm_combine(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                       fc_moe_dispatch_t dispatch, const void* h, int64_t k,
                                       const void* w2_local, fc_weight_layout_t layout, int64_t width,
                                       void* out);
FC_API fc_status_t fc_moe_dispatch_free(fc_moe_dispatch_t dispatch); /* NULL is a no-op */
/* A single-rank grouped GEMM over contiguous row segments, synchronous (docs/ops.md
 * "groupedGemm"): group g owns rows [offsets[g], offsets[g+1]) of a (rows × k) and of c (rows ×
 * n), and those rows of c = the same rows of a · op(w_g); w holds the groups' weights one after
 * the other: groups × n × k (FC_LAYOUT_NK) or groups × k × n (FC_LAYOUT_KN). offsets: groups + 1
 * int64 values in host memory, 0 <= offsets[0] <= ... <= offsets[groups] <= rows (a group may be
 * empty: a dispatch's expert_offsets fit as they are); rows outside every group are not written.
 * FC_BACKEND_HOST: host memory, f32 or bf16. FC_BACKEND_CUDA: device memory of the calling
 * thread's current GPU, bf16, n and k positive multiples of 8, 16-byte aligned pointers, at most
 * 1024 groups; with FC_LAYOUT_KN and k not a multiple of 64 the weights must be finite. */
FC_API fc_status_t fc_grouped_gemm(fc_backend_t backend, fc_dtype_t dtype, const void* a, const void* w,
                                   void* c, const int64_t* offsets, int64_t groups, int64_t rows, int64_t n,
                                   int64_t k, fc_weight_layout_t layout);

/* ---- ring attention ------------------------------------------------------------------------- */
/* Which positions of the sequence a rank holds (docs/ops.md "ringAttention"). */
typedef enum {
  /* rank r: positions [split_offset(seq, W, r), + split_count(seq, W, r)) */
  FC_SEQ_CONTIGUOUS = 0,
  /* the sequence in 2W chunks (chunk c: split_count(seq, 2W, c) positions); rank r holds chunks
   * r and 2W-1-r, in that order: causal work is balanced over the ranks */
  FC_SEQ_ZIGZAG = 1
} fc_seq_layout_t;
typedef struct {
  int64_t batch, seq;        /* seq: the whole sequence */
  int64_t q_heads, kv_heads; /* q_heads % kv_heads == 0 */
  int64_t head_dim;
  int32_t causal; /* by global position */
  float scale;    /* 0: 1 / sqrt(head_dim) */
  int32_t layout; /* fc_seq_layout_t; 0: contiguous */
} fc_attention_shape_t;
/* q, o: (B, S_r, Hq, D); k, v: (B, S_r, Hkv, D); lse: (B, Hq, S_r) fp32; S_r: the positions
 * rank r holds under the layout. stream as the collectives' (NULL: synchronous; the host
 * backend takes NULL only); a CUDA graph may capture it once it has run outside the capture. */
FC_API fc_status_t fc_ring_attention(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                     const fc_attention_shape_t* shape, const void* q, const void* k,
                                     const void* v, void* o, float* lse, fc_stream_t stream);
/* Its backward (docs/ops.md "ringAttentionBackward"): each rank passes its forward inputs and
 * outputs (q, k, v, o, lse) and d_o, rank-local shapes and the layout as the forward, and gets
 * the gradients of its own positions: dq (as q), dk and dv (as k and v). K/V blocks travel around
 * the ring as in the forward; their dk/dv partials travel with them back to their owner. */
FC_API fc_status_t fc_ring_attention_backward(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                              const fc_attention_shape_t* shape, const void* q, const void* k,
                                              const void* v, const void* o, const float* lse, const void* d_o,
                                              void* dq, void* dk, void* dv, fc_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSEDCOMM_FUSEDCOMM_H_ */
