package io.fusedcomm.examples;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.rapids.ColumnarBarrierStage;
import io.fusedcomm.rapids.CudfTensors;
import java.util.List;
import java.util.Locale;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;

/**
 * Example 05's hand-off with the RAPIDS Accelerator: {@code ColumnarRdd(features)} gives each
 * barrier task its partition as a cuDF Table on the executor's GPU, and the tensors are the
 * table's memory: x over the elements of the {@code array<smallint>} column (bf16 bit patterns,
 * row-major N_r × K), y over the float column. In its own class so that the CPU form never loads
 * fusedcomm-rapids.
 */
final class RapidsHandOff {
  private RapidsHandOff() {}

  static List<RapidsEtlTrainingExample.Shard> train(Dataset<Row> features, RapidsEtlTrainingExample.Problem p,
      CommOptions options) {
    return ColumnarBarrierStage.withCommunicator(features, options, (comm, context, tables) -> {
      if (!tables.hasNext()) {
        throw new IllegalStateException("rank " + comm.rank() + " got no table");
      }
      Object table = tables.next();
      if (tables.hasNext()) {
        throw new IllegalStateException("rank " + comm.rank() + "'s partition came as several tables; raise"
            + " spark.rapids.sql.batchSizeBytes so that one partition is one batch");
      }
      Object xColumn = CudfTensors.column(table, 0);
      Object yColumn = CudfTensors.column(table, 1);
      try (DeviceTensor x = CudfTensors.fromListColumn(xColumn, DType.BF16);
           DeviceTensor y = CudfTensors.fromColumn(yColumn)) {
        long xData = CudfTensors.dataAddress(xColumn);
        long yData = CudfTensors.dataAddress(yColumn);
        // No copy: the tensors are the columns' memory.
        if (x.devicePointer() != xData || y.devicePointer() != yData) {
          throw new IllegalStateException(String.format(Locale.ROOT, "rank %d: a tensor is not its column's memory"
              + " (x 0x%x vs 0x%x, y 0x%x vs 0x%x)", comm.rank(), x.devicePointer(), xData, y.devicePointer(), yData));
        }
        String handoff = String.format(Locale.ROOT, "x tensor 0x%x == cuDF list elements 0x%x, y tensor 0x%x =="
            + " cuDF column data 0x%x (no copies)", x.devicePointer(), xData, y.devicePointer(), yData);
        return List.of(RapidsEtlTrainingExample.train(comm, p, x, y, handoff)).iterator();
      }
    }).collect();
  }
}
