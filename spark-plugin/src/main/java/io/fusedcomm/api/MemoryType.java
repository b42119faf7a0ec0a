package io.fusedcomm.api;

/**
 * What CUDA knows of an address, as the native C API numbers it: mirrors {@code
 * fc_memory_type_t} of {@code fusedcomm.h} ({@code FC_MEMORY_<name>}), the same names and
 * {@link #code() values}, checked by a unit test. {@link DeviceTensor#wrap(long, DType, long...)}
 * reads it to refuse an address that is not GPU memory.
 */
enum MemoryType {
  UNREGISTERED(0),
  HOST(1),
  DEVICE(2),
  MANAGED(3);

  private final int code;

  MemoryType(int code) {
    this.code = code;
  }

  /** The value of {@code FC_MEMORY_<name>} in the native C API. */
  int code() {
    return code;
  }

  /** The constant with this native value. */
  static MemoryType fromCode(long code) {
    for (MemoryType t : values()) {
      if (t.code == code) {
        return t;
      }
    }
    throw new IllegalArgumentException("unknown memory type " + code);
  }
}
