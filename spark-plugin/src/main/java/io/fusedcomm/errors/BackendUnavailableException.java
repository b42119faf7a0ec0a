package io.fusedcomm.errors;

/**
 * A backend was requested (explicitly, or by the op) but cannot run on this host or executor.
 *
 * <p>The message is a sentence a user can act on, e.g. which library is missing or which Spark
 * setting assigns the executor a GPU. Thrown at executor start-up for {@code
 * spark.fusedcomm.backend=cuda} without a GPU, and by the runtime when a native backend fails to
 * load. A GPU backend is never silently replaced by the host backend.
 */
public class BackendUnavailableException extends CommunicatorException {
  private static final long serialVersionUID = 1L;

  private final String backend;

  /** The backend is unavailable for the reason given in {@code detail}; backend unnamed. */
  public BackendUnavailableException(String detail) {
    this(null, detail, null);
  }

  /**
   * The named backend is unavailable.
   *
   * @param backend configuration spelling of the backend (e.g. {@code cuda}), or null
   * @param detail why, as an actionable sentence
   * @param cause the underlying error, or null
   */
  public BackendUnavailableException(String backend, String detail, Throwable cause) {
    super(backend == null ? detail : "backend '" + backend + "' is unavailable: " + detail, cause);
    this.backend = backend;
  }

  /** Configuration spelling of the unavailable backend, or null where the native side did not say. */
  public String backend() {
    return backend;
  }
}
