package io.fusedcomm.api;

import jcuda.Pointer;

/**
 * The API's JCuda forms, converted to the raw addresses and stream handles everything else takes.
 * The only class that touches JCuda's classes, and only when a caller passes or asks for one.
 * Code without JCuda must compile against the API too, and javac reads the parameter types of
 * every overload of a method it resolves: the stream forms of the ops therefore take {@code
 * Object} (checked here at run time), and the JCuda pointer form of {@code DeviceTensor.wrap} has
 * a name of its own.
 */
final class JCudaInterop {
  private JCudaInterop() {}

  /** The device address a JCuda pointer holds (its native pointer plus its byte offset). */
  static long address(Pointer pointer) {
    return NativeOps.pointerAddress(pointer);
  }

  /**
   * The handle of a JCuda stream ({@code jcuda.runtime.cudaStream_t}, {@code
   * jcuda.driver.CUstream}); 0 for null (no stream: the op runs synchronously).
   */
  static long stream(Object stream) {
    if (stream == null) {
      return 0;
    }
    if (!isInstance("jcuda.runtime.cudaStream_t", stream) && !isInstance("jcuda.driver.CUstream", stream)) {
      throw new IllegalArgumentException("expected a jcuda.runtime.cudaStream_t or jcuda.driver.CUstream (or a"
          + " long cudaStream_t handle), got " + describe(stream));
    }
    return NativeOps.nativeHandle(stream);
  }

  /** A JCuda pointer to {@code address}; needs JCuda on the classpath. */
  static Pointer pointer(long address) {
    return new AddressPointer(address);
  }

  /** JCuda keeps its raw-address constructor for subclasses. */
  private static final class AddressPointer extends Pointer {
    AddressPointer(long address) {
      super(address);
    }
  }

  /** Whether {@code o} is an instance of the JCuda class {@code name}, false without JCuda. */
  private static boolean isInstance(String name, Object o) {
    if (o == null) {
      return false;
    }
    try {
      return Class.forName(name, false, o.getClass().getClassLoader()).isInstance(o);
    } catch (ClassNotFoundException | LinkageError e) {
      return false;
    }
  }

  private static String describe(Object o) {
    return o == null ? "null" : "a " + o.getClass().getName();
  }
}
