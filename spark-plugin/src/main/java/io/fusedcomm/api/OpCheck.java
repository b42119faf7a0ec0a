package io.fusedcomm.api;

import io.fusedcomm.internal.bootstrap.Fingerprint;

/**
 * Argument checks of one op call, run before any data moves; every failure is an {@link
 * IllegalArgumentException} naming the op, the argument and what was expected.
 */
final class OpCheck {
  private final String op;
  private final Backend backend;
  private final int gpu;
  private DType dtype;

  /** Checks for {@code op} on {@code backend}; {@code gpu}: the GPU device tensors must be on (-1: any). */
  OpCheck(String op, Backend backend, int gpu) {
    this.op = op;
    this.backend = backend;
    this.gpu = gpu;
  }

  private IllegalArgumentException error(String message) {
    return new IllegalArgumentException(op + ": " + message);
  }

  private OpCheck present(String name, Tensor t) {
    if (t == null) {
      throw error(name + " must not be null");
    }
    if (backend == Backend.HOST && t.isDevice()) {
      throw error(name + " is a DeviceTensor, but this communicator runs on the host backend, which takes"
          + " HostTensor arguments (spark.fusedcomm.backend)");
    }
    if (backend == Backend.CUDA && !t.isDevice()) {
      throw error(name + " is a HostTensor, but the cuda backend takes DeviceTensor arguments");
    }
    if (gpu >= 0 && t instanceof DeviceTensor d && d.device() != gpu) {
      throw error(name + " is on GPU " + d.device() + ", but this communicator runs on GPU " + gpu);
    }
    return this;
  }

  /** {@code t} is floating point; its dtype becomes the op's. */
  OpCheck floating(String name, Tensor t) {
    present(name, t);
    if (!t.dtype().isFloating()) {
      throw error(name + " must be f32 or bf16, got " + t.dtype().label());
    }
    dtype = t.dtype();
    return this;
  }

  /** {@code t} has the same dtype as {@code like}. */
  OpCheck same(String name, Tensor t, Tensor like) {
    present(name, t);
    if (t.dtype() != like.dtype()) {
      throw error(name + " is " + t.dtype().label() + " but must match " + like.dtype().label());
    }
    return this;
  }

  /** {@code t} has exactly dtype {@code type}. */
  OpCheck typed(String name, Tensor t, DType type) {
    present(name, t);
    if (t.dtype() != type) {
      throw error(name + " must be " + type.label() + ", got " + t.dtype().label());
    }
    return this;
  }

  OpCheck numel(String name, Tensor t, long expected) {
    if (t.numel() != expected) {
      throw error(name + " has " + t.numel() + " elements " + t.shapeString() + ", expected " + expected);
    }
    return this;
  }

  private OpCheck rankOf(String name, Tensor t, int r) {
    if (t.rank() != r) {
      throw error(name + " must have " + r + " dimensions, got " + t.shapeString());
    }
    return this;
  }

  OpCheck rank2(String name, Tensor t) {
    return rankOf(name, t, 2);
  }

  OpCheck rank3(String name, Tensor t) {
    return rankOf(name, t, 3);
  }

  OpCheck rank4(String name, Tensor t) {
    return rankOf(name, t, 4);
  }

  OpCheck dim(String name, Tensor t, int i, long expected) {
    if (t.dim(i) != expected) {
      throw error(name + " " + t.shapeString() + " has dimension " + i + " = " + t.dim(i) + ", expected " + expected);
    }
    return this;
  }

  OpCheck layout(WeightLayout layout) {
    if (layout == null) {
      throw error("weight layout must not be null");
    }
    return this;
  }

  /** {@code w} is {@code n × k} (NK) or {@code k × n} (KN). */
  OpCheck weight(Tensor w, WeightLayout layout, long n, long k) {
    long rows = layout == WeightLayout.NK ? n : k;
    long cols = layout == WeightLayout.NK ? k : n;
    if (w.dim(0) != rows || w.dim(1) != cols) {
      throw error("w " + w.shapeString() + " must be [" + rows + ", " + cols + "] for layout " + layout);
    }
    return this;
  }

  /**
   * A stream (0: none) is only for the cuda backend (the host backend's ops are synchronous), and
   * must belong to the communicator's GPU (not asked while the stream captures a CUDA graph,
   * which CUDA forbids: a launch there on another GPU's stream fails the op instead).
   */
  OpCheck stream(long stream) {
    if (stream == 0) {
      return this;
    }
    if (backend != Backend.CUDA) {
      throw error("a CUDA stream was given, but this communicator runs on the " + backend.configName()
          + " backend, whose ops are synchronous");
    }
    int device = NativeOps.streamDevice(stream);
    if (gpu >= 0 && device >= 0 && device != gpu) {
      throw error("the stream 0x" + Long.toHexString(stream) + " belongs to GPU " + device
          + ", but this communicator runs on GPU " + gpu);
    }
    return this;
  }

  /** Starts the fingerprint of the op's global parameters. */
  Fingerprint.Builder fingerprint() {
    return Fingerprint.builder(op).add("dtype", dtype.label());
  }
}
