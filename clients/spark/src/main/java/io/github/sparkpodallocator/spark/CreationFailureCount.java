package io.github.sparkpodallocator.spark;

import java.lang.reflect.Method;
import java.util.HashMap;
import java.util.Map;
import org.apache.spark.scheduler.cluster.k8s.AbstractPodsAllocator;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsLifecycleManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import spark.allocator.v1.Allocator.ApplicationStatus;
import spark.allocator.v1.Allocator.ProfileStatus;

/**
 * Failed executor pod creates, added to Spark's executor-failure count
 * ({@code spark.executor.maxNumFailures}) as Spark 4.2's own allocator adds them (SPARK-55075):
 * Spark hands every allocator the driver's {@link ExecutorPodsLifecycleManager}
 * ({@code AbstractPodsAllocator.executorPodsLifecycleManager}), whose
 * {@code registerExecutorFailure} counts one failure; past the maximum the lifecycle manager
 * stops the application. Spark 4.0 has neither method and does not count creation failures, so
 * nothing is counted there. Both are looked up by name because one jar serves both versions.
 *
 * <p>The service creates the pods, so the plugin learns of failed creates from GetStatus: per
 * resource profile, how many creates failed since the service took the application in
 * ({@code CreateFailure.total_failures}); each increase is counted once. A lower total than
 * the last one seen is a restarted service counting again from 0.
 */
final class CreationFailureCount {
  private static final Logger LOG = LoggerFactory.getLogger(CreationFailureCount.class);
  private static final Method LIFECYCLE_MANAGER =
      method(AbstractPodsAllocator.class, "executorPodsLifecycleManager");
  private static final Method REGISTER_FAILURE =
      method(ExecutorPodsLifecycleManager.class, "registerExecutorFailure");

  // Guarded by `this`: the last total seen, by resource profile id.
  private final Map<Integer, Long> seen = new HashMap<>();

  /** Whether the running Spark counts pod-creation failures (4.2 and later). */
  static boolean sparkCountsThem() {
    return LIFECYCLE_MANAGER != null && REGISTER_FAILURE != null;
  }

  /**
   * Counts with Spark the creates that failed since the last status taken in, through the
   * lifecycle manager Spark gave {@code allocator}.
   *
   * @return how many failures Spark was given (0 without Spark's hook or its lifecycle
   *     manager)
   */
  synchronized int takeIn(ApplicationStatus status, AbstractPodsAllocator allocator) {
    long fresh = 0;
    for (ProfileStatus profile : status.getProfilesList()) {
      long total = profile.getLastCreateFailure().getTotalFailures();
      Long before = seen.put(profile.getResourceProfileId(), total);
      long last = before == null ? 0 : before;
      fresh += total >= last ? total - last : total;
    }
    if (fresh == 0 || !sparkCountsThem()) {
      return 0;
    }
    Object manager;
    try {
      Option<?> option = (Option<?>) LIFECYCLE_MANAGER.invoke(allocator);
      if (option.isEmpty()) {
        return 0;
      }
      manager = option.get();
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.warn("Cannot reach Spark's executor lifecycle manager: {} failed executor pod creates"
          + " are not counted towards spark.executor.maxNumFailures", fresh, e);
      return 0;
    }
    int counted = 0;
    for (long i = 0; i < fresh; i++) {
      try {
        REGISTER_FAILURE.invoke(manager);
        counted++;
      } catch (ReflectiveOperationException | RuntimeException e) {
        LOG.warn("Cannot count a failed executor pod create towards"
            + " spark.executor.maxNumFailures", e);
        break;
      }
    }
    LOG.info("{} executor pod creates failed in the spark-pod-allocator service: counted"
        + " towards spark.executor.maxNumFailures", counted);
    return counted;
  }

  private static Method method(Class<?> owner, String name) {
    try {
      return owner.getMethod(name);
    } catch (NoSuchMethodException e) {
      return null;
    }
  }
}
