package io.github.sparkpodallocator.spark;

import java.nio.file.Path;

/**
 * The service's configuration for the Spark test (docs/process-runtime.md): gRPC and the
 * simulated API server on the given loopback ports, and a kubelet that runs pods of
 * {@code image} as local processes through the repository's executor entrypoint, with this
 * JVM's Java and class path (Spark, and the tasks' classes in test-classes).
 */
final class SimulatorProcessRuntime {
  static final String REPO_PROPERTY = "spark.pod.allocator.repo";

  private SimulatorProcessRuntime() {}

  /** The repository root (the entrypoint script lives in its scripts/). */
  static Path repository() {
    return Path.of(System.getProperty(REPO_PROPERTY, "../..")).toAbsolutePath().normalize();
  }

  /**
   * A pod that only runs (a process sleeping), standing for the driver pod of a driver that
   * runs in the test's JVM.
   */
  static final String DRIVER_PLACEHOLDER_IMAGE = "spark-pod-allocator/driver-placeholder:it";

  /**
   * The executor image whose executors each bind and advertise a loopback address of their
   * own (127.0.X.Y from the executor id), as pods on a cluster have their own IPs: Spark
   * keeps a decommissioned executor's migrated shuffle output only when it went to another
   * host (scripts/sim-spark-executor.sh, {@code SPARK_SIM_HOST_PER_EXECUTOR}).
   */
  static final String IMAGE_HOST_PER_EXECUTOR = "spark-pod-allocator/spark-executor-own-host:it";

  static String config(int grpcPort, int apiPort, String image, Path work) {
    return "listen = " + toml("127.0.0.1:" + grpcPort) + "\n\n"
        + simulatorConfig(apiPort, image, work);
  }

  /** The [simulator] part alone, for a cluster run on its own ({@code simulate}). */
  static String simulatorConfig(int apiPort, String image, Path work) {
    Path entrypoint = repository().resolve("scripts/sim-spark-executor.sh");
    return String.join("\n",
        "[simulator]",
        "listen = " + toml("127.0.0.1:" + apiPort),
        "",
        "[simulator.kubelet]",
        "runtime = \"process\"",
        "work_dir = " + toml(work.resolve("pods").toString()),
        "start_delay_min_ms = 0",
        "start_delay_max_ms = 0",
        "",
        "[[simulator.kubelet.process_images]]",
        "image = " + toml(image),
        "command = [\"bash\", " + toml(entrypoint.toString()) + "]",
        "env = [",
        "  { name = \"SPARK_SIM_CLASSPATH\", value = "
            + toml(System.getProperty("java.class.path")) + " },",
        "  { name = \"JAVA_HOME\", value = " + toml(System.getProperty("java.home")) + " },",
        "]",
        "",
        "[[simulator.kubelet.process_images]]",
        "image = " + toml(IMAGE_HOST_PER_EXECUTOR),
        "command = [\"bash\", " + toml(entrypoint.toString()) + "]",
        "env = [",
        "  { name = \"SPARK_SIM_CLASSPATH\", value = "
            + toml(System.getProperty("java.class.path")) + " },",
        "  { name = \"JAVA_HOME\", value = " + toml(System.getProperty("java.home")) + " },",
        "  { name = \"SPARK_SIM_HOST_PER_EXECUTOR\", value = \"true\" },",
        "]",
        "",
        "[[simulator.kubelet.process_images]]",
        "image = " + toml(DRIVER_PLACEHOLDER_IMAGE),
        "command = [\"sleep\", \"600\"]",
        "");
  }

  /** A TOML basic string; `$` doubled as the runtime reads `$$` as a literal `$`. */
  private static String toml(String s) {
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("$", "$$") + "\"";
  }
}
