// Host collectives over the Exchanger. Blocks follow split.h; reductions add in rank order in
// fp32 and round once, so every rank gets the same bits for a given world size.
#include <cstring>

#include "detail.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm::host {
namespace detail {

void all_gather_rows(Exchanger& ex, const void* in, void* out, int64_t rows, int64_t row_bytes,
                     const char* step) {
  const int w = ex.world(), r = ex.rank();
  auto* dst = static_cast<uint8_t*>(out);
  const uint64_t mine = static_cast<uint64_t>(split_count(rows, w, r) * row_bytes);
  std::vector<SendBlock> send(w, SendBlock{in, mine});
  std::vector<RecvBlock> recv(w);
  for (int p = 0; p < w; ++p) {
    const int64_t bytes = split_count(rows, w, p) * row_bytes;
    recv[p] = {bytes ? dst + split_offset(rows, w, p) * row_bytes : nullptr, static_cast<uint64_t>(bytes)};
  }
  ex.exchange(send, recv, step);
}

void reduce_scatter_rows(Exchanger& ex, DType wire, const void* in, float* out, int64_t rows,
                         int64_t row_elems, const char* step) {
  const int w = ex.world(), r = ex.rank();
  const int64_t esize = dtype_size(wire);
  const auto* src = static_cast<const uint8_t*>(in);
  const int64_t mine = split_count(rows, w, r) * row_elems;  // elements of my block
  std::vector<uint8_t> staged(static_cast<size_t>(mine * esize * w));
  std::vector<SendBlock> send(w);
  std::vector<RecvBlock> recv(w);
  for (int p = 0; p < w; ++p) {
    const int64_t bytes = split_count(rows, w, p) * row_elems * esize;
    send[p] = {bytes ? src + split_offset(rows, w, p) * row_elems * esize : nullptr,
               static_cast<uint64_t>(bytes)};
    recv[p] = {mine ? staged.data() + p * mine * esize : nullptr, static_cast<uint64_t>(mine * esize)};
  }
  ex.exchange(send, recv, step);

  to_f32(wire, staged.data(), mine, out);  // rank 0's block starts the sum
  std::vector<float> block(static_cast<size_t>(mine));
  for (int p = 1; p < w; ++p) {
    to_f32(wire, staged.data() + p * mine * esize, mine, block.data());
    for (int64_t i = 0; i < mine; ++i) out[i] += block[i];
  }
}

}  // namespace detail

namespace {

void require_collective(DType t, const void* in, int64_t in_elems, const void* out, int64_t out_elems,
                        int64_t count, const char* op) {
  detail::require_dtype(t, op);
  detail::require_nonneg(count, op, "count");
  detail::require_data(in, in_elems, op, "in");
  detail::require_data(out, out_elems, op, "out");
}

}  // namespace

void all_gather(Exchanger& ex, DType t, const void* in, void* out, int64_t count) {
  const int w = ex.world(), r = ex.rank();
  require_collective(t, in, count < 0 ? 0 : split_count(count, w, r), out, count, count, "allGather");
  detail::all_gather_rows(ex, in, out, count, dtype_size(t), "allGather");
}

void reduce_scatter(Exchanger& ex, DType t, const void* in, void* out, int64_t count) {
  const int w = ex.world(), r = ex.rank();
  const int64_t mine = count < 0 ? 0 : split_count(count, w, r);
  require_collective(t, in, count, out, mine, count, "reduceScatter");
  std::vector<float> sum(static_cast<size_t>(mine));
  detail::reduce_scatter_rows(ex, t, in, sum.data(), count, 1, "reduceScatter");
  detail::from_f32(t, sum.data(), mine, out);
}

void all_reduce(Exchanger& ex, DType t, const void* in, void* out, int64_t count) {
  const int w = ex.world(), r = ex.rank();
  require_collective(t, in, count, out, count, count, "allReduce");
  const int64_t mine = split_count(count, w, r);
  // `in` is fully consumed by the first exchange before `out` is written, so they may alias.
  std::vector<float> sum(static_cast<size_t>(mine));
  detail::reduce_scatter_rows(ex, t, in, sum.data(), count, 1, "allReduce/reduce-scatter");
  std::vector<uint8_t> rounded(static_cast<size_t>(mine * dtype_size(t)));
  detail::from_f32(t, sum.data(), mine, rounded.data());
  detail::all_gather_rows(ex, rounded.data(), out, count, dtype_size(t), "allReduce/all-gather");
}

void all_to_all(Exchanger& ex, DType t, const void* in, void* out, int64_t count) {
  constexpr const char* kOp = "allToAll";
  const int w = ex.world(), r = ex.rank();
  const int64_t mine = count < 0 ? 0 : split_count(count, w, r);
  require_collective(t, in, count, out, mine * w, count, kOp);
  const int64_t esize = dtype_size(t);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<SendBlock> send(w);
  std::vector<RecvBlock> recv(w);
  for (int p = 0; p < w; ++p) {
    const int64_t bytes = split_count(count, w, p) * esize;
    send[p] = {bytes ? src + split_offset(count, w, p) * esize : nullptr, static_cast<uint64_t>(bytes)};
    recv[p] = {mine ? dst + p * mine * esize : nullptr, static_cast<uint64_t>(mine * esize)};
  }
  ex.exchange(send, recv, kOp);
}

}  // namespace fusedcomm::host
