package io.fusedcomm.api;

/**
 * Where one rank of a communicator runs, as it announced itself at bootstrap.
 *
 * @param rank the rank
 * @param host the host name its peers group it by (the executor's host, or {@code
 *     spark.fusedcomm.transport.bindHost})
 * @param executorId the Spark executor it runs in
 * @param gpuAddress the GPU address Spark assigned that executor; empty without one
 * @param gpuUuid that GPU's UUID as nvidia-smi prints it; empty on the host backend
 */
public record RankPlacement(int rank, String host, String executorId, String gpuAddress, String gpuUuid) {}
