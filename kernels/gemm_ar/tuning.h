// gemmAllReduce has no tuned values of its own: it runs gemmReduceScatter's fused kernel
// (gemm_rs/tuning.h) and the collectives (collectives/tuning.h), and its fused-vs-decomposed bar
// is in kernels/common/fused_choice.h with the other fused ops'. Chosen on H200 (2 and 4 GPUs,
// NVLink), as theirs.
#pragma once
