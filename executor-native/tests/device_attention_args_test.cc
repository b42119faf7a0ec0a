// device_attention_args_test: what the GPU attention entry points decide on the host, without a
// GPU: cuda_attention_local's and the ring's argument checks (each refusal an
// Error(kInvalidArgument) naming what is wrong, before any CUDA call), the kernel launcher's
// checks (forward and backward), and the ring's layout math: under both layouts the ranks' chunks cover the sequence
// exactly once, zigzag rank r holding chunks r and 2W-1-r of 2W in that order; and the ring's
// launch plan per step (plan_checks).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_bwd.h"
#include "support/check.h"

namespace {

using fusedcomm::DType;
using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::testing::check;

// The message of the Error(kInvalidArgument) fn throws, or "" (and a failed check) otherwise.
template <typename Fn>
std::string refusal(Fn fn, const std::string& what) {
  try {
    fn();
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kInvalidArgument, what + ": Error(kInvalidArgument)");
    return e.what();
  }
  check(false, what + ": refused");
  return "";
}

void local_checks() {
  fc_attention_local_t s{};
  s.batch = 1;
  s.q_len = s.kv_len = 64;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.head_dim = 128;
  // Aligned stand-ins: every refusal below happens before a pointer is used.
  auto* p = reinterpret_cast<void*>(uintptr_t{1} << 20);
  auto run = [&](const fc_attention_local_t& x, DType t, void* q) {
    return [=] { fusedcomm::cuda_attention_local(x, t, q, p, p, p, nullptr, nullptr); };
  };
  std::string m = refusal(run(s, DType::kF32, p), "f32 on the GPU");
  check(m.find("bf16") != std::string::npos, "the dtype refusal names bf16: " + m);
  fc_attention_local_t x = s;
  x.head_dim = 96;
  m = refusal(run(x, DType::kBF16, p), "head_dim 96");
  check(m.find("head_dim 64 or 128") != std::string::npos, "the head_dim refusal says what is taken: " + m);
  x = s;
  x.kv_heads = 3;
  m = refusal(run(x, DType::kBF16, p), "Hq % Hkv != 0");
  check(m.find("multiple of kv_heads") != std::string::npos, "the GQA refusal: " + m);
  x = s;
  x.q_len = -1;
  refusal(run(x, DType::kBF16, p), "negative q_len");
  m = refusal(run(s, DType::kBF16, reinterpret_cast<void*>((uintptr_t{1} << 20) + 2)), "misaligned q");
  check(m.find("16-byte aligned") != std::string::npos, "the alignment refusal: " + m);
  x = s;
  x.scale = -1.0f;
  refusal(run(x, DType::kBF16, p), "negative scale");
  // Nothing to compute: returns before any CUDA call (so it runs here, without a GPU).
  x = s;
  x.batch = 0;
  bool ok = true;
  try {
    run(x, DType::kBF16, p)();
  } catch (const Error&) { ok = false; }
  check(ok, "batch 0 is a no-op");
}

// cuda_attention_backward_local's refusals: those of the forward plus lse and the gradients.
void backward_local_checks() {
  fc_attention_local_t s{};
  s.batch = 1;
  s.q_len = s.kv_len = 64;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.head_dim = 64;
  auto* p = reinterpret_cast<void*>(uintptr_t{1} << 20);
  auto* lse = reinterpret_cast<const float*>(p);
  auto run = [&](const fc_attention_local_t& x, DType t, void* dq, const float* l) {
    return [=] { fusedcomm::cuda_attention_backward_local(x, t, p, p, p, p, l, p, dq, p, p, nullptr); };
  };
  std::string m = refusal(run(s, DType::kF32, p, lse), "backward: f32 on the GPU");
  check(m.find("bf16") != std::string::npos && m.find("attentionBackward") != std::string::npos,
        "the backward's dtype refusal names the op and bf16: " + m);
  fc_attention_local_t x = s;
  x.head_dim = 256;
  m = refusal(run(x, DType::kBF16, p, lse), "backward: head_dim 256");
  check(m.find("head_dim 64 or 128") != std::string::npos, "the backward's head_dim refusal: " + m);
  x = s;
  x.q_heads = 7;
  refusal(run(x, DType::kBF16, p, lse), "backward: Hq % Hkv != 0");
  m = refusal(run(s, DType::kBF16, nullptr, lse), "backward: null dq");
  check(m.find("must not be null") != std::string::npos, "the null-gradient refusal: " + m);
  m = refusal(run(s, DType::kBF16, reinterpret_cast<void*>((uintptr_t{1} << 20) + 8), lse),
              "backward: misaligned dq");
  check(m.find("16-byte aligned") != std::string::npos, "the backward's alignment refusal: " + m);
  m = refusal(run(s, DType::kBF16, p, nullptr), "backward: no lse");
  check(m.find("lse") != std::string::npos, "the missing-lse refusal names lse: " + m);
  x = s;
  x.batch = 0;
  bool ok = true;
  try {
    run(x, DType::kBF16, p, lse)();
  } catch (const Error&) { ok = false; }
  check(ok, "backward: batch 0 is a no-op");
}

void kernel_bwd_checks() {
  namespace k = fusedcomm::kernels;
  auto* p = reinterpret_cast<void*>(uintptr_t{1} << 20);
  k::AttentionBwdArgs a;
  a.batch = 1;
  a.q_len = a.kv_len = 16;
  a.q_heads = a.kv_heads = 2;
  a.head_dim = 128;
  a.q = k::attn_dense(p, 16, 2, 128);
  a.k = a.v = a.o = a.d_o = a.q;
  a.lse = a.delta = static_cast<float*>(p);
  a.dq.ptr = a.dk.ptr = a.dv.ptr = p;
  a.dq_acc = static_cast<float*>(p);
  check(k::attention_bwd_check(a) == nullptr, "a dense backward passes the launcher's checks");
  k::AttentionBwdArgs b = a;
  b.lse = nullptr;
  check(k::attention_bwd_check(b) != nullptr, "a backward without lse is refused");
  b = a;
  b.dk.stride_s = 260;
  check(k::attention_bwd_check(b) != nullptr, "a gradient row stride off a multiple of 8 is refused");
  b = a;
  b.dq_path = 2;
  b.dq_acc = nullptr;
  check(k::attention_bwd_check(b) != nullptr, "dQ accumulated in fp32 without its workspace is refused");
  check(k::attention_bwd_dq_acc_bytes(b) == 16 * 2 * 128 * 4, "the dQ workspace: (B, q_len, Hq, D) fp32");
  b.mode = k::AttnGradMode::kAdd;
  check(k::attention_bwd_check(b) == nullptr && k::attention_bwd_dq_acc_bytes(b) == 0,
        "accumulating into fp32 gradients needs no dQ workspace");
  b = a;
  b.dq_path = 1;
  b.dq_acc = nullptr;
  check(k::attention_bwd_check(b) == nullptr, "the separate dQ pass needs no workspace");
  b = a;
  b.delta_ready = true;
  b.o.ptr = nullptr;
  check(k::attention_bwd_check(b) == nullptr, "a ready delta needs no o");
}

void kernel_checks() {
  namespace k = fusedcomm::kernels;
  k::AttentionArgs a;
  a.batch = 1;
  a.q_len = a.kv_len = 16;
  a.q_heads = a.kv_heads = 2;
  a.head_dim = 64;
  auto* p = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  a.q = k::attn_dense(p, 16, 2, 64);
  a.k = a.v = a.q;
  a.o = static_cast<__nv_bfloat16*>(const_cast<void*>(p));
  a.o_stride_h = 64;
  a.o_stride_s = 128;
  a.o_stride_b = 16 * 128;
  check(k::attention_check(a) == nullptr, "a dense shape passes the launcher's checks");
  k::AttentionArgs b = a;
  b.q.stride_s = 130;
  check(k::attention_check(b) != nullptr, "a row stride that is not a multiple of 8 elements is refused");
  b = a;
  b.acc = k::AttnAccum::kMerge;
  check(k::attention_check(b) != nullptr, "accumulation without o_acc and lse is refused");
  b = a;
  b.head_dim = 256;
  check(k::attention_check(b) != nullptr, "head_dim 256 is refused");
}

void layout_checks() {
  for (int w = 1; w <= 8; ++w) {
    for (int64_t seq : {0, 1, 5, 7, 16, 100, 1001}) {
      for (bool zigzag : {false, true}) {
        std::vector<int> seen(static_cast<size_t>(seq), 0);
        bool ordered = true;
        for (int r = 0; r < w; ++r) {
          const fusedcomm::SeqRuns c = fusedcomm::attention_seq_chunks(seq, w, r, zigzag);
          if (zigzag) {
            ordered = ordered && c.n == 2 && c.run[0].pos == fusedcomm::split_offset(seq, 2 * w, r) &&
                      c.run[1].pos == fusedcomm::split_offset(seq, 2 * w, 2 * w - 1 - r) &&
                      c.run[0].pos <= c.run[1].pos;
          } else {
            ordered = ordered && c.n == 1 && c.run[0].count == fusedcomm::split_count(seq, w, r);
          }
          for (const fusedcomm::SeqRun& x : c)
            for (int64_t i = x.pos; i < x.pos + x.count; ++i)
              if (i >= 0 && i < seq) ++seen[static_cast<size_t>(i)];
        }
        bool once = true;
        for (int n : seen) once = once && n == 1;
        const std::string what =
            "W=" + std::to_string(w) + " seq=" + std::to_string(seq) + (zigzag ? " zigzag" : " contiguous");
        check(once, what + ": every position held by exactly one rank");
        check(ordered, what + ": the layout's chunks");
      }
    }
  }
  fusedcomm::RingAttentionShape s;
  s.batch = 2;
  s.seq = 1001;
  s.q_heads = 8;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.zigzag = true;
  // Zigzag over W = 3: chunks of 167 (five) and 166 (the last); ranks 1 and 2 hold 334 rows.
  check(fusedcomm::ring_kv_slot_elems(s, 3) == 2 * 2 * 334 * 2 * 64,
        "the gathered slot fits the largest rank");
  s.head_dim = 96;
  refusal([&] { fusedcomm::require_ring_attention_shape(s); }, "ring head_dim 96");
}

// The ring's launch plan (ring_step_plan) over all W steps, for every rank: each query chunk
// meets exactly the key chunks it sees (all, or causal: those starting at or before its last
// row), each once, at the step whose owner holds it, at that chunk's rows in the owner's block;
// the first of them stores, the rest merge, only the last writes o; a query chunk that sees no
// key gets one launch at step 0 without keys that writes o.
void plan_checks() {
  for (int w = 1; w <= 8; ++w) {
    for (int64_t seq : {0, 1, 5, 7, 16, 100, 1001}) {
      for (int mode = 0; mode < 4; ++mode) {
        fusedcomm::RingAttentionShape s;
        s.batch = 1;
        s.seq = seq;
        s.q_heads = s.kv_heads = 1;
        s.head_dim = 64;
        s.zigzag = (mode & 1) != 0;
        s.causal = (mode & 2) != 0;
        const std::string what = "plan W=" + std::to_string(w) + " seq=" + std::to_string(seq) +
                                 (s.zigzag ? " zigzag" : " contiguous") + (s.causal ? " causal" : "");
        bool ok = true;
        for (int r = 0; r < w; ++r) {
          std::vector<fusedcomm::RingLaunch> all;
          for (int st = 0; st < w; ++st) {
            for (const fusedcomm::RingLaunch& l : fusedcomm::ring_step_plan(s, w, r, st)) {
              ok = ok && l.step == st;
              all.push_back(l);
            }
          }
          int64_t row0 = 0;
          for (const fusedcomm::SeqRun& qc : fusedcomm::attention_seq_chunks(seq, w, r, s.zigzag)) {
            if (qc.count == 0) continue;
            // The key chunks it must meet, by position, with their owner's step.
            std::vector<std::pair<int64_t, int>> want;  // (pos, step)
            for (int st = 0; st < w; ++st) {
              const int owner = (r - st + w) % w;
              for (const fusedcomm::SeqRun& kc : fusedcomm::attention_seq_chunks(seq, w, owner, s.zigzag)) {
                if (kc.count > 0 && (!s.causal || kc.pos <= qc.pos + qc.count - 1))
                  want.push_back({kc.pos, st});
              }
            }
            std::vector<fusedcomm::RingLaunch> got;
            for (const fusedcomm::RingLaunch& l : all) {
              if (l.q.pos == qc.pos && l.q.count == qc.count) {
                ok = ok && l.q_row0 == row0;
                got.push_back(l);
              }
            }
            if (want.empty()) {
              ok = ok && got.size() == 1 && got[0].step == 0 && got[0].key.count == 0 && got[0].writes_o &&
                   got[0].acc == 0;
            } else {
              ok = ok && got.size() == want.size();
              for (size_t i = 0; ok && i < got.size(); ++i) {
                const fusedcomm::RingLaunch& l = got[i];
                ok = ok && l.key.pos == want[i].first && l.step == want[i].second;
                ok = ok && l.acc == (i == 0 ? 1 : 2) && l.writes_o == (i + 1 == got.size());
                // The chunk's rows in its owner's block.
                const int owner = (r - l.step + w) % w;
                int64_t off = 0;
                bool found = false;
                for (const fusedcomm::SeqRun& kc : fusedcomm::attention_seq_chunks(seq, w, owner, s.zigzag)) {
                  if (kc.pos == l.key.pos && kc.count == l.key.count && kc.count > 0) {
                    found = off == l.k_row0;
                    break;
                  }
                  off += kc.count;
                }
                ok = ok && found && l.k_block_rows == fusedcomm::ring_block_rows(s, w, owner);
              }
            }
            row0 += qc.count;
          }
        }
        check(ok, what + ": every visible key chunk once, at its owner's step; store, merges, o last");
      }
    }
  }
}

}  // namespace

int main() {
  local_checks();
  backward_local_checks();
  kernel_checks();
  kernel_bwd_checks();
  layout_checks();
  plan_checks();
  return fusedcomm::testing::report("device_attention_args_test");
}
