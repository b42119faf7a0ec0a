package io.fusedcomm.plugin;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.BackendUnavailableException;
import java.util.Arrays;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.resource.ResourceInformation;

/**
 * The GPU Spark assigned to this executor, read from the plugin context's resources and checked
 * against fusedcomm's rule of exactly one GPU per executor.
 *
 * <p>Pure logic over the resource map, so it is unit-tested without a SparkContext.
 */
public final class GpuAssignment {
  private final String resourceName;
  private final Optional<String> address;

  private GpuAssignment(String resourceName, Optional<String> address) {
    this.resourceName = resourceName;
    this.address = address;
  }

  /**
   * Reads the executor's GPU from Spark's resources.
   *
   * @param resources the executor's resources, as {@code PluginContext.resources()} returns them
   * @param resourceName the resource name holding GPUs ({@code spark.fusedcomm.gpu.resourceName})
   * @return the assignment; without a GPU if the resource is absent or has no address
   * @throws IllegalStateException if the executor was given more than one GPU
   */
  public static GpuAssignment fromResources(
      Map<String, ResourceInformation> resources, String resourceName) {
    ResourceInformation info = resources == null ? null : resources.get(resourceName);
    String[] addresses = info == null ? new String[0] : info.addresses();
    if (addresses.length > 1) {
      throw new IllegalStateException(
          "This executor was assigned "
              + addresses.length
              + " GPUs ("
              + resourceName
              + " addresses "
              + Arrays.toString(addresses)
              + ") but fusedcomm needs exactly one GPU per executor: set"
              + " spark.executor.resource."
              + resourceName
              + ".amount=1 and spark.task.resource."
              + resourceName
              + ".amount=1, and run one executor per GPU.");
    }
    return new GpuAssignment(
        resourceName, addresses.length == 1 ? Optional.of(addresses[0]) : Optional.empty());
  }

  /** The assigned GPU's address (its device index on this host), if any. */
  public Optional<String> address() {
    return address;
  }

  /** The resource name the assignment was read from. */
  public String resourceName() {
    return resourceName;
  }

  /**
   * Checks that the requested backend can run with this assignment.
   *
   * @throws BackendUnavailableException for {@link Backend#CUDA} without a GPU, with the Spark
   *     settings that would assign one
   */
  public void checkBackend(Backend requested) {
    if (requested == Backend.CUDA && address.isEmpty()) {
      throw new BackendUnavailableException(
          Backend.CUDA.configName(),
          "spark.fusedcomm.backend=cuda but Spark assigned this executor no GPU (resource '"
              + resourceName
              + "'). Enable GPU scheduling with spark.executor.resource."
              + resourceName
              + ".amount=1, spark.task.resource."
              + resourceName
              + ".amount=1 and spark.executor.resource."
              + resourceName
              + ".discoveryScript=<fusedcomm>/conf/gpu-discovery.sh, or set"
              + " spark.fusedcomm.backend=host to run without GPUs.",
          null);
    }
  }

  @Override
  public String toString() {
    return address.map(a -> resourceName + " " + a).orElse("no " + resourceName);
  }
}
