package io.fusedcomm.api;

import io.fusedcomm.errors.CommTimeoutException;
import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.internal.bootstrap.Fingerprint;
import io.fusedcomm.internal.bootstrap.HostLayout;
import io.fusedcomm.internal.bootstrap.RankInfo;
import io.fusedcomm.internal.metrics.CommMetrics;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.runtime.LeakTracker;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.IntToLongFunction;
import java.util.function.Supplier;
import org.apache.spark.BarrierTaskContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A communicator among the tasks of one barrier stage: rank = the task's partition id, world =
 * the number of tasks. It is built with exactly one {@code BarrierTaskContext.allGather} (see
 * {@link #create(BarrierTaskContext, CommOptions)}) and runs the ops of docs/ops.md on the
 * executor runtime's backend.
 *
 * <p>Contract shared by every op: all ranks call the same ops in the same order with the same
 * global parameters (op, dtype, global shapes); each op checks that across ranks and fails on
 * every rank, naming the rank that differs. Arguments are validated before any data moves. Every
 * wait is bounded by {@code spark.fusedcomm.timeout}; a rank that dies or leaves makes the others
 * fail with the peer named. After an error the communicator is unusable; close it.
 *
 * <p>Teardown verbs: {@link #finish()} waits until every rank has finished its ops; {@link
 * #close()} finishes and frees (always use try-with-resources); {@link #abort()} stops now from
 * any thread, failing ops in flight.
 *
 * <p>Backends: with the host backend ops take {@link HostTensor}s and run on the CPU. With the
 * cuda backend the collectives (allGather, reduceScatter, allReduce, allToAll) take {@link
 * DeviceTensor}s on the executor's GPU and run as GPU-driven kernels over NVLink among the GPUs
 * of one host; each has a form that enqueues on the caller's CUDA stream, given as the raw {@code
 * cudaStream_t} handle any CUDA user has (a {@code long}: PyTorch, cuDF, RMM) or as a JCuda stream.
 * The forms without a stream run on the communicator's own stream, which is ordered after work
 * the caller issued on the legacy default stream (e.g. a {@code cudaMemcpy}), and return when the
 * op is done.
 * allGatherGemm and gemmReduceScatter run there too (bf16, also on the caller's stream; one fused
 * kernel or our GEMM then our collective, chosen by size the same way on every rank). The other ops are not
 * on the cuda backend yet and refuse with {@link
 * io.fusedcomm.errors.BackendUnavailableException}.
 *
 * <p>Across hosts (cuda backend): the ranks of each host share NVLink, and each rank reaches its
 * counterparts on the other hosts through the GPU-driven proxy and the transport (the same number
 * of ranks on every host, at most 8 hosts).
 * allReduce, allGather, reduceScatter and allToAll run there, hierarchically (docs/ops.md,
 * "Collectives across hosts"; bf16 sums are rounded once per host and once across hosts), and the
 * fused ops by their decomposed path (the hierarchical collective and our GEMM);
 * {@code spark.fusedcomm.cuda.virtualHosts} splits one machine's ranks into virtual hosts to
 * exercise this path.
 *
 * <p>Threads: call the ops of one communicator from one thread at a time (every rank must call
 * them in the same order, and calls that overlap have no order); a second thread that enters an
 * op while another is in one gets an {@link IllegalStateException}. Each op holds the tensors it
 * is given until it returns: a tensor closed meanwhile on another thread is freed only then, and
 * a closed tensor is refused. {@link #abort()} and {@link #close()} may come from any thread.
 */
public final class Communicator implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(Communicator.class);
  /** Fused-op paths remembered per communicator (by op and sizes), for the metrics. */
  private static final int MAX_REMEMBERED_PATHS = 64;

  private final ExecutorRuntime runtime;
  private final String name;
  private final int rank;
  private final int world;
  private final List<RankInfo> ranks;
  private final HostLayout hosts;
  private final long leakId;
  private final ExecutorRuntime.Lease lease;
  private final NativeHandle handle;
  private final Object lock = new Object();
  /** The op call in progress, if any: at most one at a time. */
  private final AtomicReference<OpCall> inOp = new AtomicReference<>();
  private final CommMetrics metrics;
  /** How this rank reaches each peer (its own entry unused). */
  private final CommMetrics.Link[] links;
  private final long symmetricBytes;
  private final AtomicLong opNanos = new AtomicLong();
  /** Fused-op path by op and sizes: true when fused; guarded by {@link #lock}. */
  private final Map<String, Boolean> fusedPaths =
      new LinkedHashMap<>(16, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, Boolean> eldest) {
          return size() > MAX_REMEMBERED_PATHS;
        }
      };

  /**
   * The native communicator, shared by {@link #abort} (any thread, or the runtime's close through
   * the lease) and the one close that frees it: {@link #take} zeroes it under the lock before the
   * caller frees it, so an abort never reaches freed memory.
   */
  static final class NativeHandle {
    private volatile long value;

    NativeHandle(long value) {
      this.value = value;
    }

    long get() {
      return value;
    }

    synchronized void abort() {
      if (value != 0) {
        NativeOps.commAbort(value);
      }
    }

    /** The handle, zero from now on here (0 if already taken); the caller frees it. */
    synchronized long take() {
      long h = value;
      value = 0;
      return h;
    }
  }

  /** Made by {@link CommBootstrap} once every rank is connected. */
  Communicator(ExecutorRuntime runtime, ExecutorRuntime.Lease lease, NativeHandle handle, String name, int rank,
               int world, List<RankInfo> ranks, HostLayout hosts) {
    this.runtime = runtime;
    this.name = name;
    this.lease = lease;
    this.hosts = hosts;
    this.handle = handle;
    this.rank = rank;
    this.world = world;
    this.ranks = List.copyOf(ranks);
    this.metrics = runtime.metrics();
    this.links = links(runtime.backend(), hosts.hostIds(), rank);
    this.symmetricBytes = NativeOps.commSymmetricBytes(handle.get());
    this.leakId = LeakTracker.opened("Communicator(rank " + rank + " of " + world + ")");
    metrics.opened(symmetricBytes);
  }

  /** NVLink to the peers of this rank's host on the cuda backend; the transport otherwise. */
  static CommMetrics.Link[] links(Backend backend, int[] hostIds, int rank) {
    CommMetrics.Link[] out = new CommMetrics.Link[hostIds.length];
    for (int p = 0; p < hostIds.length; p++) {
      out[p] = backend == Backend.CUDA && hostIds[p] == hostIds[rank] ? CommMetrics.Link.NVLINK
          : CommMetrics.Link.NETWORK;
    }
    return out;
  }

  /** GPU memory this communicator holds as symmetric memory (0 on the host backend). */
  long symmetricBytes() {
    return symmetricBytes;
  }

  /** The links this communicator uses, for its log line: e.g. {@code nvlink+network}. */
  String linkSummary() {
    boolean nvlink = false;
    boolean network = false;
    for (int p = 0; p < world; p++) {
      if (p != rank) {
        nvlink |= links[p] == CommMetrics.Link.NVLINK;
        network |= links[p] == CommMetrics.Link.NETWORK;
      }
    }
    return nvlink && network ? "nvlink+network" : nvlink ? "nvlink" : network ? "network" : "none (world 1)";
  }

  /** {@link #create(BarrierTaskContext, CommOptions)} with default options. */
  public static Communicator create(BarrierTaskContext context) {
    return create(context, CommOptions.defaults());
  }

  /**
   * Builds the communicator of this barrier task on the executor's runtime (started by the
   * plugin: {@code --conf spark.plugins=io.fusedcomm.FusedCommPlugin}). Calls {@code
   * context.allGather} exactly once. A task that fails or is killed aborts its communicator, so
   * the other ranks fail fast instead of waiting for the timeout.
   *
   * @throws io.fusedcomm.errors.BackendUnavailableException when the plugin could not start on
   *     this executor (e.g. {@code backend=cuda} without a usable GPU), with the reason
   */
  public static Communicator create(BarrierTaskContext context, CommOptions options) {
    ExecutorRuntime runtime = ExecutorRuntime.current().orElseThrow(() -> ExecutorRuntime.startFailure()
        .<RuntimeException>map(reason -> new io.fusedcomm.errors.BackendUnavailableException(
            "fusedcomm could not start on executor " + org.apache.spark.SparkEnv.get().executorId() + ": " + reason))
        .orElseGet(() -> new IllegalStateException(
            "the fusedcomm plugin is not running on this executor: start the application"
                + " with --conf spark.plugins=io.fusedcomm.FusedCommPlugin and the fusedcomm"
                + " jar in --jars")));
    BarrierContextExchange exchange = new BarrierContextExchange(context, options.name());
    Communicator comm = CommBootstrap.bootstrap(runtime, exchange, options, exchange::watchBootstrap);
    exchange.watch(comm);
    return comm;
  }

  /** This rank. */
  public int rank() {
    return rank;
  }

  /** Number of ranks. */
  public int world() {
    return world;
  }

  /** The backend the ops run on ({@link Backend#HOST} or {@link Backend#CUDA}). */
  public Backend backend() {
    return runtime.backend();
  }

  /** The communicator's name ({@link CommOptions#name(String)}). */
  public String name() {
    return name;
  }

  /** Where each rank runs (host, executor, GPU), by rank. */
  public List<RankPlacement> placements() {
    return ranks.stream()
        .map(r -> new RankPlacement(r.rank(), r.host(), r.executorId(), r.gpuId(), r.gpuUuid()))
        .toList();
  }

  /** Which (virtual) host each rank is on, as the cuda backend connects them. */
  HostLayout hosts() {
    return hosts;
  }

  /** What every rank announced at bootstrap, secrets included: internal. */
  List<RankInfo> ranks() {
    return ranks;
  }

  // ---- collectives ---------------------------------------------------------------------------

  /**
   * Gathers every rank's block: {@code in} holds {@code Split.count(n, world, rank)} elements,
   * {@code out} all {@code n = out.numel()}, blocks in rank order. Returns when done.
   */
  public void allGather(Tensor in, Tensor out) {
    allGather(in, out, 0L);
  }

  /**
   * {@link #allGather(Tensor, Tensor, long)} on a JCuda stream: {@code stream} is a {@code
   * jcuda.runtime.cudaStream_t} or {@code jcuda.driver.CUstream} (null: no stream, the op runs
   * synchronously). Declared as {@code Object} so that code without JCuda on its classpath
   * compiles against this class.
   */
  public void allGather(Tensor in, Tensor out, Object stream) {
    allGather(in, out, JCudaInterop.stream(stream));
  }

  /**
   * {@link #allGather(Tensor, Tensor)} enqueued on a CUDA stream of the caller (cuda backend,
   * device tensors): returns once enqueued; see {@link #synchronize()} for errors. {@code stream}
   * is the raw {@code cudaStream_t} handle from any CUDA user (PyTorch's {@code
   * torch.cuda.current_stream().cuda_stream}, cuDF's {@code Cuda.Stream.getStream()}, a JCuda
   * stream through the {@code cudaStream_t} form); it must be a live stream of the
   * communicator's GPU (the GPU is checked), and stay alive until the op has run on it. 0 (the
   * legacy default stream's handle) runs the op synchronously, as the form without a stream.
   */
  public void allGather(Tensor in, Tensor out, long stream) {
    try (OpCall call = enter("allGather", stream)) {
      OpCheck c = check("allGather").floating("in", in).same("out", out, in).stream(stream);
      long n = out.numel();
      c.numel("in", in, Split.count(n, world, rank));
      Fingerprint fp = c.fingerprint().add("count", n).build();
      long es = in.dtype().bytes();
      runNative(call, p -> Split.count(n, world, rank) * es, p -> Split.count(n, world, p) * es,
          () -> NativeOps.allGather(handle(), fp.description(), fp.value(), in.dtype().code(), call.address(in),
              call.address(out), n, stream));
    }
  }

  /**
   * Sums {@code in} ({@code n} elements, the same {@code n} on every rank) over ranks and leaves
   * this rank's block ({@code Split.count(n, world, rank)} elements) in {@code out}.
   */
  public void reduceScatter(Tensor in, Tensor out) {
    reduceScatter(in, out, 0L);
  }

  /**
   * {@link #reduceScatter(Tensor, Tensor, long)} on a JCuda stream (see {@link #allGather(Tensor,
   * Tensor, Object)}).
   */
  public void reduceScatter(Tensor in, Tensor out, Object stream) {
    reduceScatter(in, out, JCudaInterop.stream(stream));
  }

  /** {@link #reduceScatter(Tensor, Tensor)} enqueued on a CUDA stream (see {@link #allGather(Tensor, Tensor, long)}). */
  public void reduceScatter(Tensor in, Tensor out, long stream) {
    try (OpCall call = enter("reduceScatter", stream)) {
      OpCheck c = check("reduceScatter").floating("in", in).same("out", out, in).stream(stream);
      long n = in.numel();
      c.numel("out", out, Split.count(n, world, rank));
      Fingerprint fp = c.fingerprint().add("count", n).build();
      long es = in.dtype().bytes();
      runNative(call, p -> Split.count(n, world, p) * es, p -> Split.count(n, world, rank) * es,
          () -> NativeOps.reduceScatter(handle(), fp.description(), fp.value(), in.dtype().code(),
              call.address(in), call.address(out), n, stream));
    }
  }

  /** Sums {@code in} over ranks into {@code out} (same element count; may be the same tensor). */
  public void allReduce(Tensor in, Tensor out) {
    allReduce(in, out, 0L);
  }

  /**
   * {@link #allReduce(Tensor, Tensor, long)} on a JCuda stream (see {@link #allGather(Tensor,
   * Tensor, Object)}).
   */
  public void allReduce(Tensor in, Tensor out, Object stream) {
    allReduce(in, out, JCudaInterop.stream(stream));
  }

  /** {@link #allReduce(Tensor, Tensor)} enqueued on a CUDA stream (see {@link #allGather(Tensor, Tensor, long)}). */
  public void allReduce(Tensor in, Tensor out, long stream) {
    try (OpCall call = enter("allReduce", stream)) {
      OpCheck c = check("allReduce").floating("in", in).same("out", out, in).stream(stream);
      c.numel("out", out, in.numel());
      Fingerprint fp = c.fingerprint().add("count", in.numel()).build();
      long n = in.numel();
      long es = in.dtype().bytes();
      // A reduceScatter then an allGather of the sums: the same bytes each way.
      IntToLongFunction each = p -> (Split.count(n, world, p) + Split.count(n, world, rank)) * es;
      runNative(call, each, each, () -> NativeOps.allReduce(handle(), fp.description(), fp.value(),
          in.dtype().code(), call.address(in), call.address(out), n, stream));
    }
  }

  /**
   * Personalised exchange: {@code in} ({@code n} elements) is cut into {@code world} blocks by
   * {@link Split}; block p goes to rank p. {@code out} receives block {@code rank} of every rank,
   * in rank order: {@code world · Split.count(n, world, rank)} elements.
   */
  public void allToAll(Tensor in, Tensor out) {
    allToAll(in, out, 0L);
  }

  /**
   * {@link #allToAll(Tensor, Tensor, long)} on a JCuda stream (see {@link #allGather(Tensor,
   * Tensor, Object)}).
   */
  public void allToAll(Tensor in, Tensor out, Object stream) {
    allToAll(in, out, JCudaInterop.stream(stream));
  }

  /** {@link #allToAll(Tensor, Tensor)} enqueued on a CUDA stream (see {@link #allGather(Tensor, Tensor, long)}). */
  public void allToAll(Tensor in, Tensor out, long stream) {
    try (OpCall call = enter("allToAll", stream)) {
      OpCheck c = check("allToAll").floating("in", in).same("out", out, in).stream(stream);
      long n = in.numel();
      c.numel("out", out, world * Split.count(n, world, rank));
      Fingerprint fp = c.fingerprint().add("count", n).build();
      long es = in.dtype().bytes();
      runNative(call, p -> Split.count(n, world, p) * es, p -> Split.count(n, world, rank) * es,
          () -> NativeOps.allToAll(handle(), fp.description(), fp.value(), in.dtype().code(), call.address(in),
              call.address(out), n, stream));
    }
  }

  /**
   * Waits for every op this communicator enqueued on CUDA streams and throws the first failure
   * (e.g. {@link io.fusedcomm.errors.CommTimeoutException} naming the peer that never arrived).
   * A no-op with the host backend, whose ops are synchronous.
   */
  public void synchronize() {
    synchronized (lock) {
      NativeOps.commSynchronize(handle());
    }
  }

  /** {@link #synchronize()} unless closed (a close has drained the ops already). */
  void synchronizeIfOpen() {
    synchronized (lock) {
      long h = handle.get();
      if (h != 0) {
        NativeOps.commSynchronize(h);
      }
    }
  }

  /** Native-initiated timing of a collective: the reference for the Java layer's per-op cost (tests). */
  long timeNative(Op op, Tensor in, Tensor out, long count, int iters) {
    try (OpCall call = enter(op.label(), 0)) {
      synchronized (lock) {
        return NativeOps.commTimeCollective(handle(), op.code(), in.dtype().code(), call.address(in),
            call.address(out), count, iters);
      }
    }
  }

  // ---- fused GEMM + communication ----------------------------------------------------------

  /** {@link #allGatherGemm(Tensor, Tensor, Tensor, Tensor, WeightLayout)} without gathered A. */
  public void allGatherGemm(Tensor aLocal, Tensor w, Tensor c, WeightLayout layout) {
    allGatherGemm(aLocal, w, c, null, layout);
  }

  /**
   * {@code c = allGather(aLocal) · op(w)}: {@code aLocal: Split.count(M) × K}, {@code w: N_r × K}
   * ({@link WeightLayout#NK}) or {@code K × N_r} ({@link WeightLayout#KN}), {@code c: M × N_r};
   * {@code gatheredA} ({@code M × K}, may be null) receives the gathered A for a backward pass.
   */
  public void allGatherGemm(Tensor aLocal, Tensor w, Tensor c, Tensor gatheredA, WeightLayout layout) {
    allGatherGemm(aLocal, w, c, gatheredA, layout, 0L);
  }

  /**
   * {@link #allGatherGemm(Tensor, Tensor, Tensor, Tensor, WeightLayout, long)} on a JCuda stream
   * (see {@link #allGather(Tensor, Tensor, Object)}).
   */
  public void allGatherGemm(Tensor aLocal, Tensor w, Tensor c, Tensor gatheredA, WeightLayout layout,
                            Object stream) {
    allGatherGemm(aLocal, w, c, gatheredA, layout, JCudaInterop.stream(stream));
  }

  /**
   * {@link #allGatherGemm(Tensor, Tensor, Tensor, Tensor, WeightLayout)} enqueued on a CUDA
   * stream of the caller (cuda backend, device tensors): returns once enqueued; see {@link
   * #synchronize()} for errors, and {@link #allGather(Tensor, Tensor, long)} for the stream.
   */
  public void allGatherGemm(Tensor aLocal, Tensor w, Tensor c, Tensor gatheredA, WeightLayout layout,
                            long stream) {
    try (OpCall call = enter("allGatherGemm", stream)) {
      OpCheck k = check("allGatherGemm").floating("aLocal", aLocal).same("w", w, aLocal).same("c", c, aLocal)
          .stream(stream);
      k.rank2("aLocal", aLocal).rank2("w", w).rank2("c", c).layout(layout);
      long m = c.dim(0);
      long kDim = aLocal.dim(1);
      long nLocal = c.dim(1);
      k.dim("aLocal", aLocal, 0, Split.count(m, world, rank)).weight(w, layout, nLocal, kDim);
      if (gatheredA != null) {
        k.same("gatheredA", gatheredA, aLocal).rank2("gatheredA", gatheredA);
        k.dim("gatheredA", gatheredA, 0, m).dim("gatheredA", gatheredA, 1, kDim);
      }
      Fingerprint fp = k.fingerprint().add("M", m).add("K", kDim).add("layout", layout.name()).build();
      Boolean fused = runsFused(Op.ALL_GATHER_GEMM, m, nLocal, kDim, PartialPrecision.F32);
      long row = kDim * aLocal.dtype().bytes();
      runNative(call, p -> Split.count(m, world, rank) * row, p -> Split.count(m, world, p) * row,
          () -> NativeOps.allGatherGemm(handle(), fp.description(), fp.value(), aLocal.dtype().code(),
              call.address(aLocal), call.address(w), call.address(c), call.address(gatheredA), m, nLocal, kDim,
              layout.code(), stream));
      countPath("allGatherGemm", fused);
    }
  }

  /**
   * Row block {@code rank} of {@code Σ_s a_s · op(w_s)}: {@code a: M × K_r}, {@code w: N × K_r}
   * (NK) or {@code K_r × N} (KN), {@code c: Split.count(M) × N}; fp32 partial products.
   */
  public void gemmReduceScatter(Tensor a, Tensor w, Tensor c, WeightLayout layout) {
    gemmReduceScatter(a, w, c, layout, PartialPrecision.F32);
  }

  /**
   * As {@link #gemmReduceScatter(Tensor, Tensor, Tensor, WeightLayout)}, with the partial
   * products kept and exchanged in {@code partials} precision (the same on every rank).
   */
  public void gemmReduceScatter(Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials) {
    gemmReduceScatter(a, w, c, layout, partials, 0L);
  }

  /**
   * {@link #gemmReduceScatter(Tensor, Tensor, Tensor, WeightLayout, PartialPrecision, long)} on a
   * JCuda stream (see {@link #allGather(Tensor, Tensor, Object)}).
   */
  public void gemmReduceScatter(Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials,
                                Object stream) {
    gemmReduceScatter(a, w, c, layout, partials, JCudaInterop.stream(stream));
  }

  /**
   * {@link #gemmReduceScatter(Tensor, Tensor, Tensor, WeightLayout, PartialPrecision)} enqueued
   * on a CUDA stream (see {@link #allGather(Tensor, Tensor, long)}).
   */
  public void gemmReduceScatter(Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials,
                                long stream) {
    gemmReduce("gemmReduceScatter", a, w, c, layout, partials, stream);
  }

  /**
   * {@code c = Σ_s a_s · op(w_s)} on every rank, the same bits on every rank: shapes as
   * gemmReduceScatter, {@code c: M × N}; fp32 partial products.
   */
  public void gemmAllReduce(Tensor a, Tensor w, Tensor c, WeightLayout layout) {
    gemmAllReduce(a, w, c, layout, PartialPrecision.F32);
  }

  /**
   * As {@link #gemmAllReduce(Tensor, Tensor, Tensor, WeightLayout)}, with the partial products
   * kept and exchanged in {@code partials} precision (the same on every rank).
   */
  public void gemmAllReduce(Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials) {
    gemmAllReduce(a, w, c, layout, partials, 0L);
  }

  /**
   * {@link #gemmAllReduce(Tensor, Tensor, Tensor, WeightLayout, PartialPrecision, long)} on a JCuda
   * stream (see {@link #allGather(Tensor, Tensor, Object)}).
   */
  public void gemmAllReduce(Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials,
                            Object stream) {
    gemmAllReduce(a, w, c, layout, partials, JCudaInterop.stream(stream));
  }

  /**
   * {@link #gemmAllReduce(Tensor, Tensor, Tensor, WeightLayout, PartialPrecision)} enqueued on a
   * CUDA stream (see {@link #allGather(Tensor, Tensor, long)}).
   */
  public void gemmAllReduce(Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials,
                            long stream) {
    gemmReduce("gemmAllReduce", a, w, c, layout, partials, stream);
  }

  private void gemmReduce(String op, Tensor a, Tensor w, Tensor c, WeightLayout layout, PartialPrecision partials,
                          long stream) {
    try (OpCall call = enter(op, stream)) {
      if (partials == null) {
        throw new IllegalArgumentException(op + ": partials must not be null");
      }
      boolean scatter = op.equals("gemmReduceScatter");
      OpCheck k = check(op).floating("a", a).same("w", w, a).same("c", c, a).stream(stream);
      k.rank2("a", a).rank2("w", w).rank2("c", c).layout(layout);
      long m = a.dim(0);
      long kLocal = a.dim(1);
      long n = c.dim(1);
      k.weight(w, layout, n, kLocal).dim("c", c, 0, scatter ? Split.count(m, world, rank) : m);
      Fingerprint fp = k.fingerprint().add("M", m).add("N", n).add("layout", layout.name())
          .add("partials", partials.name()).build();
      Boolean fused = runsFused(scatter ? Op.GEMM_REDUCE_SCATTER : Op.GEMM_ALL_REDUCE, m, n, kLocal, partials);
      // Partial rows go to the rank owning them (in the partials' precision); gemmAllReduce then
      // gathers the summed rows (in the output's dtype).
      long partialRow = n * (partials == PartialPrecision.BF16 ? 2 : 4);
      long outRow = scatter ? 0 : n * c.dtype().bytes();
      IntToLongFunction sendTo = p -> Split.count(m, world, p) * partialRow + Split.count(m, world, rank) * outRow;
      IntToLongFunction receiveFrom =
          p -> Split.count(m, world, rank) * partialRow + Split.count(m, world, p) * outRow;
      runNative(call, sendTo, receiveFrom, () -> {
        if (scatter) {
          NativeOps.gemmReduceScatter(handle(), fp.description(), fp.value(), a.dtype().code(),
              call.address(a), call.address(w), call.address(c), m, n, kLocal, layout.code(), partials.code(),
              stream);
        } else {
          NativeOps.gemmAllReduce(handle(), fp.description(), fp.value(), a.dtype().code(),
              call.address(a), call.address(w), call.address(c), m, n, kLocal, layout.code(), partials.code(),
              stream);
        }
      });
      countPath(op, fused);
    }
  }

  /** {@link #describeFusedOp(String, long, long, long, PartialPrecision)} with fp32 partials. */
  public String describeFusedOp(String op, long m, long n, long k) {
    return describeFusedOp(op, m, n, k, PartialPrecision.F32);
  }

  /**
   * How this rank would run a fused GEMM + communication op on these sizes, in one line for logs,
   * e.g. {@code allGatherGemm M=4096 N_r=512 K=4096 on rank 0 of 2 (cuda): fused: 131 GEMM CTAs,
   * tile width 128, 32 row chunks; the copy engines move the peers' rows (1 CTA raises their
   * flags)}. On the cuda backend it is the path that the op's size rule picks (fused or
   * decomposed; across hosts one kernel where every host has one rank, else decomposed), and,
   * fused, the SM split and how the peers'
   * data moves (the copy engines or pulling CTAs: a choice each rank makes for itself); a size
   * the data area cannot hold is said to be refused. On the host backend it is the reference
   * path. Local: nothing is launched or exchanged, and no other rank takes part. Sizes as the op
   * takes them: {@code allGatherGemm} (M, N_r, K), {@code gemmReduceScatter} and {@code
   * gemmAllReduce} (M, N, K_r); {@code partials} as those two ops take it (allGatherGemm has
   * none).
   *
   * @throws IllegalArgumentException for an unknown op, sizes below 1, or sizes the backend's op
   *     would refuse (on cuda: N and K not multiples of 8)
   */
  public String describeFusedOp(String op, long m, long n, long k, PartialPrecision partials) {
    Op fused = Op.fusedByLabel(op);
    if (fused == null) {
      throw new IllegalArgumentException("describeFusedOp: unknown op '" + op + "' (one of " + Op.fusedLabels() + ")");
    }
    if (m < 1 || n < 1 || k < 1) {
      throw new IllegalArgumentException("describeFusedOp: " + op + " sizes must be positive, got M=" + m
          + ", N=" + n + ", K=" + k);
    }
    if (partials == null) {
      throw new IllegalArgumentException("describeFusedOp: partials must not be null");
    }
    String path;
    synchronized (lock) {
      path = NativeOps.commDescribeFused(handle(), fused.code(), m, n, k, partials.code());
    }
    boolean gather = fused == Op.ALL_GATHER_GEMM;
    return op + " M=" + m + (gather ? " N_r=" : " N=") + n + (gather ? " K=" : " K_r=") + k
        + (gather ? "" : " " + partials.name().toLowerCase(Locale.ROOT) + " partials")
        + " on rank " + rank + " of " + world + " (" + runtime.backend().configName() + "): " + path;
  }

  // ---- MoE ---------------------------------------------------------------------------------

  /**
   * Routes each token's top-k rows to the ranks owning the experts ({@code numExperts} split over
   * ranks by {@link Split}) and multiplies them by the expert's {@code W1ᵀ}. {@code x: T × H},
   * {@code topkIds: T × k} ({@link DType#I32}, ids in {@code [0, numExperts)}), {@code
   * topkWeights: T × k} ({@link DType#F32}), {@code w1Local: E_r × F × H}. T may differ per rank.
   * No receive bound: the cuda backend sizes its outputs by what its symmetric data area holds.
   */
  public MoeDispatch moeDispatchGemm(Tensor x, Tensor topkIds, Tensor topkWeights, long numExperts, Tensor w1Local) {
    return moeDispatchGemm(x, topkIds, topkWeights, numExperts, w1Local, 0);
  }

  /**
   * {@link #moeDispatchGemm(Tensor, Tensor, Tensor, long, Tensor)} with a receive bound: {@code
   * maxRecvRows > 0} is the most routed rows any rank may receive (the same on every rank; the
   * cuda backend sizes its outputs and receive area by it, at most what its symmetric data area
   * holds); 0: no bound. A rank that would receive more fails the op on every rank with an
   * {@link IllegalArgumentException} naming that rank, its row count and the bound; no row moves
   * and the communicator stays usable.
   */
  public MoeDispatch moeDispatchGemm(
      Tensor x, Tensor topkIds, Tensor topkWeights, long numExperts, Tensor w1Local, long maxRecvRows) {
    try (OpCall call = enter("moeDispatchGemm", 0)) {
      if (maxRecvRows < 0) {
        throw new IllegalArgumentException("moeDispatchGemm: maxRecvRows must be >= 0 (0: no bound), got "
            + maxRecvRows);
      }
      OpCheck k = check("moeDispatchGemm").floating("x", x).same("w1Local", w1Local, x).rank2("x", x);
      k.typed("topkIds", topkIds, DType.I32).typed("topkWeights", topkWeights, DType.F32);
      k.rank2("topkIds", topkIds).rank2("topkWeights", topkWeights).rank3("w1Local", w1Local);
      if (numExperts < 1) {
        throw new IllegalArgumentException("moeDispatchGemm: numExperts must be positive, got " + numExperts);
      }
      long tokens = x.dim(0);
      long hidden = x.dim(1);
      long topk = topkIds.dim(1);
      k.dim("topkIds", topkIds, 0, tokens).dim("topkWeights", topkWeights, 0, tokens).dim("topkWeights", topkWeights, 1, topk);
      if (topk < 1) {
        throw new IllegalArgumentException("moeDispatchGemm: top-k must be at least 1");
      }
      k.dim("w1Local", w1Local, 0, Split.count(numExperts, world, rank)).dim("w1Local", w1Local, 2, hidden);
      long ffn = w1Local.dim(1);
      Fingerprint fp = k.fingerprint().add("experts", numExperts).add("H", hidden).add("F", ffn).add("topk", topk)
          .add("maxRecvRows", maxRecvRows).build();
      return callNative(call, null, null, () -> {
        long h = NativeOps.moeDispatchGemm(handle(), fp.description(), fp.value(), x.dtype().code(),
            call.address(x), tokens, hidden, call.address(topkIds), call.address(topkWeights), (int) topk, numExperts,
            call.address(w1Local), ffn, maxRecvRows);
        try {
          int gpu = x instanceof DeviceTensor d ? d.device() : -1;
          return new MoeDispatch(this, h, x.dtype(), hidden, ffn, gpu);
        } catch (RuntimeException e) {
          NativeOps.moeFree(h);
          throw e;
        }
      });
    }
  }

  /**
   * Sends expert outputs home: {@code expertOut: dispatch.rows() × width} (rows in the
   * dispatch's order), {@code out: dispatch.tokens() × width}, {@code out[t] = Σ_k weight(t,k) ·
   * row(t,k)}.
   */
  public void moeCombine(MoeDispatch dispatch, Tensor expertOut, Tensor out) {
    try (OpCall call = enter("moeCombine", 0)) {
      if (dispatch == null || dispatch.owner() != this) {
        throw new IllegalArgumentException("moeCombine: the dispatch must come from this communicator");
      }
      OpCheck k = check("moeCombine").floating("expertOut", expertOut).same("out", out, expertOut);
      k.rank2("expertOut", expertOut).rank2("out", out);
      long width = out.dim(1);
      k.dim("expertOut", expertOut, 0, dispatch.rows()).dim("expertOut", expertOut, 1, width).dim("out", out, 0, dispatch.tokens());
      Fingerprint fp = k.fingerprint().add("width", width).build();
      runNative(call, null, null, () -> NativeOps.moeCombine(handle(), fp.description(), fp.value(),
          out.dtype().code(), call.handle(dispatch), call.address(expertOut), width, call.address(out)));
    }
  }

  /**
   * The down projection with the combine: {@code h: dispatch.rows() × K} (rows in the dispatch's
   * order, e.g. the activations after W1) times each local expert's {@code W2ᵀ} ({@code w2Local:
   * E_r × width × K}), those rows sent home and summed as {@link #moeCombine} sums them, into
   * {@code out: dispatch.tokens() × width}. Bit for bit {@code moeCombine(dispatch,
   * groupedGemm(h, w2Local, dispatch.expertOffsets()), out)} on the same backend (the cuda
   * backend runs those two steps on the GPU; not fused yet).
   */
  public void moeGemmCombine(Tensor h, Tensor w2Local, MoeDispatch dispatch, Tensor out) {
    try (OpCall call = enter("moeGemmCombine", 0)) {
      if (dispatch == null || dispatch.owner() != this) {
        throw new IllegalArgumentException("moeGemmCombine: the dispatch must come from this communicator");
      }
      OpCheck k = check("moeGemmCombine").floating("h", h).same("w2Local", w2Local, h).same("out", out, h);
      k.rank2("h", h).rank3("w2Local", w2Local).rank2("out", out);
      long kDim = h.dim(1);
      long width = out.dim(1);
      k.dim("h", h, 0, dispatch.rows()).dim("out", out, 0, dispatch.tokens());
      k.dim("w2Local", w2Local, 0, dispatch.expertOffsets().length - 1).dim("w2Local", w2Local, 1, width)
          .dim("w2Local", w2Local, 2, kDim);
      Fingerprint fp = k.fingerprint().add("K", kDim).add("width", width).build();
      runNative(call, null, null, () -> NativeOps.moeGemmCombine(handle(), fp.description(), fp.value(),
          out.dtype().code(), call.handle(dispatch), call.address(h), kDim, call.address(w2Local), width,
          call.address(out)));
    }
  }

  /**
   * A single-rank grouped GEMM over contiguous row segments, as a MoE layer's experts run it:
   * group {@code g} owns rows {@code [offsets[g], offsets[g + 1])} of {@code a: rows × K} and of
   * {@code c: rows × N}, and those rows of {@code c} are the same rows of {@code a} times {@code
   * op(w_g)}: {@code w: G × N × K} ({@link WeightLayout#NK}, {@code C = A · w_gᵀ}) or {@code G × K
   * × N} ({@link WeightLayout#KN}, {@code C = A · w_g}), {@code G = offsets.length - 1}. Groups
   * may be empty; offsets are non-decreasing within {@code [0, rows]}, and rows outside every
   * group are not written. A dispatch's expert segments fit as they are: {@link
   * MoeDispatch#expertOffsets()}. On the GPU (the Hopper engine over a table of 128-row blocks of
   * the segments; bf16, N and K positive multiples of 8, at most 1024 groups) when all three are
   * {@link DeviceTensor}s on the calling thread's current device, on the host (reference, f32 or
   * bf16) when all three are {@link HostTensor}s. fp32 accumulation, one rounding. Synchronous.
   */
  public static void groupedGemm(Tensor a, Tensor w, Tensor c, long[] offsets, WeightLayout layout) {
    if (a == null) {
      throw new IllegalArgumentException("groupedGemm: a must not be null");
    }
    boolean device = a.isDevice();
    OpCheck k = new OpCheck("groupedGemm", device ? Backend.CUDA : Backend.HOST, -1).floating("a", a)
        .same("w", w, a).same("c", c, a);
    k.rank2("a", a).rank3("w", w).rank2("c", c).layout(layout);
    long rows = a.dim(0);
    k.dim("c", c, 0, rows);
    if (offsets == null || offsets.length < 1) {
      throw new IllegalArgumentException("groupedGemm: offsets must hold groups + 1 row offsets, got "
          + (offsets == null ? "null" : "none"));
    }
    long[] off = offsets.clone();  // what is checked is what runs
    long groups = off.length - 1;
    long n = c.dim(1);
    long kk = a.dim(1);
    long wRows = layout == WeightLayout.NK ? n : kk;
    long wCols = layout == WeightLayout.NK ? kk : n;
    if (w.dim(0) != groups || w.dim(1) != wRows || w.dim(2) != wCols) {
      throw new IllegalArgumentException("groupedGemm: w " + w.shapeString() + " must be [" + groups + ", " + wRows
          + ", " + wCols + "] for " + groups + " groups and layout " + layout);
    }
    long previous = 0;
    for (int g = 0; g <= groups; g++) {
      long o = off[g];
      if (o < previous || o > rows) {
        throw new IllegalArgumentException("groupedGemm: offsets[" + g + "] = " + o + " must be in ["
            + (g == 0 ? "0" : "offsets[" + (g - 1) + "] = " + previous) + ", rows = " + rows
            + "] (offsets are non-decreasing row indices of a)");
      }
      previous = o;
    }
    if (device && a.dtype() != DType.BF16) {
      throw new IllegalArgumentException("groupedGemm: the GPU grouped GEMM takes bf16 tensors, got "
          + a.dtype().label());
    }
    try (OpCall call = new OpCall(null, "groupedGemm", false)) {
      NativeOps.groupedGemm((device ? Backend.CUDA : Backend.HOST).code(), a.dtype().code(), call.address(a),
          call.address(w), call.address(c), off, groups, rows, n, kk, layout.code());
    }
  }

  // ---- attention ---------------------------------------------------------------------------

  /**
   * Attention over the whole sequence with K/V travelling around the ring: {@code q, o: (B, S_r,
   * Hq, D)}, {@code k, v: (B, S_r, Hkv, D)} with {@code Hq % Hkv == 0}, where this rank holds
   * the {@code S_r} positions {@link Split#positions}{@code (S, world, rank, options.layout())}
   * in that order ({@code options.localLength(world, rank)}: with the default {@link
   * SequenceLayout#CONTIGUOUS} layout its {@link Split} block); {@code lse: (B, Hq, S_r)} {@link
   * DType#F32}, natural log of the softmax denominator. Causal masking compares global positions.
   */
  public void ringAttention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, AttentionOptions options) {
    ringAttention(q, k, v, o, lse, options, 0L);
  }

  /**
   * {@link #ringAttention(Tensor, Tensor, Tensor, Tensor, Tensor, AttentionOptions, long)} on a
   * JCuda stream (see {@link #allGather(Tensor, Tensor, Object)}).
   */
  public void ringAttention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, AttentionOptions options,
                            Object stream) {
    ringAttention(q, k, v, o, lse, options, JCudaInterop.stream(stream));
  }

  /**
   * {@link #ringAttention(Tensor, Tensor, Tensor, Tensor, Tensor, AttentionOptions)} enqueued on a
   * CUDA stream (see {@link #allGather(Tensor, Tensor, long)}). A CUDA graph may capture it once
   * it has run at its size outside the capture (its workspace and side stream are made then).
   */
  public void ringAttention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, AttentionOptions options,
                            long stream) {
    try (OpCall call = enter("ringAttention", stream)) {
      if (options == null) {
        throw new IllegalArgumentException("ringAttention: options must not be null");
      }
      OpCheck c = check("ringAttention").floating("q", q).same("k", k, q).same("v", v, q).same("o", o, q)
          .stream(stream);
      c.typed("lse", lse, DType.F32).rank4("q", q).rank4("k", k).rank4("v", v).rank4("o", o).rank3("lse", lse);
      long b = q.dim(0);
      long s = options.sequenceLength();
      long sr = options.localLength(world, rank);
      long hq = q.dim(2);
      long d = q.dim(3);
      long hkv = k.dim(2);
      c.dim("q", q, 1, sr);
      for (Tensor t : new Tensor[] {k, v}) {
        String name = t == k ? "k" : "v";
        c.dim(name, t, 0, b).dim(name, t, 1, sr).dim(name, t, 2, hkv).dim(name, t, 3, d);
      }
      c.dim("o", o, 0, b).dim("o", o, 1, sr).dim("o", o, 2, hq).dim("o", o, 3, d);
      c.dim("lse", lse, 0, b).dim("lse", lse, 1, hq).dim("lse", lse, 2, sr);
      if (hkv < 1 || hq % hkv != 0) {
        throw new IllegalArgumentException("ringAttention: q heads (" + hq + ") must be a multiple of kv heads (" + hkv + ")");
      }
      Fingerprint fp = c.fingerprint().add("B", b).add("S", s).add("Hq", hq).add("Hkv", hkv).add("D", d)
          .add("causal", options.causal()).add("scale", Float.toString(options.scale()))
          .add("layout", options.layout().name()).build();
      runNative(call, null, null, () -> NativeOps.ringAttention(handle(), fp.description(), fp.value(),
          q.dtype().code(), b, s, hq, hkv, d, options.causal(), options.scale(), options.layout().code(),
          call.address(q), call.address(k), call.address(v), call.address(o), call.address(lse), stream));
    }
  }

  /**
   * The backward of {@link #ringAttention} (docs/ops.md "ringAttentionBackward"): every rank
   * passes its forward inputs {@code q, k, v}, outputs {@code o, lse} (required) and {@code dO},
   * the gradient of its {@code o}, with the forward's options, and gets the gradients of its own
   * positions: {@code dQ} (as {@code q}), {@code dK}, {@code dV} (as {@code k, v}; with grouped-query
   * heads summed over the query heads sharing a K/V head). K/V blocks travel around the ring as
   * in the forward and their dK/dV partials travel with them back to their owner; fp32
   * accumulation, one rounding.
   */
  public void ringAttentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                    Tensor dK, Tensor dV, AttentionOptions options) {
    ringAttentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, options, 0L);
  }

  /**
   * {@link #ringAttentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, AttentionOptions, long)} on a JCuda stream (see {@link #allGather(Tensor, Tensor,
   * Object)}).
   */
  public void ringAttentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                    Tensor dK, Tensor dV, AttentionOptions options, Object stream) {
    ringAttentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, options, JCudaInterop.stream(stream));
  }

  /**
   * {@link #ringAttentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, AttentionOptions)} enqueued on a CUDA stream (see {@link #ringAttention(Tensor, Tensor,
   * Tensor, Tensor, Tensor, AttentionOptions, long)}).
   */
  public void ringAttentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                    Tensor dK, Tensor dV, AttentionOptions options, long stream) {
    final String op = "ringAttentionBackward";
    try (OpCall call = enter(op, stream)) {
      if (options == null) {
        throw new IllegalArgumentException(op + ": options must not be null");
      }
      if (lse == null) {
        throw new IllegalArgumentException(op + ": lse (the forward's log-sum-exp, f32) is required");
      }
      OpCheck c = check(op).floating("q", q).same("k", k, q).same("v", v, q).same("o", o, q).same("dO", dO, q)
          .same("dQ", dQ, q).same("dK", dK, q).same("dV", dV, q).stream(stream);
      c.typed("lse", lse, DType.F32).rank4("q", q).rank4("k", k).rank4("v", v).rank4("o", o).rank3("lse", lse)
          .rank4("dO", dO).rank4("dQ", dQ).rank4("dK", dK).rank4("dV", dV);
      long b = q.dim(0);
      long s = options.sequenceLength();
      long sr = options.localLength(world, rank);
      long hq = q.dim(2);
      long d = q.dim(3);
      long hkv = k.dim(2);
      c.dim("q", q, 1, sr);
      for (Tensor t : new Tensor[] {o, dO, dQ}) {
        String name = t == o ? "o" : t == dO ? "dO" : "dQ";
        c.dim(name, t, 0, b).dim(name, t, 1, sr).dim(name, t, 2, hq).dim(name, t, 3, d);
      }
      for (Tensor t : new Tensor[] {k, v, dK, dV}) {
        String name = t == k ? "k" : t == v ? "v" : t == dK ? "dK" : "dV";
        c.dim(name, t, 0, b).dim(name, t, 1, sr).dim(name, t, 2, hkv).dim(name, t, 3, d);
      }
      c.dim("lse", lse, 0, b).dim("lse", lse, 1, hq).dim("lse", lse, 2, sr);
      if (hkv < 1 || hq % hkv != 0) {
        throw new IllegalArgumentException(op + ": q heads (" + hq + ") must be a multiple of kv heads (" + hkv + ")");
      }
      Fingerprint fp = c.fingerprint().add("B", b).add("S", s).add("Hq", hq).add("Hkv", hkv).add("D", d)
          .add("causal", options.causal()).add("scale", Float.toString(options.scale()))
          .add("layout", options.layout().name()).build();
      runNative(call, null, null, () -> NativeOps.ringAttentionBackward(handle(), fp.description(), fp.value(),
          q.dtype().code(), b, s, hq, hkv, d, options.causal(), options.scale(), options.layout().code(),
          call.address(q), call.address(k), call.address(v), call.address(o), call.address(lse),
          call.address(dO), call.address(dQ), call.address(dK), call.address(dV), stream));
    }
  }

  /**
   * A single-rank attention forward (docs/ops.md "attention"), synchronous: {@code q, o: (B,
   * Lq, Hq, D)}, {@code k, v: (B, Lk, Hkv, D)} with {@code Hq % Hkv == 0} (query head {@code h}
   * reads K/V head {@code h / (Hq / Hkv)}); {@code lse: (B, Hq, Lq)} {@link DType#F32}, the
   * natural log of each query's softmax denominator, or null when not wanted. Causal: query
   * {@code i} sees keys {@code j ≤ i} (top-left aligned, as torch's {@code
   * scaled_dot_product_attention}); {@code scale} 0 means {@code 1/sqrt(D)}. On the GPU (bf16;
   * head dims the kernel takes: 64 and 128) when the tensors are {@link DeviceTensor}s of one
   * GPU, the calling thread's current device; on the host (reference, f32 or bf16) when they are
   * {@link HostTensor}s.
   */
  public static void attention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, boolean causal, float scale) {
    attention(q, k, v, o, lse, causal, scale, 0L);
  }

  /**
   * {@link #attention(Tensor, Tensor, Tensor, Tensor, Tensor, boolean, float, long)} on a JCuda
   * stream (see {@link #allGather(Tensor, Tensor, Object)}).
   */
  public static void attention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, boolean causal, float scale,
                               Object stream) {
    attention(q, k, v, o, lse, causal, scale, JCudaInterop.stream(stream));
  }

  /**
   * {@link #attention(Tensor, Tensor, Tensor, Tensor, Tensor, boolean, float)} on device
   * tensors, enqueued on a CUDA stream of the caller ({@code cudaStream_t} handle of the tensors'
   * GPU; 0 runs it synchronously) and returning once enqueued. The tensors must stay alive until
   * the stream has run it; errors of the kernel surface in the caller's next synchronization of
   * that stream.
   */
  public static void attention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, boolean causal, float scale,
                               long stream) {
    final String op = "attention";
    if (q == null) {
      throw new IllegalArgumentException(op + ": q must not be null");
    }
    boolean device = q.isDevice();
    int gpu = q instanceof DeviceTensor d ? d.device() : -1;
    OpCheck c = new OpCheck(op, device ? Backend.CUDA : Backend.HOST, gpu)
        .floating("q", q).same("k", k, q).same("v", v, q).same("o", o, q);
    c.rank4("q", q).rank4("k", k).rank4("v", v).rank4("o", o);
    long b = q.dim(0);
    long lq = q.dim(1);
    long hq = q.dim(2);
    long d = q.dim(3);
    long lk = k.dim(1);
    long hkv = k.dim(2);
    c.dim("k", k, 0, b).dim("k", k, 3, d);
    c.dim("v", v, 0, b).dim("v", v, 1, lk).dim("v", v, 2, hkv).dim("v", v, 3, d);
    c.dim("o", o, 0, b).dim("o", o, 1, lq).dim("o", o, 2, hq).dim("o", o, 3, d);
    if (lse != null) {
      c.typed("lse", lse, DType.F32).rank3("lse", lse);
      c.dim("lse", lse, 0, b).dim("lse", lse, 1, hq).dim("lse", lse, 2, lq);
    }
    if (hkv < 1 || hq % hkv != 0) {
      throw new IllegalArgumentException(op + ": q heads (" + hq + ") must be a multiple of kv heads (" + hkv + ")");
    }
    if (d < 1) {
      throw new IllegalArgumentException(op + ": the head dimension must be positive, got " + d);
    }
    if (!(scale >= 0) || Float.isInfinite(scale)) {
      throw new IllegalArgumentException(op + ": scale must be finite and non-negative, got " + scale);
    }
    if (device && q.dtype() != DType.BF16) {
      throw new IllegalArgumentException(op + ": the GPU attention takes bf16 tensors, got " + q.dtype().label());
    }
    c.stream(stream);
    try (OpCall call = new OpCall(null, op, stream != 0)) {
      NativeOps.attention((device ? Backend.CUDA : Backend.HOST).code(), q.dtype().code(), b, lq, lk, hq, hkv, d,
          causal, scale, call.address(q), call.address(k), call.address(v), call.address(o), call.address(lse),
          stream);
    }
  }

  /**
   * The backward of {@link #attention(Tensor, Tensor, Tensor, Tensor, Tensor, boolean, float)}
   * (docs/ops.md "attentionBackward"), synchronous: from the forward's {@code q, k, v}, its
   * outputs {@code o} and {@code lse} ({@link DType#F32}, required) and {@code dO} (the gradient
   * of {@code o}, shaped as {@code o}) writes {@code dQ} (as {@code q}), {@code dK} and {@code
   * dV} (as {@code k} and {@code v}; with grouped-query heads summed over the query heads sharing
   * a K/V head), accumulated in fp32 and rounded once. {@code causal} and {@code scale} as the
   * forward's; host and device tensors as {@code attention}. On the GPU the fastest path adds
   * {@code dQ} up in no fixed order: it is not bit-reproducible from run to run; the overloads
   * with {@code deterministic} choose a reproducible, slower one.
   */
  public static void attentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                       Tensor dK, Tensor dV, boolean causal, float scale) {
    attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, scale, false, 0L);
  }

  /**
   * {@link #attentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, boolean, float)}, bit-reproducible when {@code deterministic} (on the GPU {@code dQ}
   * is then computed in a pass of its own, which is slower; false: the fastest path). The host
   * backend is reproducible either way.
   */
  public static void attentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                       Tensor dK, Tensor dV, boolean causal, float scale, boolean deterministic) {
    attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, scale, deterministic, 0L);
  }

  /**
   * {@link #attentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, boolean, float, long)} on a JCuda stream (see {@link #allGather(Tensor, Tensor,
   * Object)}).
   */
  public static void attentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                       Tensor dK, Tensor dV, boolean causal, float scale, Object stream) {
    attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, scale, false, JCudaInterop.stream(stream));
  }

  /**
   * {@link #attentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, boolean, float, boolean, long)} on a JCuda stream (see {@link #allGather(Tensor,
   * Tensor, Object)}).
   */
  public static void attentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                       Tensor dK, Tensor dV, boolean causal, float scale, boolean deterministic,
                                       Object stream) {
    attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, scale, deterministic, JCudaInterop.stream(stream));
  }

  /**
   * {@link #attentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, boolean, float)} on device tensors, enqueued on a CUDA stream of the caller ({@code
   * cudaStream_t} handle of the tensors' GPU; 0 runs it synchronously) and returning once
   * enqueued, as {@link #attention(Tensor, Tensor, Tensor, Tensor, Tensor, boolean, float, long)}.
   */
  public static void attentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                       Tensor dK, Tensor dV, boolean causal, float scale, long stream) {
    attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, scale, false, stream);
  }

  /**
   * {@link #attentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * Tensor, boolean, float, long)}, bit-reproducible when {@code deterministic} (see {@link
   * #attentionBackward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
   * boolean, float, boolean)}).
   */
  public static void attentionBackward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor dQ,
                                       Tensor dK, Tensor dV, boolean causal, float scale, boolean deterministic,
                                       long stream) {
    final String op = "attentionBackward";
    if (q == null) {
      throw new IllegalArgumentException(op + ": q must not be null");
    }
    if (lse == null) {
      throw new IllegalArgumentException(op + ": lse (the forward's log-sum-exp, f32) is required");
    }
    boolean device = q.isDevice();
    int gpu = q instanceof DeviceTensor dt ? dt.device() : -1;
    OpCheck c = new OpCheck(op, device ? Backend.CUDA : Backend.HOST, gpu)
        .floating("q", q).same("k", k, q).same("v", v, q).same("o", o, q).same("dO", dO, q)
        .same("dQ", dQ, q).same("dK", dK, q).same("dV", dV, q).typed("lse", lse, DType.F32);
    c.rank4("q", q).rank4("k", k).rank4("v", v).rank4("o", o).rank3("lse", lse).rank4("dO", dO)
        .rank4("dQ", dQ).rank4("dK", dK).rank4("dV", dV);
    long b = q.dim(0);
    long lq = q.dim(1);
    long hq = q.dim(2);
    long d = q.dim(3);
    long lk = k.dim(1);
    long hkv = k.dim(2);
    c.dim("k", k, 0, b).dim("k", k, 3, d);
    for (Tensor t : new Tensor[] {v, dK, dV}) {
      String name = t == v ? "v" : t == dK ? "dK" : "dV";
      c.dim(name, t, 0, b).dim(name, t, 1, lk).dim(name, t, 2, hkv).dim(name, t, 3, d);
    }
    for (Tensor t : new Tensor[] {o, dO, dQ}) {
      String name = t == o ? "o" : t == dO ? "dO" : "dQ";
      c.dim(name, t, 0, b).dim(name, t, 1, lq).dim(name, t, 2, hq).dim(name, t, 3, d);
    }
    c.dim("lse", lse, 0, b).dim("lse", lse, 1, hq).dim("lse", lse, 2, lq);
    if (hkv < 1 || hq % hkv != 0) {
      throw new IllegalArgumentException(op + ": q heads (" + hq + ") must be a multiple of kv heads (" + hkv + ")");
    }
    if (d < 1) {
      throw new IllegalArgumentException(op + ": the head dimension must be positive, got " + d);
    }
    if (!(scale >= 0) || Float.isInfinite(scale)) {
      throw new IllegalArgumentException(op + ": scale must be finite and non-negative, got " + scale);
    }
    if (device && q.dtype() != DType.BF16) {
      throw new IllegalArgumentException(op + ": the GPU attention backward takes bf16 tensors, got "
          + q.dtype().label());
    }
    c.stream(stream);
    try (OpCall call = new OpCall(null, op, stream != 0)) {
      NativeOps.attentionBackward((device ? Backend.CUDA : Backend.HOST).code(), q.dtype().code(), b, lq, lk, hq,
          hkv, d, causal, scale, deterministic, call.address(q), call.address(k), call.address(v), call.address(o),
          call.address(lse), call.address(dO), call.address(dQ), call.address(dK), call.address(dV), stream);
    }
  }

  /**
   * A single-rank GEMM, {@code c = a · op(w)} with {@code a: M × K}, {@code c: M × N}: on the
   * GPU (the persistent TMA + wgmma engine, bf16, N and K multiples of 8) when all three are
   * {@link DeviceTensor}s on the calling thread's current device, on the host (reference) when
   * all three are {@link HostTensor}s. Synchronous.
   */
  public static void gemm(Tensor a, Tensor w, Tensor c, WeightLayout layout) {
    if (a == null) {
      throw new IllegalArgumentException("gemm: a must not be null");
    }
    boolean device = a.isDevice();
    OpCheck k = new OpCheck("gemm", device ? Backend.CUDA : Backend.HOST, -1).floating("a", a).same("w", w, a).same("c", c, a);
    k.rank2("a", a).rank2("w", w).rank2("c", c).layout(layout);
    k.dim("c", c, 0, a.dim(0)).weight(w, layout, c.dim(1), a.dim(1));
    if (device && a.dtype() != DType.BF16) {
      throw new IllegalArgumentException("gemm: the GPU GEMM takes bf16 tensors, got " + a.dtype().label());
    }
    try (OpCall call = new OpCall(null, "gemm", false)) {
      NativeOps.gemm((device ? Backend.CUDA : Backend.HOST).code(), a.dtype().code(), call.address(a),
          call.address(w), call.address(c), a.dim(0), c.dim(1), a.dim(1), layout.code());
    }
  }

  // ---- accounting ----------------------------------------------------------------------------

  /**
   * Runs an op's native call under the lock and counts it: when it returns, the call's time since
   * {@link #enter} and the payload to and from each peer ({@code sendTo}, {@code receiveFrom}:
   * bytes by peer rank; null: not counted); when it fails with a communicator error, the failure.
   */
  private void runNative(OpCall call, IntToLongFunction sendTo, IntToLongFunction receiveFrom, Runnable op) {
    callNative(call, sendTo, receiveFrom, () -> {
      op.run();
      return null;
    });
  }

  private <T> T callNative(OpCall call, IntToLongFunction sendTo, IntToLongFunction receiveFrom, Supplier<T> op) {
    T result;
    synchronized (lock) {
      try {
        result = op.get();
      } catch (CommTimeoutException e) {
        metrics.timeout();
        throw e;
      } catch (io.fusedcomm.errors.BackendUnavailableException e) {
        throw e;  // an op the backend does not run: refused before anything moved
      } catch (CommunicatorException e) {
        metrics.failure();
        throw e;
      }
    }
    long nanos = System.nanoTime() - call.startNanos;
    opNanos.addAndGet(nanos);
    metrics.op(call.op, nanos);
    if (sendTo != null) {
      for (int p = 0; p < world; p++) {
        if (p != rank) {
          metrics.bytes(links[p], sendTo.applyAsLong(p), receiveFrom.applyAsLong(p));
        }
      }
    }
    if (LOG.isDebugEnabled()) {
      LOG.debug("{} {}: {} us", this, call.op, nanos / 1000);
    }
    return result;
  }

  /**
   * Whether a fused op on these sizes runs fused (the path {@link #describeFusedOp} names),
   * remembered per sizes; null when the backend cannot say (the op's own checks then speak).
   */
  private Boolean runsFused(Op op, long m, long n, long k, PartialPrecision partials) {
    String key = op.code() + ":" + m + ":" + n + ":" + k + ":" + partials.code();
    synchronized (lock) {
      Boolean fused = fusedPaths.get(key);
      if (fused == null) {
        String path;
        try {
          path = NativeOps.commDescribeFused(handle(), op.code(), m, n, k, partials.code());
        } catch (IllegalArgumentException e) {
          return null;
        }
        fused = path.startsWith("fused");
        fusedPaths.put(key, fused);
        LOG.debug("{} {} M={} N={} K={}: {}", this, op.label(), m, n, k, path);
      }
      return fused;
    }
  }

  private void countPath(String op, Boolean fused) {
    if (fused != null) {
      metrics.path(op, fused);
    }
  }

  // ---- teardown ------------------------------------------------------------------------------

  /**
   * Waits until this rank's enqueued ops are done and every rank has finished its ops (a
   * barrier), bounded by the timeout.
   */
  public void finish() {
    try (OpCall call = enter("finish", 0)) {
      synchronized (lock) {
        NativeOps.commFinish(handle());
      }
    }
  }

  /**
   * Stops now: ops in flight on any thread fail, peers learn at once that this rank is gone.
   * Safe to call from any thread, any number of times; {@link #close()} is still needed.
   */
  public void abort() {
    if (handle.get() != 0) {
      metrics.abort();
    }
    handle.abort();
  }

  /**
   * The time this rank's calls of this communicator's ops took, summed over the calls that
   * returned normally (for the stream forms: the time to check and enqueue, not the GPU's time).
   * {@code BarrierStage} adds it to the stage's task accumulator.
   */
  public Duration opTime() {
    return Duration.ofNanos(opNanos.get());
  }

  /** True once closed. */
  public boolean isClosed() {
    return handle.get() == 0;
  }

  /** Finishes (unless aborted or broken) and frees everything; idempotent. */
  @Override
  public void close() {
    synchronized (lock) {
      long h = handle.take();
      if (h == 0) {
        return;
      }
      LeakTracker.closed(leakId);
      metrics.closed(symmetricBytes);
      try {
        NativeOps.commClose(h);
      } finally {
        lease.close();
      }
    }
  }

  private long handle() {
    long h = handle.get();
    if (h == 0) {
      throw new IllegalStateException("the communicator (rank " + rank + " of " + world + ") is closed");
    }
    return h;
  }

  private OpCheck check(String op) {
    handle();
    return new OpCheck(op, runtime.backend(), runtime.gpuOrdinal());
  }

  /**
   * Starts an op call on the calling thread; {@link IllegalStateException} when the
   * communicator is closed or another thread is in an op on it (see the class comment).
   */
  private OpCall enter(String op, long stream) {
    handle();
    OpCall call = new OpCall(this, op, stream != 0);
    OpCall other = inOp.compareAndExchange(null, call);
    if (other != null) {
      throw new IllegalStateException(this + ": " + op + " was called on thread '" + call.thread.getName()
          + "' while thread '" + other.thread.getName() + "' is in " + other.op + "; the ops of one communicator"
          + " must be called from one thread at a time, in the same order on every rank");
    }
    return call;
  }

  /** Ends {@code call}, which {@link #enter} started. */
  void leave(OpCall call) {
    inOp.compareAndSet(call, null);
  }

  /** The op a thread is in now, or null (for tests). */
  String opInProgress() {
    OpCall call = inOp.get();
    return call == null ? null : call.op;
  }

  @Override
  public String toString() {
    return "Communicator[rank " + rank + " of " + world + ", " + runtime.backend().configName() + "]";
  }
}
