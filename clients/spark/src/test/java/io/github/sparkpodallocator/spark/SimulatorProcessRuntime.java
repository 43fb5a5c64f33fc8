package io.github.sparkpodallocator.spark;

import java.nio.file.Path;

/**
 * The service's configuration for the Spark test: gRPC and the simulated API server on the given
 * loopback ports, and a kubelet that runs pods of {@code image} as local processes through the
 * repository's executor entrypoint (docs/simulator.md, "process runtime").
 */
final class SimulatorProcessRuntime {
  static final String REPO_PROPERTY = "spark.pod.allocator.repo";

  private SimulatorProcessRuntime() {}

  /** The repository root (the entrypoint script lives in its scripts/). */
  static Path repository() {
    return Path.of(System.getProperty(REPO_PROPERTY, "../..")).toAbsolutePath().normalize();
  }

  static String config(int grpcPort, int apiPort, String image, Path work) {
    Path entrypoint = repository().resolve("scripts/sim-spark-executor.sh");
    return String.join("\n",
        "listen = \"127.0.0.1:" + grpcPort + "\"",
        "",
        "[simulator]",
        "listen = \"127.0.0.1:" + apiPort + "\"",
        "",
        "[simulator.kubelet]",
        "runtime = \"process\"",
        "start_delay_min_ms = 0",
        "start_delay_max_ms = 0",
        "",
        "[simulator.kubelet.process]",
        "work_dir = " + toml(work.resolve("pods").toString()),
        "",
        "[simulator.kubelet.process.images]",
        toml(image) + " = [" + toml(entrypoint.toString()) + "]",
        "");
  }

  private static String toml(String s) {
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }
}
