package io.github.sparkpodallocator.spark;

import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;
import java.util.stream.LongStream;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.SparkListenerStageSubmitted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.SparkListenerTaskStart;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

/**
 * The borrower's side of a budget's reclaim (issue 41's proof): a shuffle-heavy Spark job with
 * a cached stage, what Spark's listener bus says of it (tasks failed, stage attempts run
 * again, executors decommissioned), and the known answer it must give.
 *
 * <p>The job: {@value #NUMBERS} numbers summed by key ({@value #KEYS} keys) through a shuffle
 * and cached (job A: 2 stages); then, from the cache, the keys summed again by their last two
 * digits through a second shuffle whose map tasks take {@value #MAP_TASK_MS} ms each (job B:
 * the one the reclaim meets, 2 stages); then the cached sums added up (job C). A lost
 * executor loses its cached blocks and shuffle files: Spark computes them again (a stage
 * attempt beyond the first) unless they migrated.
 */
final class ReclaimScenario {
  static final long NUMBERS = 2_000_000;
  static final int KEYS = 100_000;
  static final int PARTITIONS = 8;
  static final long MAP_TASK_MS = 4_000;
  /** The graceful queue's {@code reclaim_deadline_ms}. */
  static final long GRACEFUL_DEADLINE_MS = 60_000;

  private ReclaimScenario() {}

  /** The confs Spark needs to give executors back gracefully (clients/spark/README.md). */
  static final Map<String, String> GRACEFUL_CONFS = Map.of(
      "spark.decommission.enabled", "true",
      "spark.storage.decommission.enabled", "true",
      "spark.storage.decommission.shuffleBlocks.enabled", "true",
      "spark.storage.decommission.rddBlocks.enabled", "true",
      // How often a decommissioning executor looks again for blocks to move (30 s by
      // default): a task that ends after the first pass waits for the next one to exit.
      "spark.storage.decommission.replicationReattemptInterval", "1s");

  /** What the borrower's listener bus saw. */
  static final class Observed extends SparkListener {
    final AtomicInteger tasksFailed = new AtomicInteger();
    final AtomicInteger stageAttemptsRerun = new AtomicInteger();
    final Map<String, String> executorsRemoved = new ConcurrentHashMap<>();
    final Set<String> failures = ConcurrentHashMap.newKeySet();
    /** Counted down by the first task to start once armed (job B's, launched just after). */
    final CountDownLatch jobBRunning = new CountDownLatch(1);
    volatile boolean armed;

    @Override
    public void onTaskStart(SparkListenerTaskStart start) {
      if (armed) {
        jobBRunning.countDown();
      }
    }

    @Override
    public void onTaskEnd(SparkListenerTaskEnd end) {
      if (!"Success".equals(end.reason().toString())) {
        tasksFailed.incrementAndGet();
        failures.add(end.reason().getClass().getSimpleName());
      }
    }

    @Override
    public void onStageSubmitted(SparkListenerStageSubmitted submitted) {
      if (submitted.stageInfo().attemptNumber() > 0) {
        stageAttemptsRerun.incrementAndGet();
      }
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved removed) {
      executorsRemoved.put(removed.executorId(), removed.reason());
    }

    /**
     * Executors that exited on their own (their decommission finished: the executor's own
     * message, or its pod's exit code 0 as Spark's lifecycle manager saw it, whichever Spark
     * took first), not deleted under them.
     */
    Set<String> exitedOnTheirOwn() {
      return executorsRemoved.entrySet().stream()
          .filter(e -> e.getValue().contains("decommission")
              || e.getValue().contains("exited with exit code 0"))
          .map(Map.Entry::getKey)
          .collect(Collectors.toCollection(java.util.TreeSet::new));
    }
  }

  /** Job A: the sums by key, cached (its shuffle files and cached blocks on every executor). */
  static JavaPairRDD<Long, Long> sumsByKey(JavaSparkContext sc) {
    JavaPairRDD<Long, Long> sums = sc.parallelize(List.of(0, 1, 2, 3, 4, 5, 6, 7), PARTITIONS)
        .flatMapToPair(part -> LongStream.range(part * (NUMBERS / PARTITIONS),
                (part + 1) * (NUMBERS / PARTITIONS))
            .mapToObj(i -> new Tuple2<>(i % KEYS, i)).iterator())
        .reduceByKey(Long::sum, PARTITIONS)
        .persist(StorageLevel.MEMORY_AND_DISK());
    long keys = sums.count();
    if (keys != KEYS) {
      throw new AssertionError("job A: " + keys + " keys, expected " + KEYS);
    }
    return sums;
  }

  /** Job B: the cached sums by their key's last two digits, with slow map tasks. */
  static Map<Long, Long> sumsByLastDigits(JavaPairRDD<Long, Long> sums) {
    return sums.mapToPair(kv -> new Tuple2<>(kv._1() % 100, kv._2()))
        .mapPartitionsToPair(rows -> {
          Thread.sleep(MAP_TASK_MS);
          return rows;
        })
        .reduceByKey(Long::sum, PARTITIONS)
        .collectAsMap();
  }

  /** Job B's right answer, computed without Spark. */
  static Map<Long, Long> expectedByLastDigits() {
    Map<Long, Long> expected = new java.util.TreeMap<>();
    for (long i = 0; i < NUMBERS; i++) {
      expected.merge((i % KEYS) % 100, i, Long::sum);
    }
    return expected;
  }

  /** Job C: the cached sums added up; the right answer is 0 + 1 + … + (NUMBERS − 1). */
  static long total(JavaPairRDD<Long, Long> sums) {
    return sums.values().reduce(Long::sum);
  }

  static final long EXPECTED_TOTAL = NUMBERS * (NUMBERS - 1) / 2;

  /** One run's figures, as printed and recorded in docs/benchmarks.md. */
  record Figures(String mode, long deadlineMs, long ownerRunningMs, int tasksFailed,
      int stageAttemptsRerun, Set<String> exitedOnTheirOwn, Set<String> failures,
      boolean resultRight, long jobsMs, long reclaimsGraceful, long reclaimsForced) {
    String line() {
      return String.format("reclaim %-8s (reclaim_deadline_ms %5d): owner's 2 executors Running"
          + " %6.1f s after its Start; borrower: %d tasks failed %s, %d stage attempts re-run,"
          + " executors exited on their own %s, result %s, jobs B+C %.1f s; service:"
          + " reclaims_completed graceful %d, forced %d", mode, deadlineMs,
          ownerRunningMs / 1000.0, tasksFailed, failures, stageAttemptsRerun, exitedOnTheirOwn,
          resultRight ? "right" : "WRONG", jobsMs / 1000.0, reclaimsGraceful, reclaimsForced);
    }
  }
}
