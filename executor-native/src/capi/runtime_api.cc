// The C API's status calls, host memory, the executor runtime and the single-rank GEMM.
#include <cstring>
#include <utility>

#include "boundary.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/device_memory.h"
#include "fusedcomm/runtime/gpu.h"
#include "fusedcomm/runtime/memory.h"

namespace fusedcomm::capi {
namespace {
thread_local std::string t_error;
thread_local std::string t_string;
thread_local std::vector<uint8_t> t_bytes;
}  // namespace

fc_status_t failed(fc_status_t status, const char* message) noexcept {
  try {
    t_error = message;
  } catch (...) { t_error.clear(); }
  return status;
}

const char* result_string(std::string s) {
  t_string = std::move(s);
  return t_string.c_str();
}

const uint8_t* result_bytes(std::vector<uint8_t> bytes) {
  t_bytes = std::move(bytes);
  return t_bytes.data();
}

const char* last_error() noexcept { return t_error.c_str(); }

}  // namespace fusedcomm::capi

using namespace fusedcomm;
using capi::guarded;
using capi::require_out;

static_assert(static_cast<int>(TransportChoice::kLibfabric) == FC_TRANSPORT_LIBFABRIC &&
              static_cast<int>(TransportChoice::kSocket) == FC_TRANSPORT_SOCKET);
static_assert(static_cast<int>(rdma::LibfabricProvider::kEfa) == FC_LIBFABRIC_EFA &&
              static_cast<int>(rdma::LibfabricProvider::kVerbs) == FC_LIBFABRIC_VERBS &&
              static_cast<int>(rdma::LibfabricProvider::kTcp) == FC_LIBFABRIC_TCP &&
              static_cast<int>(rdma::LibfabricProvider::kShm) == FC_LIBFABRIC_SHM);

extern "C" {

const char* fc_status_string(fc_status_t status) {
  switch (status) {
    case FC_STATUS_SUCCESS: return "success";
    case FC_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case FC_STATUS_STATE: return "invalid state";
    case FC_STATUS_COMMUNICATOR: return "communicator error";
    case FC_STATUS_TIMEOUT: return "timeout";
    case FC_STATUS_TRANSPORT: return "transport error";
    case FC_STATUS_FATAL_GPU: return "fatal GPU error";
    case FC_STATUS_UNAVAILABLE: return "unavailable";
    case FC_STATUS_OUT_OF_MEMORY: return "out of memory";
    case FC_STATUS_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* fc_last_error_message(void) { return capi::last_error(); }

fc_status_t fc_get_version(int* version) {
  return guarded([&] { require_out(version) = FUSEDCOMM_API_VERSION; });
}

fc_status_t fc_availability(const char** report) {
  return guarded([&] { require_out(report) = capi::result_string(availability_report()); });
}

fc_status_t fc_host_alloc(size_t bytes, void** out) {
  return guarded([&] { require_out(out) = host_alloc(bytes); });
}

fc_status_t fc_host_free(void* ptr) {
  return guarded([&] { host_free(ptr); });
}

fc_status_t fc_memory_stats(uint64_t* live_bytes, uint64_t* live_allocations) {
  return guarded([&] {
    const MemoryStats s = memory_stats();
    require_out(live_bytes) = s.live_bytes;
    require_out(live_allocations) = s.live_allocations;
  });
}

fc_status_t fc_pointer_info(const void* ptr, fc_pointer_info_t* out) {
  return guarded([&] {
    fc_pointer_info_t& result = require_out(out);
    const PointerInfo info = pointer_info(ptr);
    result.type = static_cast<fc_memory_type_t>(info.type);
    result.device = info.device;
    result.range_base = info.range_base;
    result.range_bytes = info.range_bytes;
  });
}

fc_status_t fc_stream_device(fc_stream_t stream, int32_t* device) {
  return guarded([&] { require_out(device) = stream_device(reinterpret_cast<cudaStream_t>(stream)); });
}

fc_status_t fc_device_alloc(size_t bytes, void** out) {
  return guarded([&] { require_out(out) = device_alloc(bytes); });
}

fc_status_t fc_device_free(void* ptr) {
  return guarded([&] { device_free(ptr); });
}

fc_status_t fc_device_copy(void* dst, const void* src, size_t bytes) {
  return guarded([&] {
    FC_REQUIRE(bytes == 0 || (dst != nullptr && src != nullptr), "a copy to or from null memory");
    device_copy(dst, src, bytes);
  });
}

fc_status_t fc_device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                              size_t height) {
  return guarded([&] {
    const bool empty = width == 0 || height == 0;
    FC_REQUIRE(empty || (dst != nullptr && src != nullptr), "a copy to or from null memory");
    FC_REQUIRE(empty || (dst_pitch >= width && src_pitch >= width), "a pitch narrower than the row width");
    device_copy_2d(dst, dst_pitch, src, src_pitch, width, height);
  });
}

fc_status_t fc_device_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
  return guarded([&] { device_memory(&require_out(free_bytes), &require_out(total_bytes)); });
}

fc_status_t fc_runtime_config_init(fc_runtime_config_t* config) {
  return guarded([&] {
    const RuntimeConfig d;
    fc_runtime_config_t& c = require_out(config);
    c.backend = static_cast<fc_backend_t>(d.backend);
    c.timeout_ms = d.timeout_ms;
    c.connect_timeout_ms = d.connect_timeout_ms;
    c.chunk_bytes = d.chunk_bytes;
    c.symmetric_bytes = d.symmetric_bytes;
    c.bind_host = "";
    c.transport_streams = d.transport_streams;
    c.busy_poll_us = d.busy_poll_us;
    c.gpu_ordinal = d.gpu_ordinal;
    c.job_token = d.job_token;
    c.allow_shared_gpu = d.allow_shared_gpu ? 1 : 0;
    c.transport = static_cast<int32_t>(d.transport);
    c.libfabric_provider = static_cast<int32_t>(d.libfabric_provider);
    c.libfabric_rails = d.libfabric_rails;
    c.libfabric_peer_timeout_ms = d.libfabric_peer_timeout_ms;
  });
}

fc_status_t fc_runtime_create(const fc_runtime_config_t* config, fc_runtime_t* out) {
  return guarded([&] {
    fc_runtime_t& result = require_out(out);
    FC_REQUIRE(config != nullptr, "null runtime config");
    RuntimeConfig c;
    c.backend = capi::backend(config->backend);
    c.timeout_ms = config->timeout_ms;
    c.connect_timeout_ms = config->connect_timeout_ms;
    c.chunk_bytes = config->chunk_bytes;
    c.symmetric_bytes = config->symmetric_bytes;
    c.bind_host = config->bind_host != nullptr ? config->bind_host : "";
    c.transport_streams = config->transport_streams;
    c.busy_poll_us = config->busy_poll_us;
    c.gpu_ordinal = config->gpu_ordinal;
    c.job_token = config->job_token;
    c.allow_shared_gpu = config->allow_shared_gpu != 0;
    FC_REQUIRE(config->transport >= FC_TRANSPORT_AUTO && config->transport <= FC_TRANSPORT_LIBFABRIC,
               "unknown transport " + std::to_string(config->transport));
    FC_REQUIRE(
        config->libfabric_provider >= FC_LIBFABRIC_AUTO && config->libfabric_provider <= FC_LIBFABRIC_SHM,
        "unknown libfabric provider " + std::to_string(config->libfabric_provider));
    c.transport = static_cast<TransportChoice>(config->transport);
    c.libfabric_provider = static_cast<rdma::LibfabricProvider>(config->libfabric_provider);
    c.libfabric_rails = config->libfabric_rails;
    c.libfabric_peer_timeout_ms = config->libfabric_peer_timeout_ms;
    auto handle = std::make_unique<fc_runtime>();
    handle->runtime = std::make_unique<Runtime>(c);
    result = handle.release();
  });
}

fc_status_t fc_runtime_backend(fc_runtime_t rt, fc_backend_t* out) {
  return guarded([&] { require_out(out) = static_cast<fc_backend_t>(capi::runtime_of(rt).backend()); });
}

fc_status_t fc_runtime_describe(fc_runtime_t rt, const char** out) {
  return guarded([&] { require_out(out) = capi::result_string(capi::runtime_of(rt).describe()); });
}

fc_status_t fc_runtime_gpu_uuid(fc_runtime_t rt, const char** out) {
  return guarded([&] { require_out(out) = capi::result_string(capi::runtime_of(rt).gpu().uuid); });
}

fc_status_t fc_runtime_pin_gpu(fc_runtime_t rt) {
  return guarded([&] {
    Runtime& r = capi::runtime_of(rt);
    if (r.gpu().ordinal >= 0) pin_gpu(r.gpu().ordinal);
  });
}

fc_status_t fc_runtime_pooled_regions(fc_runtime_t rt, int32_t* out) {
  return guarded([&] { require_out(out) = static_cast<int32_t>(capi::runtime_of(rt).pooled_regions()); });
}

fc_status_t fc_runtime_destroy(fc_runtime_t rt) {
  return guarded([&] { delete rt; });
}

fc_status_t fc_gemm(fc_backend_t backend, fc_dtype_t dtype, const void* a, const void* w, void* c, int64_t m,
                    int64_t n, int64_t k, fc_weight_layout_t layout) {
  return guarded([&] {
    capi::require_gemm_sizes("gemm", dtype, m, n, k);
    switch (capi::backend(backend)) {
      case Backend::kHost:
        host::gemm(capi::floating(dtype), a, w, c, m, n, k, capi::weight_layout(layout));
        return;
      case Backend::kCuda:
        FC_REQUIRE(dtype == FC_DTYPE_BF16, "gemm on the cuda backend takes bf16 tensors");
        device_gemm_bf16(a, w, c, m, n, k, capi::weight_layout(layout));
        return;
      case Backend::kAuto: break;
    }
    fail(ErrorKind::kInvalidArgument, "gemm: name the backend to run on (cuda or host), not auto");
  });
}

fc_status_t fc_attention(fc_backend_t backend, fc_dtype_t dtype, const fc_attention_local_t* shape,
                         const void* q, const void* k, const void* v, void* o, float* lse,
                         fc_stream_t stream) {
  return guarded([&] {
    const host::AttentionLocalShape s = capi::attention_local_shape("attention", dtype, shape);
    switch (capi::backend(backend)) {
      case Backend::kHost:
        FC_REQUIRE(stream == nullptr,
                   "attention: a stream was given, but the host backend runs ops synchronously");
        host::attention(capi::floating(dtype), s, q, k, v, o, lse);
        return;
      case Backend::kCuda:
        cuda_attention_local(*shape, capi::floating(dtype), q, k, v, o, lse,
                             reinterpret_cast<cudaStream_t>(stream));
        return;
      case Backend::kAuto: break;
    }
    fail(ErrorKind::kInvalidArgument, "attention: name the backend to run on (cuda or host), not auto");
  });
}

fc_status_t fc_attention_backward(fc_backend_t backend, fc_dtype_t dtype, const fc_attention_local_t* shape,
                                  const void* q, const void* k, const void* v, const void* o,
                                  const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                  fc_stream_t stream) {
  return guarded([&] {
    constexpr const char* kOp = "attentionBackward";
    const host::AttentionLocalShape s = capi::attention_local_shape(kOp, dtype, shape);
    switch (capi::backend(backend)) {
      case Backend::kHost:
        FC_REQUIRE(stream == nullptr,
                   std::string(kOp) + ": a stream was given, but the host backend runs ops synchronously");
        host::attention_backward(capi::floating(dtype), s, q, k, v, o, lse, d_o, dq, dk, dv);
        return;
      case Backend::kCuda:
        cuda_attention_backward_local(*shape, capi::floating(dtype), q, k, v, o, lse, d_o, dq, dk, dv,
                                      reinterpret_cast<cudaStream_t>(stream));
        return;
      case Backend::kAuto: break;
    }
    fail(ErrorKind::kInvalidArgument,
         std::string(kOp) + ": name the backend to run on (cuda or host), not auto");
  });
}

}  // extern "C"
