package io.github.sparkpodallocator.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.util.Utils;
import spark.allocator.v1.Allocator.AllocationSettings;

/**
 * The service's {@code AllocationSettings} from Spark's own keys, so an application allocates
 * as Spark's built-in allocator would for the same configuration: each setting carries the
 * user's value or Spark's default. Where Spark's default means "no limit"
 * ({@code maxPendingPods}, {@code dynamicAllocation.maxExecutors}) nothing is sent and the
 * service's default applies.
 */
public final class SparkAllocationSettings {
  static final String BATCH_SIZE = "spark.kubernetes.allocation.batch.size";
  static final String BATCH_DELAY = "spark.kubernetes.allocation.batch.delay";
  static final String EXECUTOR_TIMEOUT = "spark.kubernetes.allocation.executor.timeout";
  static final String MAX_PENDING_PODS = "spark.kubernetes.allocation.maxPendingPods";
  static final String MAX_EXECUTORS = "spark.dynamicAllocation.maxExecutors";
  static final String EXECUTOR_IDLE_TIMEOUT = "spark.dynamicAllocation.executorIdleTimeout";
  static final String DELETE_ON_TERMINATION = "spark.kubernetes.executor.deleteOnTermination";
  static final String CHECK_ALL_CONTAINERS = "spark.kubernetes.executor.checkAllContainers";

  private SparkAllocationSettings() {}

  /**
   * The settings of an application whose executor container (in the template the plugin
   * built) is named {@code executorContainerName}.
   *
   * @throws IllegalArgumentException naming the Spark key whose value is invalid
   */
  public static AllocationSettings fromConf(SparkConf conf, String executorContainerName) {
    AllocationSettings.Builder settings = AllocationSettings.newBuilder();

    int batchSize = intValue(conf, BATCH_SIZE, 10);
    if (batchSize <= 0) {
      throw new IllegalArgumentException(BATCH_SIZE + ": must be a positive integer");
    }
    settings.setBatchSize(batchSize);

    long batchDelay = millis(conf, BATCH_DELAY, "1s");
    if (batchDelay <= 100) {
      throw new IllegalArgumentException(BATCH_DELAY + ": must be greater than 0.1s");
    }
    settings.setBatchDelayMs(batchDelay);

    // Spark waits max(5 x batch delay, executor.timeout) for a created pod to appear.
    long executorTimeout = millis(conf, EXECUTOR_TIMEOUT, "600s");
    if (executorTimeout <= 0) {
      throw new IllegalArgumentException(EXECUTOR_TIMEOUT + ": must be a positive time");
    }
    settings.setExecutorTimeoutMs(Math.max(executorTimeout, 5 * batchDelay));

    // Seconds when no unit is given, as Spark reads it.
    settings.setExecutorIdleTimeoutMs(seconds(conf, EXECUTOR_IDLE_TIMEOUT, "60s") * 1000);

    if (conf.contains(MAX_PENDING_PODS)) {
      int maxPending = intValue(conf, MAX_PENDING_PODS, Integer.MAX_VALUE);
      if (maxPending <= 0) {
        throw new IllegalArgumentException(MAX_PENDING_PODS + ": must be a positive integer");
      }
      settings.setMaxPendingPods(maxPending);
    }

    if (Utils.isDynamicAllocationEnabled(conf) && conf.contains(MAX_EXECUTORS)) {
      int maxExecutors = intValue(conf, MAX_EXECUTORS, Integer.MAX_VALUE);
      if (maxExecutors <= 0) {
        throw new IllegalArgumentException(MAX_EXECUTORS
            + ": must be positive for the allocation service (0 executors can never run a task)");
      }
      settings.setMaxExecutors(maxExecutors);
    }

    settings.setDeleteOnTermination(bool(conf, DELETE_ON_TERMINATION, true));
    settings.setCheckAllContainers(bool(conf, CHECK_ALL_CONTAINERS, true));
    settings.setExecutorContainerName(executorContainerName);
    return settings.build();
  }

  private static int intValue(SparkConf conf, String key, int dflt) {
    if (!conf.contains(key)) {
      return dflt;
    }
    String value = conf.get(key).trim();
    try {
      return Integer.parseInt(value);
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(key + ": expected an integer, got " + value, e);
    }
  }

  private static long millis(SparkConf conf, String key, String dflt) {
    try {
      return conf.getTimeAsMs(key, dflt);
    } catch (RuntimeException e) {
      throw new IllegalArgumentException(key + ": expected a time such as 1s, got "
          + conf.get(key, dflt), e);
    }
  }

  private static long seconds(SparkConf conf, String key, String dflt) {
    try {
      return conf.getTimeAsSeconds(key, dflt);
    } catch (RuntimeException e) {
      throw new IllegalArgumentException(key + ": expected a time such as 60s, got "
          + conf.get(key, dflt), e);
    }
  }

  private static boolean bool(SparkConf conf, String key, boolean dflt) {
    if (!conf.contains(key)) {
      return dflt;
    }
    String value = conf.get(key).trim();
    if (value.equalsIgnoreCase("true")) {
      return true;
    }
    if (value.equalsIgnoreCase("false")) {
      return false;
    }
    throw new IllegalArgumentException(key + ": expected true or false, got " + value);
  }
}
