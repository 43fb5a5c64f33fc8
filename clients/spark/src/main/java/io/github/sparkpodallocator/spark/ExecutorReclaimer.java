package io.github.sparkpodallocator.spark;

import java.time.Instant;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Consumer;
import org.apache.spark.SparkConf;
import org.apache.spark.scheduler.ExecutorDecommissionInfo;
import org.apache.spark.scheduler.cluster.CoarseGrainedSchedulerBackend;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;
import spark.allocator.v1.Allocator.ExecutorReclaim;

/**
 * Gives an executor back when the service asks for it (a RECLAIM event: a budget's owner wants
 * its guaranteed part, which this application borrowed): Spark decommissions it, so its running
 * tasks finish, no new task goes to it, and with {@code spark.storage.decommission.*} its
 * shuffle files and cached blocks migrate to the executors that stay; then it exits and the
 * service deletes its pod. The service deletes the pod at the deadline anyway, so anything
 * this class cannot do (decommission turned off, an executor not registered yet) is left to
 * that deadline, never an error for the driver.
 *
 * <p>The driver's target is left as it is ({@code adjustTargetNumExecutors=false}): the
 * application still wants the executor, and the service's budget, not the target, keeps it
 * from being replaced while the owner holds its part. A lower target would be a lasting
 * change for an application with a fixed number of executors, which would never ask for them
 * again once the owner is done; under dynamic allocation Spark sets its targets from its load
 * anyway.
 */
final class ExecutorReclaimer {
  private static final Logger LOG = LoggerFactory.getLogger(ExecutorReclaimer.class);
  static final String DECOMMISSION_ENABLED = "spark.decommission.enabled";
  static final String STORAGE_DECOMMISSION_ENABLED = "spark.storage.decommission.enabled";
  static final String SHUFFLE_BLOCKS = "spark.storage.decommission.shuffleBlocks.enabled";
  static final String RDD_BLOCKS = "spark.storage.decommission.rddBlocks.enabled";

  /** What of the driver's scheduler backend a reclaim uses (a fake in the unit tests). */
  interface Driver {
    /** Whether this executor is registered with the driver. */
    boolean isRegistered(String executorId);

    /**
     * Decommissions the executor, leaving the target alone; the executors Spark took for
     * decommissioning (none for one already being removed or decommissioned).
     */
    List<String> decommission(String executorId, ExecutorDecommissionInfo info);
  }

  /** The driver behind Spark's own scheduler backend. */
  static Driver of(CoarseGrainedSchedulerBackend backend) {
    return new Driver() {
      @Override
      public boolean isRegistered(String executorId) {
        return CollectionConverters.asJava(backend.getExecutorIds()).contains(executorId);
      }

      @Override
      public List<String> decommission(String executorId, ExecutorDecommissionInfo info) {
        @SuppressWarnings("unchecked")
        Tuple2<String, ExecutorDecommissionInfo>[] executors =
            (Tuple2<String, ExecutorDecommissionInfo>[]) new Tuple2<?, ?>[] {
              new Tuple2<>(executorId, info)};
        // Not triggered by the executor: Spark sends it DecommissionExecutor itself.
        return CollectionConverters.asJava(
            backend.decommissionExecutors(executors, false, false));
      }
    };
  }

  private final Driver driver;
  private final Consumer<String> warn;
  private final boolean decommissionEnabled;
  private final boolean migrationEnabled;

  // Guarded by `this`.
  /** Executors already given to Spark's decommission (a repeated RECLAIM is not sent twice). */
  private final Set<String> handled = new HashSet<>();
  private boolean warnedDisabled;
  private boolean warnedNoMigration;

  ExecutorReclaimer(SparkConf conf, Driver driver) {
    this(conf, driver, LOG::warn);
  }

  /** {@code warn} takes the warnings (the log's WARN outside tests). */
  ExecutorReclaimer(SparkConf conf, Driver driver, Consumer<String> warn) {
    this.driver = driver;
    this.warn = warn;
    this.decommissionEnabled = conf.getBoolean(DECOMMISSION_ENABLED, false);
    this.migrationEnabled = conf.getBoolean(STORAGE_DECOMMISSION_ENABLED, false)
        && (conf.getBoolean(SHUFFLE_BLOCKS, true) || conf.getBoolean(RDD_BLOCKS, true));
  }

  /**
   * Acts on one RECLAIM event: at most one decommission per executor, whatever the events
   * repeated (a stream's full state repeats the reclaims under way). Never throws: a failure
   * is logged, and the deadline takes the executor.
   */
  void reclaim(long executorId, ExecutorReclaim reclaim) {
    String id = Long.toString(executorId);
    String by = Instant.ofEpochMilli(reclaim.getDeadlineMs()).toString();
    synchronized (this) {
      if (handled.contains(id)) {
        LOG.debug("Executor {} is already given back to budget {}", id, reclaim.getBudget());
        return;
      }
      if (!decommissionEnabled) {
        if (!warnedDisabled) {
          warnedDisabled = true;
          warn.accept(String.format("The spark-pod-allocator service asks executor %s back by"
              + " %s (budget %s: its owner wants its guaranteed part), but %s is false: the"
              + " executor is not decommissioned, and its pod is deleted at the deadline,"
              + " failing its running tasks and losing its shuffle files and cached blocks. To"
              + " give executors back gracefully set %s=true and %s=true (%s and %s are true"
              + " unless set; logged once)", id, by, reclaim.getBudget(), DECOMMISSION_ENABLED,
              DECOMMISSION_ENABLED, STORAGE_DECOMMISSION_ENABLED, SHUFFLE_BLOCKS, RDD_BLOCKS));
        } else {
          LOG.info("The spark-pod-allocator service asks executor {} back by {} (budget {});"
              + " {} is false: left to the deadline", id, by, reclaim.getBudget(),
              DECOMMISSION_ENABLED);
        }
        handled.add(id);
        return;
      }
    }
    try {
      if (!driver.isRegistered(id)) {
        // Not this driver's yet: nothing of the application's runs on it; the service
        // deletes its pod. A later full state repeats the reclaim should it register.
        LOG.info("The spark-pod-allocator service asks executor {} back (budget {}), which has"
            + " not registered: left to the service", id, reclaim.getBudget());
        return;
      }
      synchronized (this) {
        if (!handled.add(id)) {
          return;
        }
        if (!migrationEnabled && !warnedNoMigration) {
          warnedNoMigration = true;
          warn.accept(String.format("Decommissioning executors the spark-pod-allocator service"
              + " asks back without block migration: each exits once its tasks end and its"
              + " shuffle files and cached blocks are lost (their stages run again). Set"
              + " %s=true, and leave %s and %s true, to move them to the executors that stay"
              + " (logged once)", STORAGE_DECOMMISSION_ENABLED, SHUFFLE_BLOCKS, RDD_BLOCKS));
        }
      }
      String message = "spark-pod-allocator: budget " + reclaim.getBudget()
          + " asks the executor back by " + by;
      List<String> taken =
          driver.decommission(id, new ExecutorDecommissionInfo(message, Option.empty()));
      if (taken.contains(id)) {
        LOG.info("Decommissioning executor {}: the spark-pod-allocator service asks it back"
            + " by {} (budget {})", id, by, reclaim.getBudget());
      } else {
        LOG.info("Executor {}, asked back by the spark-pod-allocator service (budget {}), is"
            + " already being removed", id, reclaim.getBudget());
      }
    } catch (RuntimeException | LinkageError e) {
      LOG.warn("Could not decommission executor {}, which the spark-pod-allocator service asks"
          + " back by {}: its pod is deleted then", id, by, e);
    }
  }
}
