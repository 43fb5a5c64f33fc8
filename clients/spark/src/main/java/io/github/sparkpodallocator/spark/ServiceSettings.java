package io.github.sparkpodallocator.spark;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Optional;
import org.apache.spark.SparkConf;
import org.apache.spark.network.util.JavaUtils;

/**
 * How the plugin reaches the allocation service: the {@code spark.kubernetes.allocation.service.*}
 * keys of the driver's SparkConf, checked once when Spark builds the allocator so a mistake stops
 * the driver at start with the key named.
 */
public final class ServiceSettings {
  /** The prefix of every key the plugin reads for itself. */
  public static final String PREFIX = "spark.kubernetes.allocation.service.";

  public static final String ADDRESS = PREFIX + "address";
  public static final String TLS_ENABLED = PREFIX + "tls.enabled";
  public static final String TLS_CA_FILE = PREFIX + "tls.caFile";
  public static final String TLS_CERT_FILE = PREFIX + "tls.certFile";
  public static final String TLS_KEY_FILE = PREFIX + "tls.keyFile";
  public static final String TOKEN_FILE = PREFIX + "tokenFile";
  public static final String DEADLINE = PREFIX + "deadline";
  public static final String RETRY_TIMEOUT = PREFIX + "retryTimeout";
  public static final String IS_DELETED_WHEN_UNAVAILABLE = PREFIX + "isDeletedWhenUnavailable";
  public static final String CHECK_INTERVAL = PREFIX + "checkInterval";
  public static final String EXECUTOR_EVENTS = PREFIX + "executorEvents";

  /** The token a pod's service account gets, sent when {@link #TOKEN_FILE} is not set. */
  public static final Path SERVICE_ACCOUNT_TOKEN =
      Path.of("/var/run/secrets/kubernetes.io/serviceaccount/token");

  static final Duration DEFAULT_DEADLINE = Duration.ofSeconds(10);
  static final Duration DEFAULT_RETRY_TIMEOUT = Duration.ofSeconds(60);
  static final Duration DEFAULT_CHECK_INTERVAL = Duration.ofSeconds(10);

  private final String address;
  private final boolean tls;
  private final Optional<Path> caFile;
  private final Optional<Path> certFile;
  private final Optional<Path> keyFile;
  private final Optional<Path> tokenFile;
  private final Duration deadline;
  private final Duration retryTimeout;
  private final boolean isDeletedWhenUnavailable;
  private final Duration checkInterval;
  private boolean executorEvents = true;

  private ServiceSettings(
      String address,
      boolean tls,
      Optional<Path> caFile,
      Optional<Path> certFile,
      Optional<Path> keyFile,
      Optional<Path> tokenFile,
      Duration deadline,
      Duration retryTimeout,
      boolean isDeletedWhenUnavailable,
      Duration checkInterval) {
    this.address = address;
    this.tls = tls;
    this.caFile = caFile;
    this.certFile = certFile;
    this.keyFile = keyFile;
    this.tokenFile = tokenFile;
    this.deadline = deadline;
    this.retryTimeout = retryTimeout;
    this.isDeletedWhenUnavailable = isDeletedWhenUnavailable;
    this.checkInterval = checkInterval;
  }

  /**
   * Reads the settings from {@code conf}; {@code serviceAccountToken} is the default token file,
   * used only when it exists.
   *
   * @throws IllegalArgumentException naming the key whose value is missing or invalid
   */
  public static ServiceSettings fromConf(SparkConf conf, Path serviceAccountToken) {
    String address = get(conf, ADDRESS).orElseThrow(() -> new IllegalArgumentException(
        ADDRESS + " is required: the gRPC address (host:port) of the spark-pod-allocator service"));
    if (address.contains("://") && !address.startsWith("dns:") && !address.startsWith("unix:")) {
      throw new IllegalArgumentException(ADDRESS + ": expected host:port (or a gRPC target such as"
          + " dns:///host:port), got " + address);
    }
    Optional<Path> caFile = existingFile(conf, TLS_CA_FILE);
    Optional<Path> certFile = existingFile(conf, TLS_CERT_FILE);
    Optional<Path> keyFile = existingFile(conf, TLS_KEY_FILE);
    if (certFile.isPresent() != keyFile.isPresent()) {
      throw new IllegalArgumentException(TLS_CERT_FILE + " and " + TLS_KEY_FILE
          + " go together: a client certificate needs its key");
    }
    boolean anyTlsFile = caFile.isPresent() || certFile.isPresent();
    boolean tls = bool(conf, TLS_ENABLED, anyTlsFile);
    if (!tls && anyTlsFile) {
      throw new IllegalArgumentException(TLS_ENABLED + " is false but TLS files are set ("
          + TLS_CA_FILE + ", " + TLS_CERT_FILE + ")");
    }

    Optional<Path> tokenFile;
    Optional<String> token = get(conf, TOKEN_FILE);
    if (token.isPresent()) {
      // Set to an empty value: no token at all.
      tokenFile = token.get().isBlank() ? Optional.empty() : existingFile(conf, TOKEN_FILE);
    } else {
      tokenFile = Files.isReadable(serviceAccountToken)
          ? Optional.of(serviceAccountToken) : Optional.empty();
    }

    Duration deadline = positiveDuration(conf, DEADLINE, DEFAULT_DEADLINE);
    Duration retryTimeout = duration(conf, RETRY_TIMEOUT, DEFAULT_RETRY_TIMEOUT);
    boolean isDeletedWhenUnavailable = bool(conf, IS_DELETED_WHEN_UNAVAILABLE, false);
    Duration checkInterval = positiveDuration(conf, CHECK_INTERVAL, DEFAULT_CHECK_INTERVAL);
    ServiceSettings settings = new ServiceSettings(address, tls, caFile, certFile, keyFile,
        tokenFile, deadline, retryTimeout, isDeletedWhenUnavailable, checkInterval);
    settings.executorEvents = bool(conf, EXECUTOR_EVENTS, true);
    return settings;
  }

  /** The gRPC target, e.g. {@code spark-pod-allocator.spark.svc:50051}. */
  public String address() {
    return address;
  }

  /** Whether the channel uses TLS (else plaintext). */
  public boolean tls() {
    return tls;
  }

  /** CA certificates (PEM) that verify the service; the JVM's trust store when empty. */
  public Optional<Path> caFile() {
    return caFile;
  }

  /** The client certificate chain (PEM), for mutual TLS. */
  public Optional<Path> certFile() {
    return certFile;
  }

  /** The client certificate's private key (PEM, PKCS#8). */
  public Optional<Path> keyFile() {
    return keyFile;
  }

  /** The file holding the bearer token sent with every call (re-read as it rotates). */
  public Optional<Path> tokenFile() {
    return tokenFile;
  }

  /** The deadline of each call (one attempt). */
  public Duration deadline() {
    return deadline;
  }

  /** How long an UNAVAILABLE service is retried before the call fails. */
  public Duration retryTimeout() {
    return retryTimeout;
  }

  /** What {@code isDeleted} answers when the service cannot be reached. */
  public boolean isDeletedWhenUnavailable() {
    return isDeletedWhenUnavailable;
  }

  /**
   * How often the plugin asks the service about the application (GetStatus), so that a
   * service that lost the application (a restart without its registration) gets it again
   * even while Spark has nothing to tell it.
   */
  public Duration checkInterval() {
    return checkInterval;
  }

  /**
   * Whether the service's executor event stream feeds the driver's snapshot store, so the
   * driver may turn its own pod watch and polling off.
   */
  public boolean executorEvents() {
    return executorEvents;
  }

  private static Optional<String> get(SparkConf conf, String key) {
    return conf.contains(key) ? Optional.of(conf.get(key).trim()) : Optional.empty();
  }

  private static boolean bool(SparkConf conf, String key, boolean dflt) {
    Optional<String> value = get(conf, key);
    if (value.isEmpty()) {
      return dflt;
    }
    switch (value.get().toLowerCase(java.util.Locale.ROOT)) {
      case "true":
        return true;
      case "false":
        return false;
      default:
        throw new IllegalArgumentException(key + ": expected true or false, got " + value.get());
    }
  }

  private static Optional<Path> existingFile(SparkConf conf, String key) {
    Optional<String> value = get(conf, key);
    if (value.isEmpty() || value.get().isEmpty()) {
      return Optional.empty();
    }
    Path path = Path.of(value.get());
    if (!Files.isReadable(path)) {
      throw new IllegalArgumentException(key + ": " + path + " does not exist or is not readable");
    }
    return Optional.of(path);
  }

  private static Duration duration(SparkConf conf, String key, Duration dflt) {
    Optional<String> value = get(conf, key);
    if (value.isEmpty()) {
      return dflt;
    }
    long millis;
    try {
      // Spark's own time syntax: "500ms", "10s", "2min"; a bare number is milliseconds.
      millis = JavaUtils.timeStringAsMs(value.get());
    } catch (RuntimeException e) {
      throw new IllegalArgumentException(key + ": expected a duration such as 10s or 500ms, got "
          + value.get(), e);
    }
    if (millis < 0) {
      throw new IllegalArgumentException(key + ": must not be negative, got " + value.get());
    }
    return Duration.ofMillis(millis);
  }

  private static Duration positiveDuration(SparkConf conf, String key, Duration dflt) {
    Duration d = duration(conf, key, dflt);
    if (d.isZero()) {
      throw new IllegalArgumentException(key + ": must be greater than 0");
    }
    return d;
  }
}
