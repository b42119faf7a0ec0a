// JNI for io.fusedcomm.runtime.NativeApi: communicators and the ops. Java has validated the
// arguments (shapes, dtypes, tensor sizes) before any call here; each entry converts its
// arguments, names the op for errors (begin_op) and calls the backend.
#include <jni.h>

#include <cstring>
#include <memory>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/communicator.h"
#include "fusedcomm/runtime/device_comm.h"
#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/runtime.h"
#include "jni/jni_boundary.h"

using fusedcomm::Communicator;
using fusedcomm::DeviceComm;
using fusedcomm::ErrorKind;
using fusedcomm::jni::from_handle;
namespace host = fusedcomm::host;
namespace kern = fusedcomm::kernels;

namespace {

// A communicator: the host half (transport, barriers, host-backend ops) always; the device half
// (symmetric memory, GPU collectives) with the cuda backend.
struct CommHandle {
  fusedcomm::Runtime* runtime;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<DeviceComm> device;  // null with the host backend
};

CommHandle* comm_handle(jlong c) { return from_handle<CommHandle>(c, "the communicator"); }

host::MoeDispatchResult* moe_result(jlong h) {
  return from_handle<host::MoeDispatchResult>(h, "the MoE dispatch");
}

cudaStream_t as_stream(jlong stream) { return reinterpret_cast<cudaStream_t>(stream); }

template <typename T = void>
T* ptr(jlong address) {
  return reinterpret_cast<T*>(address);
}

host::DType dtype(jint t) {
  FC_REQUIRE(t == 0 || t == 1, "unsupported dtype " + std::to_string(t) + " (f32 or bf16)");
  return static_cast<host::DType>(t);
}

// The same two dtypes, as the kernels number them.
kern::CommDtype comm_dtype(jint t) {
  dtype(t);
  return static_cast<kern::CommDtype>(t);
}

host::WeightLayout layout(jint l) {
  FC_REQUIRE(l == 0 || l == 1, "unknown weight layout " + std::to_string(l));
  return static_cast<host::WeightLayout>(l);
}

host::PartialPrecision partial_precision(jint p) {
  FC_REQUIRE(p >= 0 && p <= 2, "unknown partial precision " + std::to_string(p));
  return static_cast<host::PartialPrecision>(p);
}

// Starts an op on the host backend: names it (errors and the cross-rank check) and returns the
// communicator. Ops the cuda backend does not run yet refuse loudly.
Communicator& start_op(JNIEnv* env, jlong handle, jstring description, jlong fingerprint) {
  auto* h = comm_handle(handle);
  std::string desc = fusedcomm::jni::to_string(env, description);
  if (h->device != nullptr) {
    fusedcomm::fail(ErrorKind::kUnavailable,
                    desc + ": not available on the cuda backend yet (it runs allGather, "
                           "reduceScatter, allReduce, allToAll, allGatherGemm, gemmReduceScatter, "
                           "gemmAllReduce and gemm); use spark.fusedcomm.backend=host for this op");
  }
  h->comm->begin_op(desc, static_cast<uint64_t>(fingerprint));
  return *h->comm;
}

// The device half for a fused op on the cuda backend (bf16 only), or null with the host backend.
DeviceComm* device_of(jlong c, jint t, const char* op) {
  auto* h = comm_handle(c);
  if (h->device == nullptr) return nullptr;
  FC_REQUIRE(t == 1, std::string(op) + " on the cuda backend takes bf16 tensors");
  return h->device.get();
}

// The host backend runs every op synchronously: a caller's stream is a usage error there.
void require_no_stream(jlong stream) {
  FC_REQUIRE(stream == 0, "a stream was given, but the host backend runs ops synchronously");
}

// A collective of host_ops.h (all_gather, reduce_scatter, all_reduce, all_to_all).
using HostCollective = void (*)(fusedcomm::Exchanger&, host::DType, const void*, void*, int64_t);

// A collective on either backend. The cuda backend enqueues on `stream` (0: its own stream,
// waiting for the result); the description is converted only where it is used (host backend).
void run_collective(JNIEnv* env, jlong c, jstring d, jlong fp, kern::CommOp op, HostCollective host_op, jint t,
                    jlong in, jlong out, jlong count, jlong stream) {
  auto* h = comm_handle(c);
  if (h->device != nullptr) {
    h->device->collective(op, comm_dtype(t), ptr(in), ptr(out), count, as_stream(stream));
    return;
  }
  require_no_stream(stream);
  Communicator& comm = start_op(env, c, d, fp);
  host_op(comm, dtype(t), ptr(in), ptr(out), count);
}

}  // namespace

FC_NATIVE(jlong, commCreate)(JNIEnv* env, jclass, jlong rt, jint rank, jint world) {
  FC_JNI_BEGIN
  auto* runtime = from_handle<fusedcomm::Runtime>(rt, "the runtime");
  auto h = std::make_unique<CommHandle>();
  h->runtime = runtime;
  h->comm = std::make_unique<Communicator>(*runtime, world);
  if (runtime->backend() == fusedcomm::Backend::kCuda) {
    h->device = std::make_unique<DeviceComm>(*runtime, rank, world);
  }
  return reinterpret_cast<jlong>(h.release());
  FC_JNI_END(0)
}

// The device half's IPC blob for the bootstrap allGather; empty with the host backend.
FC_NATIVE(jbyteArray, commDeviceHandle)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  std::vector<uint8_t> blob;
  if (h->device != nullptr) blob = h->device->export_handle();
  jbyteArray a = env->NewByteArray(static_cast<jsize>(blob.size()));
  env->SetByteArrayRegion(a, 0, static_cast<jsize>(blob.size()), reinterpret_cast<const jbyte*>(blob.data()));
  return a;
  FC_JNI_END(nullptr)
}

FC_NATIVE(jstring, commEndpoint)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  return fusedcomm::jni::to_jstring(env, comm_handle(c)->comm->endpoint());
  FC_JNI_END(nullptr)
}

// Host connections first (they end with a barrier, so every rank has created its device half),
// then the peers' symmetric memory is mapped; with ranks on several hosts (host_ids[r]: rank r's
// host, 0..H-1) the device half also connects each rank to its counterparts on the other hosts.
FC_NATIVE(void, commConnect)(JNIEnv* env, jclass, jlong c, jobjectArray endpoints, jint rank, jlong comm_id,
                             jobjectArray device_handles, jintArray host_ids) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  h->comm->connect(fusedcomm::jni::to_strings(env, endpoints), rank, static_cast<uint64_t>(comm_id));
  if (h->device != nullptr) {
    std::vector<std::vector<uint8_t>> blobs;
    const jsize n = env->GetArrayLength(device_handles);
    for (jsize i = 0; i < n; ++i) {
      auto a = static_cast<jbyteArray>(env->GetObjectArrayElement(device_handles, i));
      std::vector<uint8_t> b(a == nullptr ? 0 : env->GetArrayLength(a));
      if (!b.empty()) env->GetByteArrayRegion(a, 0, static_cast<jsize>(b.size()), reinterpret_cast<jbyte*>(b.data()));
      env->DeleteLocalRef(a);
      blobs.push_back(std::move(b));
    }
    std::vector<int> host_of(env->GetArrayLength(host_ids));
    env->GetIntArrayRegion(host_ids, 0, static_cast<jsize>(host_of.size()), reinterpret_cast<jint*>(host_of.data()));
    h->device->connect(blobs, host_of, *h->comm, static_cast<uint64_t>(comm_id));
  }
  FC_JNI_END()
}

FC_NATIVE(void, commSynchronize)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  if (h->device != nullptr) h->device->synchronize();
  FC_JNI_END()
}

// Every rank's ops are complete (device) and every rank got here (host barrier).
FC_NATIVE(void, commFinish)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  if (h->device != nullptr) h->device->synchronize();
  h->comm->finish();
  FC_JNI_END()
}

FC_NATIVE(void, commAbort)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  if (h->device != nullptr) h->device->abort();
  h->comm->abort();
  FC_JNI_END()
}

// Frees the communicator whatever happens; a failure of the closing barrier is reported after.
// The device half is closed last: after the barrier no peer uses this rank's memory, so its
// region can go back to the runtime's pool; without the barrier it is dropped instead.
FC_NATIVE(void, commClose)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  std::unique_ptr<CommHandle> h(comm_handle(c));
  if (h->device == nullptr) {
    h->comm->close();
  } else {
    try {
      h->device->synchronize();
      h->comm->close();
    } catch (...) {
      // The region is dropped, not pooled; peers learn at once that this rank left.
      h->device->abort();
      h->device->close();
      h->comm->abort();
      try {
        h->comm->close();
      } catch (...) {
      }
      throw;
    }
    h->device->close();
  }
  FC_JNI_END()
}

// Diagnostics: `iters` synchronous collectives initiated from native code, wall nanoseconds
// (the reference for the Java-initiated per-op overhead). cuda backend only.
FC_NATIVE(jlong, commTimeCollective)(JNIEnv* env, jclass, jlong c, jint op, jint t, jlong in, jlong out,
                                     jlong count, jint iters) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  if (h->device == nullptr) fusedcomm::fail(ErrorKind::kState, "timing collectives needs the cuda backend");
  FC_REQUIRE(op >= 1 && op <= 4, "unknown collective " + std::to_string(op));
  return h->device->time_collectives(static_cast<kern::CommOp>(op), comm_dtype(t), ptr(in), ptr(out), count,
                                     iters);
  FC_JNI_END(0)
}

FC_NATIVE(void, allGather)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count,
                   jlong stream) {
  FC_JNI_BEGIN
  run_collective(env, c, d, fp, kern::CommOp::kAllGather, host::all_gather, t, in, out, count, stream);
  FC_JNI_END()
}

FC_NATIVE(void, reduceScatter)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count,
                   jlong stream) {
  FC_JNI_BEGIN
  run_collective(env, c, d, fp, kern::CommOp::kReduceScatter, host::reduce_scatter, t, in, out, count, stream);
  FC_JNI_END()
}

FC_NATIVE(void, allReduce)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count,
                   jlong stream) {
  FC_JNI_BEGIN
  run_collective(env, c, d, fp, kern::CommOp::kAllReduce, host::all_reduce, t, in, out, count, stream);
  FC_JNI_END()
}

FC_NATIVE(void, allToAll)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count,
                   jlong stream) {
  FC_JNI_BEGIN
  run_collective(env, c, d, fp, kern::CommOp::kAllToAll, host::all_to_all, t, in, out, count, stream);
  FC_JNI_END()
}

FC_NATIVE(void, gemm)(JNIEnv* env, jclass, jint t, jlong a, jlong w, jlong c, jlong m, jlong n, jlong k, jint l) {
  FC_JNI_BEGIN
  host::gemm(dtype(t), ptr(a), ptr(w), ptr(c), m, n, k, layout(l));
  FC_JNI_END()
}

FC_NATIVE(void, allGatherGemm)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong a, jlong w,
                               jlong c, jlong gathered, jlong m, jlong n_local, jlong k, jint l, jlong stream) {
  FC_JNI_BEGIN
  if (DeviceComm* dc = device_of(comm, t, "allGatherGemm")) {
    dc->all_gather_gemm(ptr(a), ptr(w), ptr(c), ptr(gathered), m, n_local, k, static_cast<int>(layout(l)),
                        as_stream(stream));
    return;
  }
  require_no_stream(stream);
  host::all_gather_gemm(start_op(env, comm, d, fp), dtype(t), ptr(a), ptr(w), ptr(c), ptr(gathered), m, n_local,
                        k, layout(l));
  FC_JNI_END()
}

FC_NATIVE(void, gemmReduceScatter)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong a,
                                   jlong w, jlong c, jlong m, jlong n, jlong k_local, jint l, jint partials,
                                   jlong stream) {
  FC_JNI_BEGIN
  if (DeviceComm* dc = device_of(comm, t, "gemmReduceScatter")) {
    dc->gemm_reduce_scatter(ptr(a), ptr(w), ptr(c), m, n, k_local, static_cast<int>(layout(l)),
                            static_cast<int>(partial_precision(partials)), as_stream(stream));
    return;
  }
  require_no_stream(stream);
  host::gemm_reduce_scatter(start_op(env, comm, d, fp), dtype(t), ptr(a), ptr(w), ptr(c), m, n, k_local, layout(l),
                            partial_precision(partials));
  FC_JNI_END()
}

// How a fused op (0 allGatherGemm, 1 gemmReduceScatter, 2 gemmAllReduce) would run here, in a
// phrase: the device half's choice (DeviceComm::describe_fused), or the host backend's one path.
FC_NATIVE(jstring, commDescribeFused)(JNIEnv* env, jclass, jlong c, jint op, jlong m, jlong n, jlong k,
                                      jint partials) {
  FC_JNI_BEGIN
  auto* h = comm_handle(c);
  if (h->device != nullptr) {
    return fusedcomm::jni::to_jstring(env, h->device->describe_fused(op, m, n, k, partials));
  }
  partial_precision(partials);
  FC_REQUIRE(op >= 0 && op <= 2, "unknown fused op " + std::to_string(op));
  static const char* const kHost[] = {
      "host backend: allGather over the executors' transport, then the GEMM on the CPU",
      "host backend: the GEMM on the CPU, then reduceScatter over the executors' transport",
      "host backend: the GEMM on the CPU, then reduceScatter and allGather over the executors' transport"};
  return fusedcomm::jni::to_jstring(env, kHost[op]);
  FC_JNI_END(nullptr)
}

FC_NATIVE(void, gemmAllReduce)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong a, jlong w,
                               jlong c, jlong m, jlong n, jlong k_local, jint l, jint partials, jlong stream) {
  FC_JNI_BEGIN
  if (DeviceComm* dc = device_of(comm, t, "gemmAllReduce")) {
    dc->gemm_all_reduce(ptr(a), ptr(w), ptr(c), m, n, k_local, static_cast<int>(layout(l)),
                        static_cast<int>(partial_precision(partials)), as_stream(stream));
    return;
  }
  require_no_stream(stream);
  host::gemm_all_reduce(start_op(env, comm, d, fp), dtype(t), ptr(a), ptr(w), ptr(c), m, n, k_local, layout(l),
                        partial_precision(partials));
  FC_JNI_END()
}

FC_NATIVE(jlong, moeDispatchGemm)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong x,
                                  jlong tokens, jlong hidden, jlong ids, jlong weights, jint topk,
                                  jlong num_experts, jlong w1, jlong ffn) {
  FC_JNI_BEGIN
  auto result = std::make_unique<host::MoeDispatchResult>(
      host::moe_dispatch_gemm(start_op(env, comm, d, fp), dtype(t), ptr(x), tokens, hidden,
                              ptr<const int32_t>(ids), ptr<const float>(weights), topk, num_experts, ptr(w1), ffn));
  return reinterpret_cast<jlong>(result.release());
  FC_JNI_END(0)
}

// [rows, firstLocalExpert, localExperts, tokens, topk, offsets[0..localExperts]]
FC_NATIVE(jlongArray, moeInfo)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  const auto& l = moe_result(h)->layout;
  std::vector<jlong> v = {l.rows(), l.first_local_expert, l.local_experts, l.tokens, l.topk};
  for (int64_t o : l.expert_offsets) v.push_back(o);
  jlongArray a = env->NewLongArray(static_cast<jsize>(v.size()));
  env->SetLongArrayRegion(a, 0, static_cast<jsize>(v.size()), v.data());
  return a;
  FC_JNI_END(nullptr)
}

FC_NATIVE(void, moeCopy)(JNIEnv* env, jclass, jlong h, jlong expert_out, jlong routed_x) {
  FC_JNI_BEGIN
  auto* r = moe_result(h);
  if (expert_out != 0 && !r->out.empty()) std::memcpy(ptr(expert_out), r->out.data(), r->out.size());
  if (routed_x != 0 && !r->routed_x.empty()) std::memcpy(ptr(routed_x), r->routed_x.data(), r->routed_x.size());
  FC_JNI_END()
}

FC_NATIVE(void, moeRowMeta)(JNIEnv* env, jclass, jlong h, jintArray src_rank, jintArray src_token,
                            jintArray slot, jfloatArray weight) {
  FC_JNI_BEGIN
  const auto& l = moe_result(h)->layout;
  auto n = static_cast<jsize>(l.rows());
  env->SetIntArrayRegion(src_rank, 0, n, l.src_rank.data());
  env->SetIntArrayRegion(src_token, 0, n, l.src_token.data());
  env->SetIntArrayRegion(slot, 0, n, l.src_slot.data());
  env->SetFloatArrayRegion(weight, 0, n, l.weight.data());
  FC_JNI_END()
}

FC_NATIVE(void, moeCombine)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong h,
                            jlong expert_out, jlong width, jlong out) {
  FC_JNI_BEGIN
  const auto& l = moe_result(h)->layout;
  host::moe_combine(start_op(env, comm, d, fp), dtype(t), l, ptr(expert_out), width, ptr(out));
  FC_JNI_END()
}

FC_NATIVE(void, moeFree)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  delete reinterpret_cast<host::MoeDispatchResult*>(h);
  FC_JNI_END()
}

FC_NATIVE(void, ringAttention)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong batch,
                               jlong seq, jlong q_heads, jlong kv_heads, jlong head_dim, jboolean causal,
                               jfloat scale, jlong q, jlong k, jlong v, jlong o, jlong lse) {
  FC_JNI_BEGIN
  host::AttentionShape s;
  s.batch = batch;
  s.seq = seq;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.causal = causal == JNI_TRUE;
  s.scale = scale;
  host::ring_attention(start_op(env, comm, d, fp), dtype(t), s, ptr(q), ptr(k), ptr(v), ptr(o), ptr<float>(lse));
  FC_JNI_END()
}

FC_NATIVE(void, gemmDevice)(JNIEnv* env, jclass, jlong a, jlong w, jlong c, jlong m, jlong n, jlong k, jint l) {
  FC_JNI_BEGIN
  layout(l);
  fusedcomm::device_gemm_bf16(ptr(a), ptr(w), ptr(c), m, n, k, l);
  FC_JNI_END()
}
