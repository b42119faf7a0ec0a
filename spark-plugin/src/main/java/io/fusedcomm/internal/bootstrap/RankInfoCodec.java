package io.fusedcomm.internal.bootstrap;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.CommunicatorException;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

/**
 * Versioned compact binary encoding of {@link RankInfo}, carried as a Base64 string through
 * {@code BarrierTaskContext.allGather}.
 *
 * <p>Layout, version 2 (integers big-endian; {@code varint} is unsigned LEB128; a {@code string}
 * is a varint byte length then UTF-8 bytes):
 *
 * <pre>
 * magic            2 bytes   'F' 'C'
 * version          1 byte    2
 * host             string
 * executorId       string
 * gpuId            string
 * gpuUuid          string
 * backend          1 byte    0 auto, 1 cuda, 2 host
 * transportAddress string
 * jobToken         8 bytes
 * commNonce        8 bytes
 * authShare        32 bytes  (RankInfo.AUTH_SHARE_BYTES)
 * world            varint
 * rank             varint
 * fingerprint      8 bytes
 * opDescription    string
 * ipcHandles       varint length, then the bytes
 * </pre>
 *
 * Nothing may follow the last field. A change of layout gets a new version; a decoder refuses
 * versions it does not know, so executors running different fusedcomm jars fail with a message
 * saying so instead of misreading each other.
 */
public final class RankInfoCodec {
  /** The encoding version this code writes and reads. */
  public static final int VERSION = 2;

  private static final byte MAGIC_0 = 'F';
  private static final byte MAGIC_1 = 'C';

  private RankInfoCodec() {}

  /**
   * Encodes one rank's info.
   *
   * @throws IllegalArgumentException if {@code info.blobVersion()} is not {@link #VERSION} or a
   *     number is negative
   */
  public static String encode(RankInfo info) {
    if (info.blobVersion() != VERSION) {
      throw new IllegalArgumentException(
          "cannot encode blob version " + info.blobVersion() + "; this code writes " + VERSION);
    }
    if (info.world() < 1 || info.rank() < 0) {
      throw new IllegalArgumentException(
          "world must be >= 1 and rank >= 0, got world " + info.world() + ", rank " + info.rank());
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream(128 + info.ipcHandlesLength());
    out.write(MAGIC_0);
    out.write(MAGIC_1);
    out.write(VERSION);
    writeString(out, info.host());
    writeString(out, info.executorId());
    writeString(out, info.gpuId());
    writeString(out, info.gpuUuid());
    out.write(backendCode(info.backend()));
    writeString(out, info.transportAddress());
    writeLong(out, info.jobToken());
    writeLong(out, info.commNonce());
    byte[] share = info.authShare();
    out.write(share, 0, share.length);
    writeVarint(out, info.world());
    writeVarint(out, info.rank());
    writeLong(out, info.fingerprint());
    writeString(out, info.opDescription());
    byte[] ipc = info.ipcHandles();
    writeVarint(out, ipc.length);
    out.write(ipc, 0, ipc.length);
    return Base64.getEncoder().encodeToString(out.toByteArray());
  }

  /**
   * Decodes one blob.
   *
   * @throws CommunicatorException if the blob is not Base64, not a fusedcomm blob, of another
   *     version, truncated, or has trailing bytes
   */
  public static RankInfo decode(String blob) {
    return decode(blob, "bootstrap blob");
  }

  /**
   * Decodes the blobs of all ranks, as {@code allGather} returns them (ordered by partition id).
   *
   * @throws CommunicatorException naming the barrier task whose blob is bad
   */
  public static List<RankInfo> decodeAll(String[] blobs) {
    List<RankInfo> out = new ArrayList<>(blobs.length);
    for (int i = 0; i < blobs.length; i++) {
      out.add(decode(blobs[i], "bootstrap blob of barrier task " + i));
    }
    return out;
  }

  private static RankInfo decode(String blob, String what) {
    if (blob == null) {
      throw error(what + " is missing");
    }
    byte[] bytes;
    try {
      bytes = Base64.getDecoder().decode(blob);
    } catch (IllegalArgumentException e) {
      throw error(what + " is not valid Base64 (" + e.getMessage() + ")");
    }
    Reader r = new Reader(bytes, what);
    if (bytes.length < 3 || bytes[0] != MAGIC_0 || bytes[1] != MAGIC_1) {
      throw error(what + " is not a fusedcomm rank blob (bad magic or too short)");
    }
    r.pos = 2;
    int version = r.u8("version");
    if (version != VERSION) {
      throw error(
          what
              + " has encoding version "
              + version
              + " but this fusedcomm reads version "
              + VERSION
              + "; are all executors running the same fusedcomm jar?");
    }
    String host = r.string("host");
    String executorId = r.string("executorId");
    String gpuId = r.string("gpuId");
    String gpuUuid = r.string("gpuUuid");
    Backend backend = backendOf(r.u8("backend"), what);
    String transport = r.string("transportAddress");
    long jobToken = r.int64("jobToken");
    long commNonce = r.int64("commNonce");
    byte[] authShare = r.fixed(RankInfo.AUTH_SHARE_BYTES, "authShare");
    int world = r.varint("world");
    int rank = r.varint("rank");
    long fingerprint = r.int64("fingerprint");
    String opDescription = r.string("opDescription");
    byte[] ipc = r.bytes("ipcHandles");
    if (r.pos != bytes.length) {
      throw error(
          what
              + " has "
              + (bytes.length - r.pos)
              + " unexpected bytes after its last field (at offset "
              + r.pos
              + " of "
              + bytes.length
              + ")");
    }
    return new RankInfo(
        version, host, executorId, gpuId, gpuUuid, backend, transport, jobToken, commNonce,
        authShare, world, rank, fingerprint, opDescription, ipc);
  }

  private static int backendCode(Backend b) {
    switch (b) {
      case AUTO:
        return 0;
      case CUDA:
        return 1;
      case HOST:
        return 2;
      default:
        throw new AssertionError(b);
    }
  }

  private static Backend backendOf(int code, String what) {
    switch (code) {
      case 0:
        return Backend.AUTO;
      case 1:
        return Backend.CUDA;
      case 2:
        return Backend.HOST;
      default:
        throw error(what + " has unknown backend code " + code);
    }
  }

  private static CommunicatorException error(String detail) {
    return new CommunicatorException(
        detail, CommunicatorException.UNKNOWN, CommunicatorException.UNKNOWN, "bootstrap",
        CommunicatorException.UNKNOWN, null);
  }

  private static void writeString(ByteArrayOutputStream out, String s) {
    byte[] b = s.getBytes(StandardCharsets.UTF_8);
    writeVarint(out, b.length);
    out.write(b, 0, b.length);
  }

  private static void writeLong(ByteArrayOutputStream out, long v) {
    for (int shift = 56; shift >= 0; shift -= 8) {
      out.write((int) (v >>> shift) & 0xff);
    }
  }

  private static void writeVarint(ByteArrayOutputStream out, int v) {
    while ((v & ~0x7f) != 0) {
      out.write((v & 0x7f) | 0x80);
      v >>>= 7;
    }
    out.write(v);
  }

  /** Bounds-checked reads that say which field ran past the end. */
  private static final class Reader {
    final byte[] b;
    final String what;
    int pos;

    Reader(byte[] b, String what) {
      this.b = b;
      this.what = what;
    }

    private void need(int n, String field) {
      if (n < 0 || b.length - pos < n) {
        throw error(
            what
                + " is truncated: field "
                + field
                + " needs "
                + n
                + " bytes at offset "
                + pos
                + " but the blob has "
                + b.length
                + " bytes");
      }
    }

    int u8(String field) {
      need(1, field);
      return b[pos++] & 0xff;
    }

    long int64(String field) {
      need(8, field);
      long v = 0;
      for (int i = 0; i < 8; i++) {
        v = (v << 8) | (b[pos++] & 0xff);
      }
      return v;
    }

    int varint(String field) {
      int v = 0;
      for (int shift = 0; shift < 35; shift += 7) {
        int x = u8(field);
        v |= (x & 0x7f) << shift;
        if ((x & 0x80) == 0) {
          if (v < 0 || (shift == 28 && x > 0x07)) {
            break;
          }
          return v;
        }
      }
      throw error(what + " has a malformed number in field " + field);
    }

    byte[] bytes(String field) {
      return fixed(varint(field), field);
    }

    byte[] fixed(int n, String field) {
      need(n, field);
      byte[] out = new byte[n];
      System.arraycopy(b, pos, out, 0, n);
      pos += n;
      return out;
    }

    String string(String field) {
      return new String(bytes(field), StandardCharsets.UTF_8);
    }
  }
}
