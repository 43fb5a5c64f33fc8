package io.github.sparkpodallocator.spark;

import java.util.OptionalInt;
import java.util.OptionalLong;
import org.apache.spark.SparkConf;
import org.apache.spark.deploy.k8s.Config$;
import org.apache.spark.internal.config.ConfigEntry;
import spark.allocator.v1.Allocator.AllocationPolicy;
import spark.allocator.v1.Allocator.AllocationSettings;

/**
 * The service's {@code AllocationSettings} from Spark's own keys, so an application allocates
 * as Spark's built-in allocator would for the same configuration: each setting carries the
 * user's value or the default of the Spark version that runs (read through Spark's own config
 * entries, with their units and checks; 4.2 raised the batch size default from 10 to 20). Where
 * Spark's default means "no limit" ({@code maxPendingPods}, {@code maxPendingPodsPerRp},
 * {@code maximum}) nothing is sent and the service's default applies.
 *
 * <p>Spark 4.1's keys ({@link #MAX_PENDING_PODS_PER_PROFILE}, {@link #ALLOCATION_MAXIMUM}) are
 * read through Spark's entry where the running Spark has one, else (4.0) by name with 4.1's
 * rule (a positive integer). They apply on 4.0 too: the service implements them whatever the
 * driver's version, they can only hold allocation back, and a user who sets one asks for it;
 * ignoring it, as Spark 4.0's allocator does, would have one configuration allocate
 * differently by driver version without a word.
 */
public final class SparkAllocationSettings {
  private static final Config$ K8S = Config$.MODULE$;
  private static final org.apache.spark.internal.config.package$ CORE =
      org.apache.spark.internal.config.package$.MODULE$;

  /** Spark 4.1's per-resource-profile pending cap (SPARK-53324). */
  public static final String MAX_PENDING_PODS_PER_PROFILE =
      "spark.kubernetes.allocation.maxPendingPodsPerRp";
  /** Spark 4.1's cap on the executor pods an application ever tries to create. */
  public static final String ALLOCATION_MAXIMUM = "spark.kubernetes.allocation.maximum";

  private SparkAllocationSettings() {}

  /**
   * The settings of an application whose executor container (in the template the plugin
   * built) is named {@code executorContainerName}.
   *
   * @throws IllegalArgumentException naming the Spark key whose value is invalid
   */
  public static AllocationSettings fromConf(SparkConf conf, String executorContainerName) {
    AllocationSettings.Builder settings = AllocationSettings.newBuilder();
    settings.setBatchSize(intValue(conf, K8S.KUBERNETES_ALLOCATION_BATCH_SIZE()));
    long batchDelay = longValue(conf, K8S.KUBERNETES_ALLOCATION_BATCH_DELAY());
    settings.setBatchDelayMs(batchDelay);
    // Spark waits max(5 x batch delay, executor.timeout) for a created pod to appear.
    long executorTimeout = longValue(conf, K8S.KUBERNETES_ALLOCATION_EXECUTOR_TIMEOUT());
    settings.setExecutorTimeoutMs(Math.max(executorTimeout, 5 * batchDelay));
    // Seconds in Spark's entry.
    settings.setExecutorIdleTimeoutMs(
        longValue(conf, CORE.DYN_ALLOCATION_EXECUTOR_IDLE_TIMEOUT()) * 1000);
    int maxPendingPods = intValue(conf, K8S.KUBERNETES_MAX_PENDING_PODS());
    if (conf.contains(K8S.KUBERNETES_MAX_PENDING_PODS().key())) {
      settings.setMaxPendingPods(maxPendingPods);
    }
    OptionalInt perProfile = spark41PositiveInt(conf, MAX_PENDING_PODS_PER_PROFILE);
    if (perProfile.isPresent()) {
      // Spark's start-up check, which it skips for its "no limit" default.
      if (perProfile.getAsInt() != Integer.MAX_VALUE && perProfile.getAsInt() > maxPendingPods) {
        throw new IllegalArgumentException(MAX_PENDING_PODS_PER_PROFILE + " ("
            + perProfile.getAsInt() + ") must be less than or equal to "
            + K8S.KUBERNETES_MAX_PENDING_PODS().key() + " (" + maxPendingPods + ")");
      }
      settings.setMaxPendingPodsPerProfile(perProfile.getAsInt());
    }
    maxExecutors(conf).ifPresent(settings::setMaxExecutors);
    // spark.dynamicAllocation.maxExecutors is not sent: Spark bounds the executors it asks for
    // at once itself, while the service's max_executors caps the ids an application may ever
    // use, which would starve a long dynamic-allocation application after its first bursts.
    settings.setDeleteOnTermination(boolValue(conf, K8S.KUBERNETES_DELETE_EXECUTORS()));
    settings.setCheckAllContainers(
        boolValue(conf, K8S.KUBERNETES_EXECUTOR_CHECK_ALL_CONTAINERS()));
    settings.setExecutorContainerName(executorContainerName);
    policy(conf).ifPresent(settings::setPolicy);
    gangSize(conf, settings).ifPresent(settings::setMinExecutorsAtOnce);
    claims(conf, settings);
    return settings.build();
  }

  /**
   * Per-executor claims as Spark's allocator handles them: owned by the driver
   * ({@code spark.kubernetes.driver.ownPersistentVolumeClaim}), reused
   * ({@code reusePersistentVolumeClaim}), and creation held at Spark's maximum while none is
   * free ({@code waitToReusePersistentVolumeClaim}): {@code spark.dynamicAllocation.maxExecutors}
   * with dynamic allocation, else {@code spark.executor.instances}, as Spark counts it.
   */
  private static void claims(SparkConf conf, AllocationSettings.Builder settings) {
    settings.setDriverOwnsClaims(boolValue(conf, K8S.KUBERNETES_DRIVER_OWN_PVC()));
    settings.setReuseClaims(boolValue(conf, K8S.KUBERNETES_DRIVER_REUSE_PVC()));
    boolean wait = boolValue(conf, K8S.KUBERNETES_DRIVER_WAIT_TO_REUSE_PVC());
    settings.setWaitToReuseClaims(wait);
    if (wait) {
      int max = boolValue(conf, CORE.DYN_ALLOCATION_ENABLED())
          ? intValue(conf, CORE.DYN_ALLOCATION_MAX_EXECUTORS())
          : intOrDefault(conf, "spark.executor.instances", 2);
      if (max > 0) {
        settings.setMaxClaims(max);
      }
    }
  }

  /**
   * {@link #ALLOCATION_MAXIMUM} as the service's lifetime cap on executor ids: Spark takes the
   * next id for every pod it tries to create and refuses (logs and creates nothing more) once
   * that id reaches the maximum, so executor ids 1 to maximum - 1 are the ones it ever uses.
   * A maximum of 1 lets Spark create no executor at all, which the service cannot express (and
   * no job completes with): refused. Above the service's own cap
   * ({@code limits.max_executors_per_application}) Start refuses it.
   */
  private static OptionalLong maxExecutors(SparkConf conf) {
    OptionalInt maximum = spark41PositiveInt(conf, ALLOCATION_MAXIMUM);
    if (maximum.isEmpty() || maximum.getAsInt() == Integer.MAX_VALUE) {
      // Unset, or Spark's default given explicitly: no limit, so the service's own.
      return OptionalLong.empty();
    }
    if (maximum.getAsInt() == 1) {
      throw new IllegalArgumentException(ALLOCATION_MAXIMUM + "=1 lets Spark create no executor"
          + " (it uses the executor ids below the maximum); set it to at least 2");
    }
    return OptionalLong.of(maximum.getAsInt() - 1L);
  }

  /**
   * A Spark 4.1 integer key when the user set it: through Spark's own entry (its check) when
   * the running Spark has one, else by name with the same rule (a positive integer).
   */
  @SuppressWarnings("unchecked")
  private static OptionalInt spark41PositiveInt(SparkConf conf, String key) {
    if (!conf.contains(key)) {
      return OptionalInt.empty();
    }
    // Spark's entries register themselves when their Config object initializes (K8S has).
    ConfigEntry<Object> entry = (ConfigEntry<Object>) ConfigEntry.findEntry(key);
    if (entry != null) {
      return OptionalInt.of(intValue(conf, entry));
    }
    String value = conf.get(key).trim();
    int parsed;
    try {
      parsed = Integer.parseInt(value);
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(key + ": expected a positive integer, got \"" + value
          + "\"", e);
    }
    if (parsed <= 0) {
      throw new IllegalArgumentException(key + ": expected a positive integer, got " + parsed);
    }
    return OptionalInt.of(parsed);
  }

  /** The plugin's own key choosing the service's allocation policy (not one of Spark's). */
  public static final String POLICY = ServiceSettings.PREFIX + "policy";

  /**
   * {@link #POLICY}: {@code spark} (Spark's allocator exactly) or {@code adaptive}; unset leaves
   * the service's default.
   */
  private static java.util.Optional<AllocationPolicy> policy(SparkConf conf) {
    if (!conf.contains(POLICY)) {
      return java.util.Optional.empty();
    }
    String value = conf.get(POLICY).trim().toLowerCase(java.util.Locale.ROOT);
    switch (value) {
      case "spark":
        return java.util.Optional.of(AllocationPolicy.ALLOCATION_POLICY_SPARK);
      case "adaptive":
        return java.util.Optional.of(AllocationPolicy.ALLOCATION_POLICY_ADAPTIVE);
      default:
        throw new IllegalArgumentException(
            POLICY + ": expected spark or adaptive, got \"" + conf.get(POLICY) + "\"");
    }
  }

  /** Schedulers that place executors in gangs (Spark's {@code spark.kubernetes.scheduler.name}). */
  private static final java.util.Set<String> GANG_SCHEDULERS =
      java.util.Set.of("volcano", "yunikorn");

  /** YuniKorn's task groups, on the driver pod (the application's originator). */
  static final String TASK_GROUPS =
      "spark.kubernetes.driver.annotation.yunikorn.apache.org/task-groups";

  /** The YuniKorn task group of the executor pods. */
  static final String EXECUTOR_TASK_GROUP =
      "spark.kubernetes.executor.annotation.yunikorn.apache.org/task-group-name";

  /**
   * The executors' gang, asked for at once whatever the batch size: the {@code minMember} of
   * the YuniKorn task group the executors belong to (its placeholders time out unless that many
   * executors are asked for promptly); else, under a gang scheduler, the executors Spark keeps at
   * least ({@code spark.dynamicAllocation.minExecutors} with dynamic allocation, else {@code
   * spark.executor.instances}); else none. Bounded by the pending caps already set, which the
   * service requires (Spark's own allocator would create such a gang over several batches).
   */
  private static java.util.OptionalInt gangSize(
      SparkConf conf, AllocationSettings.Builder settings) {
    int gang = taskGroupMinMember(conf).orElseGet(() -> gangSchedulerMinimum(conf));
    if (settings.hasMaxPendingPods()) {
      gang = Math.min(gang, settings.getMaxPendingPods());
    }
    if (settings.hasMaxPendingPodsPerProfile()) {
      gang = Math.min(gang, settings.getMaxPendingPodsPerProfile());
    }
    return gang > 0 ? java.util.OptionalInt.of(gang) : java.util.OptionalInt.empty();
  }

  /** {@code minMember} of the task group {@link #EXECUTOR_TASK_GROUP} names in {@link #TASK_GROUPS}. */
  private static java.util.OptionalInt taskGroupMinMember(SparkConf conf) {
    if (!conf.contains(TASK_GROUPS) || !conf.contains(EXECUTOR_TASK_GROUP)) {
      return java.util.OptionalInt.empty();
    }
    String group = conf.get(EXECUTOR_TASK_GROUP).trim();
    com.fasterxml.jackson.databind.JsonNode groups;
    try {
      groups = new com.fasterxml.jackson.databind.ObjectMapper().readTree(conf.get(TASK_GROUPS));
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException(TASK_GROUPS + ": not JSON: " + e.getMessage(), e);
    }
    if (groups == null || !groups.isArray()) {
      throw new IllegalArgumentException(TASK_GROUPS + ": expected a JSON array of task groups");
    }
    for (com.fasterxml.jackson.databind.JsonNode g : groups) {
      if (group.equals(g.path("name").asText())) {
        com.fasterxml.jackson.databind.JsonNode min = g.path("minMember");
        if (!min.canConvertToInt() || min.asInt() < 0) {
          throw new IllegalArgumentException(
              TASK_GROUPS + ": task group \"" + group + "\" has no valid minMember");
        }
        return java.util.OptionalInt.of(min.asInt());
      }
    }
    return java.util.OptionalInt.empty();
  }

  /** Under a gang scheduler, the executors Spark keeps at least; else 0. */
  private static int gangSchedulerMinimum(SparkConf conf) {
    String scheduler = conf.get("spark.kubernetes.executor.scheduler.name",
        conf.get("spark.kubernetes.scheduler.name", ""));
    if (!GANG_SCHEDULERS.contains(scheduler.trim().toLowerCase(java.util.Locale.ROOT))) {
      return 0;
    }
    return boolValue(conf, CORE.DYN_ALLOCATION_ENABLED())
        ? intValue(conf, CORE.DYN_ALLOCATION_MIN_EXECUTORS())
        : intOrDefault(conf, "spark.executor.instances", 2);
  }

  /** The integer at {@code key}, or {@code fallback} (Spark's default) when unset. */
  private static int intOrDefault(SparkConf conf, String key, int fallback) {
    if (!conf.contains(key)) {
      return fallback;
    }
    try {
      return Integer.parseInt(conf.get(key).trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(key + ": not an integer: " + conf.get(key), e);
    }
  }

  /** Spark's allocation batch delay in milliseconds (the period of Spark's own allocator). */
  public static long batchDelayMs(SparkConf conf) {
    return longValue(conf, K8S.KUBERNETES_ALLOCATION_BATCH_DELAY());
  }

  /**
   * How long Spark's allocator waits for the driver pod to be Ready before its first executor,
   * in seconds (the unit of Spark's entry).
   */
  public static long driverReadinessTimeoutSeconds(SparkConf conf) {
    return longValue(conf, K8S.KUBERNETES_ALLOCATION_DRIVER_READINESS_TIMEOUT());
  }

  /** The entry's value as Spark reads it (the user's, else Spark's default), checked by Spark. */
  private static Object value(SparkConf conf, ConfigEntry<Object> entry) {
    try {
      return conf.get(entry);
    } catch (RuntimeException e) {
      String message = e.getMessage() == null ? e.toString() : e.getMessage();
      throw new IllegalArgumentException(message.contains(entry.key())
          ? message : entry.key() + ": " + message, e);
    }
  }

  private static int intValue(SparkConf conf, ConfigEntry<Object> entry) {
    return (Integer) value(conf, entry);
  }

  private static long longValue(SparkConf conf, ConfigEntry<Object> entry) {
    return (Long) value(conf, entry);
  }

  private static boolean boolValue(SparkConf conf, ConfigEntry<Object> entry) {
    return (Boolean) value(conf, entry);
  }
}
