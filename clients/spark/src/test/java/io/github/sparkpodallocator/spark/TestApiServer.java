package io.github.sparkpodallocator.spark;

import io.fabric8.kubernetes.client.utils.Serialization;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;

/**
 * The real kube-apiserver of the Rust tests (tests/kube-apiserver, docs/real-apiserver.md),
 * started as a process with {@code --control-plane}: kube-scheduler, kube-controller-manager
 * and kwok nodes run beside it. The binary is named by the system property
 * {@value #BINARY_PROPERTY} ({@code bash scripts/build-test-apiserver.sh} prints it); unset,
 * the tests that need it are skipped.
 */
final class TestApiServer implements AutoCloseable {
  static final String BINARY_PROPERTY = "test.apiserver.bin";

  private final Process process;
  private final OutputStream stdin;
  /** The server's directory: state.json, ca.crt, kubeconfig, audit.log, the components' logs. */
  final Path dir;
  /** {@code https://127.0.0.1:PORT}. */
  final String url;
  /** The admin's bearer token (system:masters). */
  final String adminToken;

  private TestApiServer(Process process, Path dir, String url, String adminToken) {
    this.process = process;
    this.stdin = process.getOutputStream();
    this.dir = dir;
    this.url = url;
    this.adminToken = adminToken;
  }

  /** The binary; the test is skipped (with the reason) when the property is unset. */
  static Path binary() {
    String path = System.getProperty(BINARY_PROPERTY, "");
    Assumptions.assumeFalse(path.isEmpty(), "-D" + BINARY_PROPERTY + "=<path of the test API"
        + " server> is not set: the Spark job on the real control plane is skipped"
        + " (bash scripts/build-test-apiserver.sh builds it and prints the path)");
    Path binary = Path.of(path).toAbsolutePath();
    if (!Files.isExecutable(binary)) {
      throw new IllegalStateException(BINARY_PROPERTY + "=" + path + " is not an executable file");
    }
    return binary;
  }

  /**
   * Starts the server with its control plane on {@code dir} (created) and waits until it
   * prints {@code ready} (its nodes Ready, the {@code default} ServiceAccount made). It ends
   * with this JVM: {@code --exit-with-stdin}.
   */
  static TestApiServer start(Path dir, String... serverArgs) throws IOException,
      InterruptedException {
    Path binary = binary();
    Files.createDirectories(dir);
    List<String> command = new ArrayList<>(List.of(binary.toString(), "--dir", dir.toString(),
        "--exit-with-stdin", "--control-plane"));
    command.addAll(List.of(serverArgs));
    Process process = new ProcessBuilder(command)
        .redirectErrorStream(false)
        .redirectError(dir.resolve("apiserver.log").toFile())
        .start();
    CompletableFuture<String> ready = CompletableFuture.supplyAsync(() -> {
      try (BufferedReader out = new BufferedReader(
          new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = out.readLine()) != null) {
          if (line.startsWith("ready ")) {
            return line.substring("ready ".length()).trim();
          }
        }
        return null;
      } catch (IOException e) {
        return null;
      }
    });
    String url;
    try {
      // A hang guard for a cold start on a loaded machine, not a timing assertion.
      url = ready.get(180, TimeUnit.SECONDS);
    } catch (Exception e) {
      url = null;
    }
    if (url == null) {
      process.destroyForcibly();
      throw new IllegalStateException("the test API server did not become ready; its log:\n"
          + tail(dir.resolve("apiserver.log"), 4000));
    }
    Map<?, ?> state = Serialization.unmarshal(
        Files.readString(dir.resolve("state.json"), StandardCharsets.UTF_8), Map.class);
    String token = String.valueOf(((Map<?, ?>) state.get("tokens")).get("admin"));
    return new TestApiServer(process, dir, url, token);
  }

  /** The admin's kubeconfig (CA file, bearer token). */
  Path kubeconfig() {
    return dir.resolve("kubeconfig");
  }

  /** The CA of the serving certificate. */
  Path caCert() {
    return dir.resolve("ca.crt");
  }

  /** The audit log's events (JSON lines; written in blocking mode, so complete when read). */
  List<Map<?, ?>> auditEvents() throws IOException {
    List<Map<?, ?>> events = new ArrayList<>();
    for (String line : Files.readAllLines(dir.resolve("audit.log"), StandardCharsets.UTF_8)) {
      if (!line.isBlank()) {
        events.add(Serialization.unmarshal(line, Map.class));
      }
    }
    return events;
  }

  static String tail(Path file, int chars) {
    try {
      String text = Files.readString(file, StandardCharsets.UTF_8);
      return text.length() <= chars ? text : text.substring(text.length() - chars);
    } catch (IOException e) {
      return "(cannot read " + file + ": " + e + ")";
    }
  }

  /** Closes its stdin (the server shuts down, its components with it) and waits. */
  @Override
  public void close() {
    try {
      stdin.close();
    } catch (IOException ignored) {
      // Already closed: the process is ending anyway.
    }
    try {
      if (!process.waitFor(20, TimeUnit.SECONDS)) {
        process.destroyForcibly();
        process.waitFor();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }
}
