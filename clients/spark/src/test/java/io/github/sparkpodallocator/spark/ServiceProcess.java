package io.github.sparkpodallocator.spark;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Assumptions;

/**
 * A real spark-pod-allocator process (the binary named by the system property
 * {@value #BINARY_PROPERTY}), its log in a file, ended with the test.
 */
final class ServiceProcess implements AutoCloseable {
  static final String BINARY_PROPERTY = "spark.pod.allocator.bin";

  private final Process process;
  private final Path log;
  private final String description;

  private ServiceProcess(Process process, Path log, String description) {
    this.process = process;
    this.log = log;
    this.description = description;
  }

  /** The binary; the test is skipped (with the reason) when the property is unset. */
  static Path binary() {
    String path = System.getProperty(BINARY_PROPERTY, "");
    Assumptions.assumeFalse(path.isEmpty(), "-D" + BINARY_PROPERTY + "=<path of the"
        + " spark-pod-allocator binary> is not set: the tests against the real service are skipped"
        + " (clients/spark/ci.sh always sets it)");
    Path binary = Path.of(path).toAbsolutePath();
    if (!Files.isExecutable(binary)) {
      throw new IllegalStateException(BINARY_PROPERTY + "=" + path + " is not an executable file");
    }
    return binary;
  }

  /** A free loopback port (free when asked; the process binds it right after). */
  static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      return socket.getLocalPort();
    }
  }

  /**
   * Starts {@code binary args...} with {@code env} added, in {@code dir}, and waits until
   * {@code port} accepts connections.
   */
  static ServiceProcess start(Path dir, Map<String, String> env, int port, String... args)
      throws IOException, InterruptedException {
    ServiceProcess service = launch(dir, env, args);
    service.awaitPort(port, Duration.ofSeconds(60));
    return service;
  }

  /** Starts {@code binary args...} with {@code env} added, in {@code dir}, without waiting. */
  static ServiceProcess launch(Path dir, Map<String, String> env, String... args)
      throws IOException {
    List<String> command = new ArrayList<>();
    command.add(binary().toString());
    command.addAll(List.of(args));
    Files.createDirectories(dir);
    Path log = Files.createTempFile(dir, "service-", ".log");
    ProcessBuilder builder = new ProcessBuilder(command)
        .directory(dir.toFile())
        .redirectErrorStream(true)
        .redirectOutput(log.toFile());
    builder.environment().putAll(env);
    Process process = builder.start();
    return new ServiceProcess(process, log, String.join(" ", command));
  }

  /** Whether the process still runs. */
  boolean isAlive() {
    return process.isAlive();
  }

  private void awaitPort(int port, Duration timeout) throws IOException, InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    while (System.nanoTime() < end) {
      if (!process.isAlive()) {
        throw new IllegalStateException(description + " exited with " + process.exitValue()
            + ":\n" + log());
      }
      try (Socket socket = new Socket()) {
        socket.connect(new InetSocketAddress("127.0.0.1", port), 200);
        return;
      } catch (IOException notYet) {
        Thread.sleep(50);
      }
    }
    close();
    throw new IllegalStateException(description + " did not listen on " + port + " within "
        + timeout + ":\n" + log());
  }

  /** The process's output so far. */
  String log() {
    try {
      return Files.readString(log, StandardCharsets.UTF_8);
    } catch (IOException e) {
      return "(cannot read " + log + ": " + e + ")";
    }
  }

  /** Ends the process (SIGTERM, then SIGKILL after 10 s) and waits for it. */
  @Override
  public void close() {
    process.destroy();
    try {
      if (!process.waitFor(10, java.util.concurrent.TimeUnit.SECONDS)) {
        process.destroyForcibly();
        process.waitFor();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }
}
