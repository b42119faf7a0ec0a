package io.fusedcomm.internal.bootstrap;

import io.fusedcomm.api.Backend;
import java.util.ArrayList;
import java.util.List;

/** Test fixtures: consistent rank infos for a world, and copies with one field changed. */
final class RankInfos {
  static final long TOKEN = 0x1234_5678_9abc_def0L;
  static final long NONCE = 77;
  static final Fingerprint OP =
      Fingerprint.builder("allGatherGemm").add("dtype", "bf16").addShape("A", 512, 1024).build();

  private RankInfos() {}

  /** Rank {@code r} of {@code world}, executors on two hosts, one GPU each, cuda backend. */
  static RankInfo rank(int r, int world) {
    String host = "host" + (r / 2);
    return new RankInfo(
        RankInfoCodec.VERSION,
        host,
        "exec-" + r,
        Integer.toString(r % 2),
        "GPU-uuid-" + host + "-" + (r % 2),
        Backend.CUDA,
        host + ":" + (40000 + r),
        TOKEN,
        NONCE,
        share(r),
        world,
        r,
        OP.value(),
        OP.description(),
        new byte[] {1, 2, (byte) r});
  }

  /** A distinct auth share per rank. */
  static byte[] share(int r) {
    byte[] s = new byte[RankInfo.AUTH_SHARE_BYTES];
    java.util.Arrays.fill(s, (byte) (0x40 + r));
    return s;
  }

  static List<RankInfo> world(int world) {
    List<RankInfo> out = new ArrayList<>();
    for (int r = 0; r < world; r++) {
      out.add(rank(r, world));
    }
    return out;
  }

  /** {@code world(n)} with rank {@code r}'s info replaced by {@code change} of it. */
  static List<RankInfo> worldWith(int n, int r, java.util.function.Consumer<Builder> change) {
    List<RankInfo> out = world(n);
    out.set(r, with(out.get(r), change));
    return out;
  }

  /** A copy of {@code info} with {@code change} applied. */
  static RankInfo with(RankInfo info, java.util.function.Consumer<Builder> change) {
    Builder b = new Builder(info);
    change.accept(b);
    return b.build();
  }

  /** Mutable copy of a RankInfo for tests. */
  static final class Builder {
    int blobVersion;
    String host;
    String executorId;
    String gpuId;
    String gpuUuid;
    Backend backend;
    String transportAddress;
    long jobToken;
    long commNonce;
    byte[] authShare;
    int world;
    int rank;
    long fingerprint;
    String opDescription;
    byte[] ipcHandles;

    Builder(RankInfo i) {
      blobVersion = i.blobVersion();
      host = i.host();
      executorId = i.executorId();
      gpuId = i.gpuId();
      gpuUuid = i.gpuUuid();
      backend = i.backend();
      transportAddress = i.transportAddress();
      jobToken = i.jobToken();
      commNonce = i.commNonce();
      authShare = i.authShare();
      world = i.world();
      rank = i.rank();
      fingerprint = i.fingerprint();
      opDescription = i.opDescription();
      ipcHandles = i.ipcHandles();
    }

    RankInfo build() {
      return new RankInfo(
          blobVersion, host, executorId, gpuId, gpuUuid, backend, transportAddress, jobToken,
          commNonce, authShare, world, rank, fingerprint, opDescription, ipcHandles);
    }
  }
}
