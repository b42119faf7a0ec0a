package io.fusedcomm.internal.bootstrap;

import io.fusedcomm.api.Backend;
import java.util.Arrays;
import java.util.Objects;

/**
 * What one rank tells the others when a communicator is built: the blob each barrier task
 * contributes to the single {@code BarrierTaskContext.allGather}. Encoded by {@link
 * RankInfoCodec}, validated across ranks by {@link BootstrapCheck}.
 *
 * @param blobVersion encoding version this rank wrote ({@link RankInfoCodec#VERSION})
 * @param host the executor's host, as Spark knows it
 * @param executorId the Spark executor id
 * @param gpuId the GPU address Spark assigned the executor (device index), "" if none
 * @param gpuUuid the GPU's UUID as CUDA reports it, "" if none; identifies the physical GPU
 * @param backend the resolved backend this rank runs ({@link Backend#CUDA} or {@link
 *     Backend#HOST})
 * @param transportAddress the endpoint peers on other hosts connect to, e.g. {@code host:port}
 * @param jobToken the application's random token from the driver plugin
 * @param commNonce identifies this communicator instance; the same on every rank of it (derived
 *     from the stage and attempt), so tasks of different attempts never pair up
 * @param authShare this rank's {@link #AUTH_SHARE_BYTES} fresh random bytes: with the job token
 *     and the communicator id, every rank's share makes the communicator's key, which
 *     authenticates its transport connections (challenge-response: neither the key, the token nor
 *     a share travels on them). Secret as the blob is; never printed
 * @param world the world size this rank expects
 * @param rank this rank, equal to its barrier task's partition id
 * @param fingerprint {@link Fingerprint#value()} of the requested op parameters
 * @param opDescription {@link Fingerprint#description()} of the same, for mismatch messages
 * @param ipcHandles CUDA IPC handles of this rank's symmetric buffers (cuda backend), else empty
 */
public record RankInfo(
    int blobVersion,
    String host,
    String executorId,
    String gpuId,
    String gpuUuid,
    Backend backend,
    String transportAddress,
    long jobToken,
    long commNonce,
    byte[] authShare,
    int world,
    int rank,
    long fingerprint,
    String opDescription,
    byte[] ipcHandles) {

  /** Bytes of {@link #authShare()}: the native side's {@code FC_AUTH_SHARE_BYTES}. */
  public static final int AUTH_SHARE_BYTES = 32;

  /**
   * Checks for nulls and the share's length, and takes copies of {@code authShare} and {@code
   * ipcHandles}.
   */
  public RankInfo {
    Objects.requireNonNull(host, "host");
    Objects.requireNonNull(executorId, "executorId");
    Objects.requireNonNull(gpuId, "gpuId");
    Objects.requireNonNull(gpuUuid, "gpuUuid");
    Objects.requireNonNull(backend, "backend");
    Objects.requireNonNull(transportAddress, "transportAddress");
    Objects.requireNonNull(opDescription, "opDescription");
    Objects.requireNonNull(authShare, "authShare");
    if (authShare.length != AUTH_SHARE_BYTES) {
      throw new IllegalArgumentException(
          "authShare must be " + AUTH_SHARE_BYTES + " bytes, got " + authShare.length);
    }
    authShare = authShare.clone();
    ipcHandles = ipcHandles == null ? new byte[0] : ipcHandles.clone();
  }

  /** A copy of the auth share. */
  @Override
  public byte[] authShare() {
    return authShare.clone();
  }

  /** A copy of the IPC handle bytes. */
  @Override
  public byte[] ipcHandles() {
    return ipcHandles.clone();
  }

  /** Number of IPC handle bytes, without copying them. */
  public int ipcHandlesLength() {
    return ipcHandles.length;
  }

  @Override
  public boolean equals(Object o) {
    if (!(o instanceof RankInfo)) {
      return false;
    }
    RankInfo r = (RankInfo) o;
    return blobVersion == r.blobVersion
        && host.equals(r.host)
        && executorId.equals(r.executorId)
        && gpuId.equals(r.gpuId)
        && gpuUuid.equals(r.gpuUuid)
        && backend == r.backend
        && transportAddress.equals(r.transportAddress)
        && jobToken == r.jobToken
        && commNonce == r.commNonce
        && Arrays.equals(authShare, r.authShare)
        && world == r.world
        && rank == r.rank
        && fingerprint == r.fingerprint
        && opDescription.equals(r.opDescription)
        && Arrays.equals(ipcHandles, r.ipcHandles);
  }

  @Override
  public int hashCode() {
    return Objects.hash(
            blobVersion, host, executorId, gpuId, gpuUuid, backend, transportAddress, jobToken,
            commNonce, world, rank, fingerprint, opDescription)
        * 31
        + Arrays.hashCode(ipcHandles)
        + 17 * Arrays.hashCode(authShare);
  }

  /** A log-friendly summary; the job token and the auth share are left out. */
  @Override
  public String toString() {
    return "RankInfo[rank "
        + rank
        + "/"
        + world
        + ", host "
        + host
        + ", executor "
        + executorId
        + ", gpu "
        + (gpuId.isEmpty() ? "none" : gpuId)
        + (gpuUuid.isEmpty() ? "" : " (" + gpuUuid + ")")
        + ", backend "
        + backend
        + ", transport "
        + transportAddress
        + ", op "
        + opDescription
        + ", "
        + ipcHandles.length
        + " IPC handle bytes, v"
        + blobVersion
        + "]";
  }
}
