package io.fusedcomm.api;

import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.internal.bootstrap.BootstrapCheck;
import io.fusedcomm.internal.bootstrap.BootstrapExchange;
import io.fusedcomm.internal.bootstrap.Fingerprint;
import io.fusedcomm.internal.bootstrap.HostLayout;
import io.fusedcomm.internal.bootstrap.RankInfo;
import io.fusedcomm.internal.bootstrap.RankInfoCodec;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.security.SecureRandom;
import java.util.List;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * How a {@link Communicator} comes to be: one rank's bootstrap blob, the launcher's one allGather,
 * the cross-rank checks, the connect. Internal to the API: Spark tasks reach it through {@link
 * Communicator#create}, tests and tools through any {@link BootstrapExchange}.
 */
final class CommBootstrap {
  private static final Logger LOG = LoggerFactory.getLogger(CommBootstrap.class);
  private static final SecureRandom SHARES = new SecureRandom();

  private CommBootstrap() {}

  /**
   * Builds a communicator over any launcher's {@link BootstrapExchange} (calls its allGather
   * exactly once). Every rank checks every rank's bootstrap blob; an inconsistent world, job,
   * plan or GPU assignment fails on all ranks with the same message. Each rank's blob carries a
   * fresh random share; all of them, with the job token, make the key that authenticates the
   * communicator's connections, so only the allGather carries secrets (docs/deploying.md).
   */
  static Communicator bootstrap(ExecutorRuntime runtime, BootstrapExchange exchange, CommOptions options) {
    return bootstrap(runtime, exchange, options, abort -> () -> {});
  }

  /**
   * As above; {@code watch} gets, once the native communicator exists and before the exchange and
   * the connect, an action that aborts it from any thread (a task kill does not reach a native
   * wait by itself), and returns what ends that watch, which runs once bootstrap has returned or
   * failed.
   */
  static Communicator bootstrap(ExecutorRuntime runtime, BootstrapExchange exchange, CommOptions options,
                                Function<Runnable, Runnable> watch) {
    int world = exchange.world();
    int rank = exchange.rank();
    if (world < 1 || rank < 0 || rank >= world) {
      throw new IllegalArgumentException("rank " + rank + " of world " + world + " is not valid");
    }
    ExecutorRuntime.Lease lease = runtime.lease();
    long handle;
    try {
      runtime.pinGpu();
      handle = NativeOps.commCreate(runtime.handle(), rank, world);
    } catch (RuntimeException | Error e) {
      lease.close();
      throw e;
    }
    Communicator.NativeHandle owned = new Communicator.NativeHandle(handle);
    lease.onAbort(owned::abort);  // a runtime that closes meanwhile aborts it (and waits)
    Runnable unwatch = watch.apply(owned::abort);
    try {
      // Every rank must split hosts (and share GPUs) the same way: the settings join the plan's
      // fingerprint.
      int virtualHosts = runtime.conf().cudaVirtualHosts();
      boolean shareGpu = runtime.conf().cudaShareGpu();
      Fingerprint plan = options.planFingerprint(world, virtualHosts, shareGpu);
      RankInfo mine =
          new RankInfo(
              RankInfoCodec.VERSION,
              runtime.host(),
              runtime.executorId(),
              runtime.gpuAddress().orElse(""),
              runtime.gpuUuid(),
              runtime.backend(),
              NativeOps.commEndpoint(handle),
              runtime.jobToken(),
              exchange.commNonce(),
              authShare(),
              world,
              rank,
              plan.value(),
              plan.description(),
              NativeOps.commDeviceHandle(handle));
      List<RankInfo> infos = RankInfoCodec.decodeAll(exchange.allGather(RankInfoCodec.encode(mine)));
      requireOneRankPerExecutor(infos);
      BootstrapCheck.check(infos, world, rank, !shareGpu);
      HostLayout layout = BootstrapCheck.checkCudaReachable(infos, virtualHosts);
      String[] endpoints = infos.stream().map(RankInfo::transportAddress).toArray(String[]::new);
      byte[][] authShares = infos.stream().map(RankInfo::authShare).toArray(byte[][]::new);
      byte[][] deviceHandles = infos.stream().map(RankInfo::ipcHandles).toArray(byte[][]::new);
      NativeOps.commConnect(
          handle, endpoints, rank, exchange.commNonce(), authShares, deviceHandles, layout.hostIds());
      Communicator comm = new Communicator(runtime, lease, owned, options.name(), rank, world, infos, layout);
      // The one line per communicator (per rank); ops log only at DEBUG.
      LOG.info("communicator '{}' rank {} of {} ready on executor {}: {}; hosts {}; links {}; symmetric memory"
              + " {} bytes; algorithms: collectives and fused ops choose theirs per call by size (each choice"
              + " at DEBUG, or Communicator.describeFusedOp)",
          options.name(), rank, world, runtime.executorId(), runtime.description(), layout, comm.linkSummary(),
          comm.symmetricBytes());
      return comm;
    } catch (RuntimeException | Error e) {
      // The lease stays held until the native half is freed: a runtime closing meanwhile waits.
      long h = owned.take();
      try {
        NativeOps.commAbort(h);
        NativeOps.commClose(h);
      } catch (RuntimeException suppressed) {
        e.addSuppressed(suppressed);
      } finally {
        lease.close();
      }
      throw e;
    } finally {
      unwatch.run();
    }
  }

  /**
   * Fails, on every rank alike, when two ranks run on one executor: their communicators would
   * share the executor's transport (and GPU), which holds one rank of a communicator. Two ranks
   * announce the same executor and the same transport listener only then.
   */
  private static void requireOneRankPerExecutor(List<RankInfo> infos) {
    for (int j = 1; j < infos.size(); j++) {
      for (int i = 0; i < j; i++) {
        RankInfo a = infos.get(i);
        RankInfo b = infos.get(j);
        if (a.executorId().equals(b.executorId()) && listener(a).equals(listener(b))) {
          throw new CommunicatorException("ranks " + i + " and " + j + " of this barrier stage run as tasks"
              + " of one executor (executor " + a.executorId() + " on " + a.host() + "), but a communicator"
              + " takes one task per executor: its transport and GPU serve one rank. Give each barrier task a"
              + " whole executor: set spark.task.cpus to spark.executor.cores, or, with GPUs,"
              + " spark.executor.resource.gpu.amount=1 and spark.task.resource.gpu.amount=1", j,
              CommunicatorException.UNKNOWN, "bootstrap", CommunicatorException.UNKNOWN, null);
        }
      }
    }
  }

  /** The transport listener of a rank's endpoint ("host:port#region"): what one executor shares. */
  private static String listener(RankInfo info) {
    String endpoint = info.transportAddress();
    int hash = endpoint.lastIndexOf('#');
    return hash < 0 ? endpoint : endpoint.substring(0, hash);
  }

  /** A fresh random share of the communicator's key ({@link RankInfo#authShare()}). */
  private static byte[] authShare() {
    byte[] share = new byte[RankInfo.AUTH_SHARE_BYTES];
    SHARES.nextBytes(share);
    return share;
  }
}
