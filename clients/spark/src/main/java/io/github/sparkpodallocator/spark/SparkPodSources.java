package io.github.sparkpodallocator.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.apache.spark.SparkConf;

/**
 * Spark's own executor pod sources in the driver: its pod watch and its periodic pod LIST,
 * which the service's executor event stream replaces ({@link ExecutorEventsFeed}).
 *
 * <p>Spark's {@code KubernetesClusterManager.createSchedulerBackend} constructs the allocator
 * with the SparkContext's own conf before it constructs {@code ExecutorPodsWatchSnapshotSource}
 * and {@code ExecutorPodsPollingSnapshotSource}, and each of those reads its key once, in its
 * constructor (Spark 4.0.1 and 4.2.0, read in their classes). So the keys set on that conf
 * while the allocator is constructed turn both sources off for the application.
 */
final class SparkPodSources {
  static final String WATCHER = "spark.kubernetes.executor.enableApiWatcher";
  static final String POLLING = "spark.kubernetes.executor.enableApiPolling";

  private SparkPodSources() {}

  /**
   * Sets each of the two keys the user did not set to {@code false}. A key the user set to
   * {@code true} is kept, and a warning saying what it costs is returned for it.
   */
  static List<String> turnOff(SparkConf conf) {
    List<String> warnings = new ArrayList<>();
    if (keptOn(conf, WATCHER)) {
      warnings.add(WATCHER + "=true: the driver keeps its own watch on its executor pods, one"
          + " more watch held open on the API server for as long as the application runs,"
          + " beside the spark-pod-allocator event stream that already tells it of every"
          + " executor pod; unset it to drop the watch");
    }
    if (keptOn(conf, POLLING)) {
      warnings.add(POLLING + "=true: the driver keeps LISTing its executor pods every"
          + " spark.kubernetes.executor.apiPollingInterval (30s by default), one LIST on the"
          + " API server each time, beside the spark-pod-allocator event stream that already"
          + " tells it of every executor pod; unset it to drop the LISTs");
    }
    return warnings;
  }

  /** Whether the user set {@code key} to true; sets it to false when the user left it unset. */
  private static boolean keptOn(SparkConf conf, String key) {
    if (!conf.contains(key)) {
      conf.set(key, "false");
      return false;
    }
    // Spark's own reading of a boolean key: trimmed, any case.
    return conf.get(key).trim().toLowerCase(Locale.ROOT).equals("true");
  }
}
