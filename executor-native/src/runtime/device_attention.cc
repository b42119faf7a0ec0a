#include "fusedcomm/runtime/device_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/ring_fwd.h"

namespace fusedcomm {

std::string require_cuda_attention_shape(const char* op, const fc_attention_local_t& s, DType dtype) {
  const std::string name(op);
  const std::string shape = "(B=" + std::to_string(s.batch) + ", q_len=" + std::to_string(s.q_len) +
                            ", kv_len=" + std::to_string(s.kv_len) + ", Hq=" + std::to_string(s.q_heads) +
                            ", Hkv=" + std::to_string(s.kv_heads) + ", D=" + std::to_string(s.head_dim) + ")";
  FC_REQUIRE(dtype == DType::kBF16, name + " on the cuda backend takes bf16 tensors");
  FC_REQUIRE(s.batch >= 0 && s.q_len >= 0 && s.kv_len >= 0, name + ": negative extent in " + shape);
  FC_REQUIRE(s.head_dim == 64 || s.head_dim == 128,
             name + " on the cuda backend needs head_dim 64 or 128, got " + shape);
  FC_REQUIRE(s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0,
             name + ": q_heads must be a positive multiple of kv_heads, got " + shape);
  FC_REQUIRE(std::isfinite(s.scale) && s.scale >= 0.0f,
             name + ": scale must be finite and >= 0 (0: 1/sqrt(D))");
  return shape;
}

void cuda_attention_local(const fc_attention_local_t& s, DType dtype, const void* q, const void* k,
                          const void* v, void* o, float* lse, cudaStream_t stream) {
  const std::string shape = require_cuda_attention_shape("attention", s, dtype);
  if (s.batch == 0 || s.q_len == 0) return;
  for (const void* p : {q, k, v, static_cast<const void*>(o)}) {
    FC_REQUIRE(p != nullptr, "attention: q, k, v and o must not be null");
    FC_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0,
               "attention: device pointers must be 16-byte aligned");
  }
  FC_REQUIRE(lse == nullptr || reinterpret_cast<uintptr_t>(lse) % 4 == 0,
             "attention: lse must be 4-byte aligned");
  kernels::AttentionArgs a;
  a.q = kernels::attn_dense(q, s.q_len, s.q_heads, s.head_dim);
  a.k = kernels::attn_dense(k, s.kv_len, s.kv_heads, s.head_dim);
  a.v = kernels::attn_dense(v, s.kv_len, s.kv_heads, s.head_dim);
  a.o = static_cast<__nv_bfloat16*>(o);
  a.o_stride_h = s.head_dim;
  a.o_stride_s = s.q_heads * s.head_dim;
  a.o_stride_b = s.q_len * a.o_stride_s;
  a.lse = lse;
  a.batch = s.batch;
  a.q_len = s.q_len;
  a.kv_len = s.kv_len;
  a.q_heads = s.q_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.causal = s.causal != 0;
  a.scale = s.scale;
  if (const char* why = kernels::attention_check(a)) {
    fail(ErrorKind::kInvalidArgument, std::string("attention ") + shape + ": " + why);
  }
  cudaError_t e = kernels::launch_attention(a, stream);
  if (e == cudaSuccess && stream == nullptr) e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu,
         "attention " + shape + " failed on the GPU: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}

}  // namespace fusedcomm

namespace fusedcomm {

namespace {
void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu,
         std::string("ringAttention: ") + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}
}  // namespace

SeqRuns attention_seq_chunks(int64_t seq, int world, int rank, bool zigzag) {
  return seq_runs(seq, world, rank, zigzag ? SeqLayout::kZigzag : SeqLayout::kContiguous);
}

RingAttentionShape ring_attention_shape(const host::AttentionShape& s) {
  RingAttentionShape r;
  r.batch = s.batch;
  r.seq = s.seq;
  r.q_heads = s.q_heads;
  r.kv_heads = s.kv_heads;
  r.head_dim = s.head_dim;
  r.causal = s.causal;
  r.scale = s.scale;
  r.zigzag = s.layout == SeqLayout::kZigzag;
  return r;
}

void require_ring_attention_shape(const RingAttentionShape& s) {
  const std::string shape = "(B=" + std::to_string(s.batch) + ", seq=" + std::to_string(s.seq) +
                            ", Hq=" + std::to_string(s.q_heads) + ", Hkv=" + std::to_string(s.kv_heads) +
                            ", D=" + std::to_string(s.head_dim) + ")";
  FC_REQUIRE(s.batch >= 0 && s.seq >= 0, "ringAttention: negative extent in " + shape);
  FC_REQUIRE(s.head_dim == 64 || s.head_dim == 128,
             "ringAttention on the cuda backend needs head_dim 64 or 128, got " + shape);
  FC_REQUIRE(s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0,
             "ringAttention: q_heads must be a positive multiple of kv_heads, got " + shape);
  FC_REQUIRE(s.batch <= 65535 && s.q_heads <= 65535, "ringAttention: batch and q_heads must be <= 65535");
  FC_REQUIRE(std::isfinite(s.scale) && s.scale >= 0.0f,
             "ringAttention: scale must be finite and >= 0 (0: 1/sqrt(D))");
}

int64_t ring_block_rows(const RingAttentionShape& s, int world, int p) {
  return attention_seq_chunks(s.seq, world, p, s.zigzag).total();
}

int64_t ring_kv_slot_elems(const RingAttentionShape& s, int world) {
  int64_t rows = 0;
  for (int p = 0; p < world; ++p) rows = std::max(rows, ring_block_rows(s, world, p));
  return 2 * s.batch * rows * s.kv_heads * s.head_dim;
}

void enqueue_ring_pack(const RingAttentionShape& s, int world, int rank, const void* k, const void* v,
                       void* slot, cudaStream_t stream) {
  const int64_t rows = ring_block_rows(s, world, rank);
  const size_t bytes = static_cast<size_t>(s.batch * rows * s.kv_heads * s.head_dim) * 2;
  if (bytes == 0) return;
  auto* dst = static_cast<char*>(slot);
  check_launch(cudaMemcpyAsync(dst, k, bytes, cudaMemcpyDeviceToDevice, stream), "copying k");
  check_launch(cudaMemcpyAsync(dst + bytes, v, bytes, cudaMemcpyDeviceToDevice, stream), "copying v");
}

std::vector<RingLaunch> ring_step_plan(const RingAttentionShape& s, int world, int rank, int step) {
  std::vector<RingLaunch> plan;
  if (s.batch == 0) return plan;
  // Every key chunk of the ring in ring order (the owner of step i is rank - i).
  struct KeyChunk {
    int step;
    SeqRun c;
    int64_t row0, owner_rows;
  };
  std::vector<KeyChunk> keys;
  for (int i = 0; i < world; ++i) {
    const int p = (rank - i + world) % world;
    const int64_t n = ring_block_rows(s, world, p);
    int64_t row0 = 0;
    for (const SeqRun& c : attention_seq_chunks(s.seq, world, p, s.zigzag)) {
      if (c.count > 0) keys.push_back({i, c, row0, n});
      row0 += c.count;
    }
  }
  int64_t q_row0 = 0;
  for (const SeqRun& qc : attention_seq_chunks(s.seq, world, rank, s.zigzag)) {
    if (qc.count == 0) continue;
    std::vector<const KeyChunk*> seen;  // causal: skip key chunks entirely after the query chunk
    for (const KeyChunk& kc : keys) {
      if (!s.causal || kc.c.pos <= qc.pos + qc.count - 1) seen.push_back(&kc);
    }
    RingLaunch l;
    l.step = step;
    l.q = qc;
    l.q_row0 = q_row0;
    if (seen.empty() && step == 0) {
      l.key = SeqRun{0, 0};
      l.writes_o = true;
      plan.push_back(l);
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      const KeyChunk& kc = *seen[i];
      if (kc.step != step) continue;
      l.key = kc.c;
      l.k_row0 = kc.row0;
      l.k_block_rows = kc.owner_rows;
      l.acc = i == 0 ? 1 : 2;
      l.merge = static_cast<int>(i);
      l.writes_o = i + 1 == seen.size();
      plan.push_back(l);
    }
    q_row0 += qc.count;
  }
  return plan;
}

void enqueue_ring_step(const RingAttentionShape& s, int world, int rank, int step, const void* q,
                       const void* k, const void* v, void* o, float* lse, float* o_acc, float* lse_tmp,
                       cudaStream_t stream) {
  const int64_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  const int64_t s_r = ring_block_rows(s, world, rank);
  if (B == 0 || s_r == 0) return;
  float* lse_out = lse != nullptr ? lse : lse_tmp;
  const auto* gq = static_cast<const __nv_bfloat16*>(q);
  auto* go = static_cast<__nv_bfloat16*>(o);
  for (const RingLaunch& l : ring_step_plan(s, world, rank, step)) {
    kernels::AttentionArgs a;
    a.batch = B;
    a.q_len = l.q.count;
    a.q_heads = Hq;
    a.kv_heads = Hkv;
    a.head_dim = D;
    a.causal = s.causal;
    a.scale = s.scale;
    a.q_pos0 = l.q.pos;
    a.q.ptr = gq + l.q_row0 * Hq * D;
    a.q.stride_h = D;
    a.q.stride_s = Hq * D;
    a.q.stride_b = s_r * Hq * D;
    a.o_stride_h = D;
    a.o_stride_s = Hq * D;
    a.o_stride_b = s_r * Hq * D;
    a.lse = lse_out + l.q_row0;
    a.lse_stride_h = s_r;
    a.lse_stride_b = Hq * s_r;
    a.o_acc = o_acc + l.q_row0 * Hq * D;
    a.acc_stride_b = s_r * Hq * D;
    a.o = l.writes_o ? go + l.q_row0 * Hq * D : nullptr;
    if (l.key.count == 0) {  // no visible key anywhere (empty sequence blocks): o = 0, lse = -inf
      a.kv_len = 0;
      a.k = a.v = a.q;
      a.acc = kernels::AttnAccum::kNone;
      check_launch(kernels::launch_attention(a, stream), "attention launch");
      continue;
    }
    a.kv_len = l.key.count;
    a.k_pos0 = l.key.pos;
    for (int t = 0; t < 2; ++t) {
      kernels::AttnTensor& x = t == 0 ? a.k : a.v;
      x.ptr = static_cast<const __nv_bfloat16*>(t == 0 ? k : v) + l.k_row0 * Hkv * D;
      x.stride_h = D;
      x.stride_s = Hkv * D;
      x.stride_b = l.k_block_rows * Hkv * D;
    }
    a.acc = l.acc == 1 ? kernels::AttnAccum::kStore : kernels::AttnAccum::kMerge;
    check_launch(kernels::launch_attention(a, stream), "attention launch");
  }
}

void ring_fwd_plan(const RingAttentionShape& s, int world, int rank, kernels::RingFwdArgs& a) {
  a.batch = s.batch;
  a.rows = ring_block_rows(s, world, rank);
  a.q_heads = s.q_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.causal = s.causal;
  a.scale = s.scale;
  a.n_pairs = 0;
  for (int step = 0; step < world; ++step) {
    for (const RingLaunch& l : ring_step_plan(s, world, rank, step)) {
      FC_REQUIRE(a.n_pairs < kernels::kRingFwdMaxPairs, "ringAttention: more block pairs than the ring kernel takes");
      kernels::RingFwdPair& p = a.pairs[a.n_pairs++];
      p.step = step;
      p.q_row0 = l.q_row0;
      p.q_count = l.q.count;
      p.q_pos = l.q.pos;
      p.k_row0 = l.k_row0;
      p.k_count = l.key.count;
      p.k_pos = l.key.pos;
      p.merge = l.merge;
      p.writes_o = l.writes_o;
    }
  }
}

}  // namespace fusedcomm
