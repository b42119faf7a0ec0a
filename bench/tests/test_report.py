#!/usr/bin/env python3
"""bench/report.py on synthetic rows of every family: the stamped JSON, the markdown's ratios
and floors, repeated rows merged, JSON-array input, and the plot where matplotlib is present."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import report  # noqa: E402


def row(family, op, impl, world, shape, ms, **extra):
    r = dict(family=family, op=op, impl=impl, world=world, shape=shape, dtype="bf16", ms_median=ms,
             tflops=None, gbps=None)
    r.update(extra)
    return r


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def run_report(self, family, rows, *extra_files):
        path = os.path.join(self.dir, f"{family}-rows.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        out = os.path.join(self.dir, "out")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = report.main(["--family", family, "--out-dir", out, "--device", "NVIDIA H200 (nvidia-h200-x2)",
                              "--gpus", "2", "--commit", "abc1234", "--date", "2030-01-01 00:00 UTC", path,
                              *extra_files])
        self.assertEqual(rc, 0)
        with open(os.path.join(out, family + ".json")) as f:
            rows_out = json.load(f)
        with open(os.path.join(out, family + ".md")) as f:
            md = f.read()
        return out, rows_out, md

    def test_fused_ratios_floor_and_schema(self):
        shape = dict(m=8192, n=14336, k=8192)
        times = dict(fusedcomm=1.0, fusedcomm_fused=1.0, fusedcomm_decomposed=1.2, torch_serial=1.25,
                     torch_symm_mem=1.1, fusedcomm_gemm_only=0.9, cublas_gemm_only=0.95,
                     fusedcomm_comm_only=0.3, nccl_comm_only=0.25)
        rows = [row("fused", "allGatherGemm", impl, 2, shape, t, label="llama3-70b",
                    tflops=2 * 8192 * 14336 * 8192 / (t * 1e-3) / 1e12,
                    **({"algo": "fused"} if impl == "fusedcomm" else {})) for impl, t in times.items()]
        out, rows_out, md = self.run_report("fused", rows)
        self.assertEqual(len(rows_out), len(rows))
        keys = {"family", "op", "impl", "world", "shape", "dtype", "ms_median", "tflops", "gbps", "device",
                "gpus", "commit", "date"}
        for r in rows_out:
            self.assertTrue(keys <= set(r), keys - set(r))
            self.assertEqual(r["device"], "NVIDIA H200 (nvidia-h200-x2)")
            self.assertEqual(r["gpus"], 2)
        table = [l for l in md.splitlines() if l.startswith("| llama3-70b")]
        self.assertEqual(len(table), 1)
        cells = [c.strip() for c in table[0].strip("|").split("|")]
        # vs best baseline: 1.0 / min(1.25, 1.1); floor: max(min(0.9, 0.95), min(0.3, 0.25)) = 0.9.
        self.assertIn(f"{1.0 / 1.1:.3f}", cells)
        self.assertIn("0.9000", cells)
        self.assertIn(f"{1.0 / 0.9:.3f}", cells)
        self.assertEqual(cells[-1], "fused")
        self.assertIn("## allGatherGemm, 2 GPUs", md)
        self.assertNotIn("fusedcomm_gemm_only ms", md)  # the floor's parts are not columns

    def test_fused_across_hosts_against_our_decomposed_path(self):
        shape = dict(m=8192, n=7168, k=4096)
        rows = [row("fused", "allGatherGemm across hosts", impl, 2, shape, t, label="2 hosts x 1, socket")
                for impl, t in (("fusedcomm", 4.0), ("fusedcomm_decomposed", 5.0))]
        _, _, md = self.run_report("fused", rows)
        line = next(l for l in md.splitlines() if l.startswith("| 2 hosts x 1, socket"))
        # ours over our decomposed path (the op's only baseline), not over torch's absent rows
        self.assertIn("| 0.800 |", line)

    def test_fused_random_set_apart_and_the_choice_against_our_paths(self):
        # A set's rows tabulate apart from the headline shapes; the summary gives the automatic
        # choice's worst ratio to the faster of our forced paths (here 1.1 / 1.0 at the second
        # shape; the first chose the faster).
        rows = []
        for label, m, t in (("r100x512x768", 100, (1.0, 1.0, 1.3)), ("r9001x1032x4992", 9001, (1.1, 1.2, 1.0))):
            shape = dict(m=m, n=512, k=768)
            for impl, ms in zip(("fusedcomm", "fusedcomm_fused", "fusedcomm_decomposed"), t):
                rows.append(row("fused", "gemmReduceScatter", impl, 2, shape, ms, label=label, set="random-7"))
            rows.append(row("fused", "gemmReduceScatter", "torch_serial", 2, shape, 1.25, label=label, set="random-7"))
        rows.append(row("fused", "gemmReduceScatter", "fusedcomm", 2, dict(m=1, n=2, k=3), 1.0, label="llama3-8b"))
        _, _, md = self.run_report("fused", rows)
        self.assertIn("## gemmReduceScatter (random-7), 2 GPUs", md)
        self.assertIn("## gemmReduceScatter, 2 GPUs", md)
        line = next(l for l in md.splitlines() if l.startswith("| gemmReduceScatter (random-7) |"))
        self.assertTrue(line.rstrip().endswith("| 1.100 |"), line)
        headline = next(l for l in md.splitlines() if l.startswith("| gemmReduceScatter | 2 |"))
        self.assertTrue(headline.rstrip().endswith("| - |"), headline)  # no forced paths timed there

    def test_fused_rounds_and_partials_are_stated(self):
        shape = dict(m=2048, n=8192, k=14336)
        rows = [row("fused", "gemmReduceScatter", impl, 2, shape, t, label="llama3-70b", partials="bf16")
                for impl, t in (("fusedcomm", 1.0), ("fusedcomm", 1.1), ("torch_serial", 1.2), ("torch_serial", 1.3))]
        _, rows_out, md = self.run_report("fused", rows)
        self.assertEqual(len(rows_out), 2)
        self.assertIn("median of 2 rounds", md)
        self.assertIn("ours reduces bf16 partial products", md)

    def test_gemm_repeats_merge_and_json_array_input(self):
        shape = dict(m=8192, n=8192, k=8192, layout="nk")
        rows = [row("gemm", "gemm", "fusedcomm", 1, shape, t, label="square", tflops=1100 / t)
                for t in (1.0, 1.2, 1.1)]
        rows.append(row("gemm", "gemm", "cublas", 1, shape, 1.21, label="square", tflops=1100 / 1.21))
        earlier = os.path.join(self.dir, "earlier.json")
        with open(earlier, "w") as f:
            json.dump([row("gemm", "gemm", "cublas", 1, dict(shape, layout="kn"), 2.0, label="square")], f)
        _, rows_out, md = self.run_report("gemm", rows, earlier, os.path.join(self.dir, "missing.jsonl"))
        ours = [r for r in rows_out if r["impl"] == "fusedcomm"]
        self.assertEqual(len(ours), 1)
        self.assertAlmostEqual(ours[0]["ms_median"], 1.1)
        self.assertEqual(ours[0]["ms_repeats"], [1.0, 1.2, 1.1])
        self.assertAlmostEqual(ours[0]["tflops"], 1000.0)  # rescaled to the median time
        self.assertEqual(len(rows_out), 3)
        self.assertIn(f"| {1.1 / 1.21:.3f} |", md)
        self.assertIn("| square | 8192 | 8192 | 8192 | kn | - | 2.0000 |", md)

    def test_gemm_sets_get_their_own_tables(self):
        rows = []
        for sname, label, m, t in ((None, "square", 8192, 1.0), ("random-7", "r1000x4104x2056", 1000, 0.05)):
            shape = dict(m=m, n=4104, k=2056, layout="nk")
            extra = dict(set=sname) if sname else {}
            rows.append(row("gemm", "gemm", "fusedcomm", 1, shape, t, label=label, **extra))
            rows.append(row("gemm", "gemm", "cublas", 1, shape, 2 * t, label=label, **extra))
        _, _, md = self.run_report("gemm", rows)
        self.assertIn("## gemm, 1 GPU", md)
        self.assertIn("## gemm (random-7), 1 GPU", md)
        self.assertIn("| gemm (random-7) | 1 | 1 | 0.500 | 0.500 | 0.500 |", md)

    def test_collectives_and_transport_bytes(self):
        rows = []
        for b, t in ((4096, 0.01), (1 << 30, 3.0)):
            rows.append(row("collectives", "allReduce", "fusedcomm", 2, dict(bytes=b), t, gbps=b / t / 1e6,
                            algo="one-shot"))
            rows.append(row("collectives", "allReduce", "nccl", 2, dict(bytes=b), 2 * t, gbps=b / t / 2e6))
        _, _, md = self.run_report("collectives", rows)
        self.assertIn("| 4 KiB |", md)
        self.assertIn("| 1 GiB |", md)
        self.assertIn("| 0.500 |", md)
        self.assertIn("| allReduce | 2 | 2 | 0.500 | 0.500 | 0.500 |", md)
        rows = [row("transport", "write", impl, 2, dict(bytes=1 << 20), t, gbps=1.0 / t)
                for impl, t in (("fusedcomm", 0.2), ("tcp", 0.25))]
        _, _, md = self.run_report("transport", rows)
        self.assertIn(f"| 1 MiB | 0.2000 | 0.2500 | 5.0 | {0.2 / 0.25:.3f} |", md)

    def test_one_run_or_several_in_the_header(self):
        shape = dict(bytes=4096)
        rows = [row("collectives", "allReduce", impl, 2, shape, t) for impl, t in (("fusedcomm", 0.01), ("nccl", 0.02))]
        _, _, md = self.run_report("collectives", rows)
        self.assertIn("NVIDIA H200 (nvidia-h200-x2); commit abc1234; 2030-01-01 00:00 UTC.", md)
        # A part re-measured beside rows published before: every run named, with its rows.
        earlier = os.path.join(self.dir, "published.json")
        with open(earlier, "w") as f:
            json.dump([row("collectives", "allGather", impl, 2, shape, t, commit="0ld0ld0", date="2029-12-31 10:00 UTC",
                           device="NVIDIA H200 (nvidia-h200-x2)", gpus=2)
                       for impl, t in (("fusedcomm", 0.01), ("nccl", 0.03), ("fusedcomm", 0.02))], f)
        _, rows_out, md = self.run_report("collectives", rows, earlier)
        self.assertIn("rows from several runs: commit abc1234 (2030-01-01 00:00 UTC, 2 rows), "
                      "commit 0ld0ld0 (2029-12-31 10:00 UTC, 2 rows).", md)
        self.assertEqual({r["commit"] for r in rows_out}, {"abc1234", "0ld0ld0"})

    def test_allreduce_small_medium_eager_and_graph(self):
        # Per size: ours eager and graph, and the six baselines (ms). Sizes given out of order.
        impls = ("fusedcomm", "fusedcomm_graph", "nccl", "nccl_graph", "torch_symm_one_shot",
                 "torch_symm_one_shot_graph", "torch_symm_two_shot", "torch_symm_two_shot_graph")
        times = {
            1 << 25: (0.100, 0.101, 0.300, 0.290, None, 0.400, 0.102, 0.103),  # ours faster: yes
            4096: (0.0072, 0.0065, 0.038, 0.019, 0.0070, 0.0061, 0.009, 0.008),  # graph 6.6 % slower: no
            1 << 24: (0.0515, 0.0520, 0.150, 0.140, 0.200, 0.190, 0.0505, 0.0510),  # 2 % slower: a tie
        }
        rows = []
        for b, ts in times.items():
            for impl, t in zip(impls, ts):
                extra = dict(set="small-medium", algo="one-shot" if impl.startswith("fusedcomm") else None)
                if t is None:
                    extra["error"] = "raised RuntimeError('no')"
                rows.append(row("collectives", "allReduce", impl, 2, dict(bytes=b), t,
                                gbps=b / t / 1e6 if t else None, **extra))
        # The NCCL list's rows of the same family keep their own table and summary.
        rows.append(row("collectives", "allReduce", "fusedcomm", 2, dict(bytes=4096), 0.008, gbps=0.5,
                        algo="one-shot"))
        rows.append(row("collectives", "allReduce", "nccl", 2, dict(bytes=4096), 0.040, gbps=0.1))
        _, rows_out, md = self.run_report("collectives", rows)
        self.assertEqual(len(rows_out), len(rows))
        self.assertIn("## allReduce, 2 GPUs", md)
        self.assertIn("| allReduce | 2 | 1 | 0.200 | 0.200 | 0.200 |", md)
        self.assertIn("## allReduce (small-medium), 2 GPUs: eager and CUDA graph", md)
        self.assertIn("one_shot_all_reduce", md)  # the protocol says what the set compares
        lines = [l for l in md.splitlines() if l.startswith("| ") and ("KiB" in l or "MiB" in l)]
        small = [l for l in lines if l.count("|") > 12]
        self.assertEqual([l.split("|")[1].strip() for l in small], ["4 KiB", "16 MiB", "32 MiB"])  # sorted
        cells = [[c.strip() for c in l.strip("|").split("|")] for l in small]
        head = [l for l in md.splitlines() if l.startswith("| bytes | fusedcomm ms | fusedcomm_graph ms | nccl ms |")]
        self.assertEqual(len(head), 1)
        cols = [c.strip() for c in head[0].strip("|").split("|")]
        at = {name: i for i, name in enumerate(cols)}
        self.assertEqual(cols[1:9], [f"{i} ms" for i in ("fusedcomm", "fusedcomm_graph", "nccl",
                                                         "torch_symm_one_shot", "torch_symm_two_shot", "nccl_graph",
                                                         "torch_symm_one_shot_graph", "torch_symm_two_shot_graph")])
        k4, k16, k32 = cells
        # 4 KiB: eager 0.0072 / 0.0070, graph 0.0065 / 0.0061, best of ours 0.0065 / 0.0061.
        self.assertEqual(k4[at["eager: ours / best eager"]], f"{0.0072 / 0.0070:.3f}")
        self.assertEqual(k4[at["graph: ours / best graph"]], f"{0.0065 / 0.0061:.3f}")
        self.assertEqual(k4[at["best ours / best of all"]], f"{0.0065 / 0.0061:.3f}")
        self.assertEqual(k4[at["best baseline"]], "torch_symm_one_shot_graph")
        self.assertEqual(k4[at["<= 1.0x (tie <= 1.03)"]], "no")
        self.assertEqual(k4[at["ours ran"]], "one-shot")
        self.assertEqual(k16[at["best ours / best of all"]], f"{0.0515 / 0.0505:.3f}")
        self.assertEqual(k16[at["<= 1.0x (tie <= 1.03)"]], "tie (<= 1.03)")
        # 32 MiB: the one-shot eager row has an error and no time: "-", and the next best is used.
        self.assertEqual(k32[at["torch_symm_one_shot ms"]], "-")
        self.assertEqual(k32[at["eager: ours / best eager"]], f"{0.100 / 0.102:.3f}")
        self.assertEqual(k32[at["<= 1.0x (tie <= 1.03)"]], "yes")
        self.assertIn("## Errors", md)
        self.assertIn("- allReduce torch_symm_one_shot W=2", md)
        # The set's summary: geomeans and worst ratios; 2 of 3 sizes at the target (yes, tie).
        summary = [l for l in md.splitlines() if l.startswith("| allReduce (small-medium) | 2 | 3 |")]
        self.assertEqual(len(summary), 1)
        s = [c.strip() for c in summary[0].strip("|").split("|")]
        best = [0.0065 / 0.0061, 0.0515 / 0.0505, 0.100 / 0.102]
        self.assertEqual(s[7], f"{report.geomean(best):.3f}")
        self.assertEqual(s[8], f"{max(best):.3f}")
        self.assertEqual(s[9], "2 of 3")
        self.assertLess(md.index("## Summary"), md.index("### allReduce small and medium"))

    def test_verdict(self):
        self.assertEqual(report.verdict(0.99), "yes")
        self.assertEqual(report.verdict(1.0), "yes")
        self.assertEqual(report.verdict(1.03), "tie (<= 1.03)")
        self.assertEqual(report.verdict(1.031), "no")
        self.assertEqual(report.verdict(None), "-")

    def test_moe_ratio_to_grouped_mm_and_to_dense(self):
        shape = dict(experts=64, rows=8192, rows_per_expert=128, n=2048, k=7168, routing="balanced",
                     layout="nk", empty=0, max_rows=128)
        rows = [row("moe", "groupedGemm", impl, 1, shape, t, label="ds_up_w4")
                for impl, t in (("fusedcomm", 1.0), ("torch_grouped_mm", 1.25), ("cublas_dense", 0.8))]
        _, _, md = self.run_report("moe", rows)
        self.assertIn("## groupedGemm, 1 GPU", md)
        self.assertIn("| vs best baseline | vs cublas_dense |", md)
        # ours / torch._grouped_mm = 0.8 (the baseline), ours / dense = 1.25 (a ceiling, not a baseline)
        self.assertIn("| 0.800 | 1.250 |", md)
        self.assertIn("| groupedGemm | 1 | 1 | 0.800 | 0.800 | 0.800 |", md)

    def test_moe_layer_ops_have_their_own_columns(self):
        shape = dict(tokens=4096, hidden=7168, ffn=2048, experts=256, topk=8, routing="uniform", rows=16384)
        rows = [row("moe", op, impl, 2, shape, t, label="deepseek_v3")
                for op, impl, t in (("moeDispatchGemm", "fusedcomm", 1.0), ("moeDispatchGemm", "fusedcomm_gemm_only", 0.6),
                                    ("moeDispatchGemm", "fusedcomm_dispatch_only", 0.5),
                                    ("moeDispatchGemm", "torch_a2a_grouped_mm", 2.0),
                                    ("moeCombine", "fusedcomm", 0.3), ("moeCombine", "torch_a2a", 0.6))]
        _, _, md = self.run_report("moe", rows)
        self.assertIn("## moeDispatchGemm, 2 GPUs", md)
        self.assertIn("| shape | tokens | hidden | ffn | experts | topk | routing | fusedcomm ms |", md)
        self.assertIn("| deepseek_v3 | 4096 | 7168 | 2048 | 256 | 8 | uniform | 1.0000 |", md)
        self.assertIn("| moeDispatchGemm | 2 | 1 | 0.500 | 0.500 | 0.500 |", md)
        self.assertIn("| moeCombine | 2 | 1 | 0.500 | 0.500 | 0.500 |", md)

    def test_ring_tables_against_the_torch_ring_and_our_1gpu_backward(self):
        shape = dict(batch=1, s=32768, q_heads=16, kv_heads=16, d=128, causal=True, layout="zigzag")
        rows = [row("attention", op, impl, 2, shape, t, label="ring-s32k-d128-c", **extra)
                for op, impl, t, extra in (
                    ("ringAttention", "fusedcomm", 2.0, dict(algo="persistent")),
                    ("ringAttention", "fusedcomm_persistent", 2.0, {}),
                    ("ringAttention", "fusedcomm_steps", 2.1, {}),
                    ("ringAttention", "torch_ring", 4.0, dict(algo="flash")),
                    ("ringAttention", "torch_ring_flash", 4.0, {}),
                    ("ringAttention", "torch_ring_cudnn", 5.0, {}),
                    ("ringAttentionBackward", "fusedcomm", 6.0, {}),
                    ("ringAttentionBackward", "fusedcomm_1gpu", 5.0, {}),
                    ("ringAttentionBackward", "torch_ring", 10.0, dict(algo="cudnn")))]
        # A 1-GPU row of the same family keeps its own table and columns.
        rows.append(row("attention", "attention", "fusedcomm", 1, dict(batch=4, s=16384, q_heads=16, kv_heads=16,
                                                                      d=128, causal=False), 1.0, label="s16k-d128"))
        rows.append(row("attention", "attention", "torch_sdpa_cudnn", 1, dict(batch=4, s=16384, q_heads=16,
                                                                             kv_heads=16, d=128, causal=False), 1.1,
                        label="s16k-d128"))
        _, _, md = self.run_report("attention", rows)
        self.assertIn("## ringAttention, 2 GPUs", md)
        self.assertIn("## ringAttentionBackward, 2 GPUs", md)
        self.assertIn("| shape | batch | s | q_heads | kv_heads | d | causal | layout | fusedcomm ms | "
                      "fusedcomm_persistent ms | fusedcomm_steps ms | torch_ring ms | torch_ring_cudnn ms | "
                      "torch_ring_flash ms |", md)
        # backward: ours / torch ring = 0.6, ours / our 1-GPU backward at the same work = 1.2
        self.assertIn("| ring-s32k-d128-c | 1 | 32768 | 16 | 16 | 128 | True | zigzag | 6.0000 | 10.0000 | "
                      "5.0000 | - | 0.600 | 1.200 |", md)
        self.assertIn("| ringAttention | 2 | 1 | 0.500 | 0.500 | 0.500 |", md)
        self.assertIn("| ringAttentionBackward | 2 | 1 | 0.600 | 0.600 | 0.600 |", md)
        self.assertIn("| s16k-d128 | 4 | 16384 | 16 | 16 | 128 | False | 1.0000 | 1.1000 |", md)
        self.assertEqual(md.count("fusedcomm_1gpu ms"), 1)

    def test_plot_where_matplotlib_is_present(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib missing: the report skips its plot")
        rows = [row("collectives", "allGather", impl, 2, dict(bytes=b), 1.0, gbps=float(b) / 1e9)
                for impl in ("fusedcomm", "nccl") for b in (4096, 65536)]
        out, _, _ = self.run_report("collectives", rows)
        self.assertGreater(os.path.getsize(os.path.join(out, "collectives.png")), 1000)


if __name__ == "__main__":
    unittest.main()
