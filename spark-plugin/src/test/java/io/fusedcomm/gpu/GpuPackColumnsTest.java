package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.testing.InJvmExchange;
import org.junit.jupiter.api.Test;

/**
 * Columns as a column store keeps them (separate device buffers, as cuDF's are), packed
 * row-major on the GPU by {@link DeviceTensor#packColumns}, then used by an op; the executor's
 * GPU size as the RAPIDS memory rule reads it. One rank on GPU 0; skipped, with the reason
 * printed, where no GPU is visible.
 */
class GpuPackColumnsTest {
  @Test
  void columnsArePackedRowMajorOnTheGpuAndAnOpTakesThem() {
    Gpu.require();
    final int rows = 1000;
    final int cols = 3;
    try (ExecutorRuntime rt = Gpu.cudaRuntime()) {
      rt.pinGpu();
      long total = rt.gpuTotalBytes();
      System.out.println("GPU 0 memory: " + (total >> 20) + " MiB");
      assertTrue(total > (1L << 30), "a GPU with " + total + " bytes");
      DeviceTensor[] columns = new DeviceTensor[cols];
      long[] addresses = new long[cols];
      try (Communicator comm = InternalAccess.bootstrap(rt, InJvmExchange.group(1, 44L, 30_000).get(0),
          CommOptions.defaults())) {
        for (int c = 0; c < cols; c++) {
          float[] values = new float[rows];
          for (int r = 0; r < rows; r++) {
            values[r] = c * 10_000 + r;
          }
          columns[c] = DeviceTensor.allocate(DType.F32, rows);
          Gpu.put(columns[c], values);
          addresses[c] = columns[c].devicePointer();
        }
        try (DeviceTensor packed = DeviceTensor.packColumns(DType.F32, rows, addresses[2], addresses[0],
            addresses[1])) {
          assertEquals(rows, packed.dim(0));
          assertEquals(cols, packed.dim(1));
          for (DeviceTensor c : columns) {
            c.close();  // the packed tensor is a copy
          }
          comm.allReduce(packed, packed);  // world 1: the values stay
          float[] got = Gpu.download(packed);
          int[] order = {2, 0, 1};
          for (int r = 0; r < rows; r++) {
            for (int j = 0; j < cols; j++) {
              assertEquals(order[j] * 10_000 + r, got[r * cols + j], 0f, "row " + r + " column " + j);
            }
          }
        }
      } finally {
        for (DeviceTensor c : columns) {
          if (c != null) {
            c.close();
          }
        }
      }
      try (HostTensor host = HostTensor.allocate(DType.F32, rows)) {
        // Not GPU memory: refused before anything is allocated.
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> DeviceTensor.packColumns(DType.F32, rows, InternalAccess.hostAddress(host)));
        assertTrue(e.getMessage().contains("not GPU memory") || e.getMessage().contains("page-locked"),
            e.getMessage());
      }
    }
  }
}
