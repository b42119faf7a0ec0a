package io.fusedcomm.api;

import io.fusedcomm.internal.bootstrap.Fingerprint;
import java.util.ArrayList;
import java.util.List;

/**
 * Options of one communicator. {@link #expectOp} declares the ops (with their global shapes) the
 * ranks intend to run; their fingerprint travels in the bootstrap, so ranks that disagree fail at
 * creation, all of them, naming the rank and the difference. (Each op also checks its own
 * parameters across ranks when it runs.)
 */
public final class CommOptions implements java.io.Serializable {
  private static final long serialVersionUID = 1L;
  private final List<String> plan = new ArrayList<>();
  private String name = "default";

  /** Default options: no declared op plan. */
  public static CommOptions defaults() {
    return new CommOptions();
  }

  /** A name for the communicator, part of its identity when a task creates several. */
  public CommOptions name(String name) {
    if (name == null || name.isEmpty() || name.contains(";") || name.contains("=")) {
      throw new IllegalArgumentException("communicator name must be a non-empty token: " + name);
    }
    this.name = name;
    return this;
  }

  /** Declares an op the ranks will run, with its dtype and global shape. */
  public CommOptions expectOp(String op, DType dtype, long... globalShape) {
    StringBuilder s = new StringBuilder(op).append('/').append(dtype.label());
    for (long d : globalShape) {
      s.append('/').append(d);
    }
    plan.add(s.toString());
    return this;
  }

  public String name() {
    return name;
  }

  /** The fingerprint of the declared plan and the world size. */
  Fingerprint planFingerprint(int world, int virtualHosts, boolean shareGpu) {
    Fingerprint.Builder b = Fingerprint.builder("communicator").add("name", name).add("world", world);
    if (virtualHosts > 1) {
      b.add("virtualHosts", virtualHosts);
    }
    if (shareGpu) {
      b.add("shareGpu", 1);
    }
    for (int i = 0; i < plan.size(); i++) {
      b.add("op" + i, plan.get(i));
    }
    return b.build();
  }
}
