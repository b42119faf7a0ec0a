#include "fusedcomm/runtime/device_comm.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {
namespace {

namespace k = fusedcomm::kernels;

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kFatalGpu, what + " failed (" + cudaGetErrorName(e) + ": " +
                                   cudaGetErrorString(e) + ")");
  }
}

size_t element_bytes(k::CommDtype d) { return d == k::CommDtype::kF32 ? 4 : 2; }

}  // namespace

DeviceComm::DeviceComm(Runtime& runtime, int rank, int world) : runtime_(runtime) {
  if (runtime.backend() != Backend::kCuda) {
    fail(ErrorKind::kState, "a device communicator needs the cuda backend");
  }
  pin_gpu(runtime.gpu().ordinal);
  sm_ = std::make_unique<SymmetricMemory>(rank, world, runtime.acquire_region(world));
  try {
    check(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&last_done_, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    close();
    throw;
  }
}

DeviceComm::~DeviceComm() { close(); }

std::vector<uint8_t> DeviceComm::export_handle() const { return sm_->export_handle(); }

void DeviceComm::connect(const std::vector<std::vector<uint8_t>>& blobs) {
  pin_gpu(runtime_.gpu().ordinal);
  sm_->connect(blobs);
  connected_ = true;
}

void DeviceComm::check_usable() const {
  if (closed_) fail(ErrorKind::kState, "the device communicator is closed");
  if (!connected_) fail(ErrorKind::kState, "the device communicator is not connected");
  if (failed_) {
    fail(ErrorKind::kCommunicator,
         "the device communicator failed earlier (see the first error); close it and build a new one");
  }
}

// Kernels on one CommDevice must not overlap (collectives.h): an op on a new stream waits for
// the previous op's stream. Costs nothing while the caller keeps to one stream.
void DeviceComm::join_previous(cudaStream_t s) {
  if (any_op_ && s != last_) check(cudaStreamWaitEvent(s, last_done_, 0), "cudaStreamWaitEvent");
}

void DeviceComm::enqueue(const k::CollectiveArgs& args, const void* in, size_t in_bytes,
                         cudaStream_t s) {
  if (in_bytes > 0) {
    check(cudaMemcpyAsync(sm_->data(), in, in_bytes, cudaMemcpyDeviceToDevice, s),
          "copying the input into symmetric memory");
  }
  const cudaError_t e = k::launch_collective(sm_->device(), args, s);
  if (e == cudaErrorInvalidValue) {
    cudaGetLastError();
    fail(ErrorKind::kInvalidArgument,
         std::string(k::comm_op_name(static_cast<uint32_t>(args.op))) + ": the kernel refused the arguments");
  }
  check(e, std::string("launching ") + k::comm_op_name(static_cast<uint32_t>(args.op)));
}

void DeviceComm::collective(k::CommOp op, k::CommDtype dtype, const void* in, void* out,
                            int64_t count, cudaStream_t stream) {
  check_usable();
  FC_REQUIRE(count >= 0, "negative element count");
  pin_gpu(runtime_.gpu().ordinal);
  raise_device_failure();  // an earlier asynchronous op's failure surfaces here
  const bool sync = stream == nullptr;
  cudaStream_t s = sync ? own_ : stream;
  const int world = sm_->world(), rank = sm_->rank();
  const size_t esize = element_bytes(dtype);
  const uint64_t capacity = sm_->data_bytes();
  // The largest input of any rank decides, so that every rank takes the same branch.
  const int64_t largest_in = k::collective_input_count(op, count, world, 0);
  join_previous(s);
  k::CollectiveArgs args;
  args.op = op;
  args.dtype = dtype;
  if (static_cast<uint64_t>(largest_in) * esize <= capacity) {
    args.count = count;
    args.output = out;
    enqueue(args, in, static_cast<size_t>(k::collective_input_count(op, count, world, rank)) * esize, s);
  } else if (op == k::CommOp::kAllReduce) {
    // Element-wise: pieces of the data area's size (16-byte multiples) are independent ops.
    const int64_t piece = static_cast<int64_t>(capacity / esize) / 8 * 8;
    for (int64_t done = 0; done < count; done += piece) {
      args.count = std::min(piece, count - done);
      args.output = static_cast<char*>(out) + done * esize;
      enqueue(args, static_cast<const char*>(in) + done * esize, args.count * esize, s);
    }
  } else {
    fail(ErrorKind::kInvalidArgument,
         std::string(k::comm_op_name(static_cast<uint32_t>(op))) + ": an input of " +
             std::to_string(largest_in * esize) + " bytes does not fit the symmetric data area (" +
             std::to_string(capacity) + " bytes); raise spark.fusedcomm.cuda.symmetricBytes");
  }
  check(cudaEventRecord(last_done_, s), "cudaEventRecord");
  last_ = s;
  any_op_ = true;
  if (sync) {
    check(cudaStreamSynchronize(s), "waiting for the collective");
    raise_device_failure();
  }
}

void DeviceComm::raise_device_failure() {
  try {
    sm_->raise_if_failed();
  } catch (...) {
    failed_ = true;
    throw;
  }
}

void DeviceComm::synchronize() {
  if (closed_ || !any_op_) return;
  pin_gpu(runtime_.gpu().ordinal);
  check(cudaEventSynchronize(last_done_), "waiting for the communicator's ops");
  raise_device_failure();
}

int64_t DeviceComm::time_collectives(k::CommOp op, k::CommDtype dtype, const void* in, void* out,
                                     int64_t count, int iters) {
  FC_REQUIRE(iters > 0, "iterations must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) collective(op, dtype, in, out, count, nullptr);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

void DeviceComm::abort() noexcept {
  failed_ = true;
  if (sm_ != nullptr) sm_->abort();
}

void DeviceComm::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (sm_ != nullptr) {
    try {
      pin_gpu(runtime_.gpu().ordinal);
      sm_->close();  // synchronises the device first
      std::unique_ptr<SymmetricRegion> region = failed_ ? nullptr : sm_->take_region();
      if (region != nullptr) runtime_.release_region(std::move(region));
    } catch (...) {
      // close() never throws: a failing GPU here is reported by the next op on the runtime.
    }
    sm_.reset();
  }
  if (last_done_ != nullptr) cudaEventDestroy(last_done_);
  if (own_ != nullptr) cudaStreamDestroy(own_);
  last_done_ = nullptr;
  own_ = nullptr;
  cudaGetLastError();
}

}  // namespace fusedcomm
