package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;
import spark.allocator.v1.Allocator.AllocationPolicy;
import spark.allocator.v1.Allocator.AllocationSettings;

class SparkAllocationSettingsTest {
  @Test
  void sparksDefaultsWhenNothingIsSet() {
    AllocationSettings s = SparkAllocationSettings.fromConf(new SparkConf(false), "exec");
    // The default of the Spark version under test: 10 up to 4.1, 20 from 4.2.
    String version = org.apache.spark.package$.MODULE$.SPARK_VERSION();
    assertEquals(version.compareTo("4.2") >= 0 ? 20 : 10, s.getBatchSize(), version);
    assertEquals(1000, s.getBatchDelayMs());
    assertEquals(600_000, s.getExecutorTimeoutMs());
    assertEquals(60_000, s.getExecutorIdleTimeoutMs());
    assertTrue(s.getDeleteOnTermination());
    assertTrue(s.getCheckAllContainers());
    assertEquals("exec", s.getExecutorContainerName());
    // Spark's "no limit" default leaves the service's own.
    assertFalse(s.hasMaxPendingPods());
    assertFalse(s.hasMaxExecutors());
    assertFalse(s.hasMaxPendingPodsPerProfile());
  }

  @Test
  void theUsersValues() {
    SparkConf conf = new SparkConf(false)
        .set("spark.kubernetes.allocation.batch.size", "3")
        .set("spark.kubernetes.allocation.batch.delay", "500ms")
        .set("spark.kubernetes.allocation.executor.timeout", "30s")
        .set("spark.kubernetes.allocation.maxPendingPods", "7")
        .set("spark.dynamicAllocation.executorIdleTimeout", "5") // seconds, as Spark reads it
        .set("spark.kubernetes.executor.deleteOnTermination", "false")
        .set("spark.kubernetes.executor.checkAllContainers", "false");
    AllocationSettings s = SparkAllocationSettings.fromConf(conf, "main");
    assertEquals(3, s.getBatchSize());
    assertEquals(500, s.getBatchDelayMs());
    assertEquals(30_000, s.getExecutorTimeoutMs());
    assertEquals(7, s.getMaxPendingPods());
    assertEquals(5_000, s.getExecutorIdleTimeoutMs());
    assertFalse(s.getDeleteOnTermination());
    assertFalse(s.getCheckAllContainers());
  }

  @Test
  void theDriverReadinessTimeoutIsInSecondsAsSparkReadsIt() {
    assertEquals(1, SparkAllocationSettings.driverReadinessTimeoutSeconds(new SparkConf(false)));
    assertEquals(120, SparkAllocationSettings.driverReadinessTimeoutSeconds(new SparkConf(false)
        .set("spark.kubernetes.allocation.driver.readinessTimeout", "2min")));
  }

  @Test
  void thePolicyIsThePluginsOwnKeyAndUnsetByDefault() {
    assertFalse(SparkAllocationSettings.fromConf(new SparkConf(false), "e").hasPolicy());
    SparkConf adaptive = new SparkConf(false)
        .set("spark.kubernetes.allocation.service.policy", "Adaptive");
    assertEquals(AllocationPolicy.ALLOCATION_POLICY_ADAPTIVE,
        SparkAllocationSettings.fromConf(adaptive, "e").getPolicy());
    SparkConf spark = new SparkConf(false)
        .set("spark.kubernetes.allocation.service.policy", "spark");
    assertEquals(AllocationPolicy.ALLOCATION_POLICY_SPARK,
        SparkAllocationSettings.fromConf(spark, "e").getPolicy());
    SparkConf bad = new SparkConf(false)
        .set("spark.kubernetes.allocation.service.policy", "fast");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SparkAllocationSettings.fromConf(bad, "e"));
    assertTrue(e.getMessage().contains("spark.kubernetes.allocation.service.policy"),
        e.getMessage());
  }

  @Test
  void theExecutorTimeoutIsAtLeastFiveBatchDelaysAsInSpark() {
    SparkConf conf = new SparkConf(false)
        .set("spark.kubernetes.allocation.batch.delay", "10s")
        .set("spark.kubernetes.allocation.executor.timeout", "20s");
    assertEquals(50_000, SparkAllocationSettings.fromConf(conf, "e").getExecutorTimeoutMs());
  }

  @Test
  void dynamicAllocationsMaxExecutorsIsNotALifetimeCap() {
    // Spark keeps at most maxExecutors at once through its targets; the service's
    // max_executors would cap the executor ids ever used.
    SparkConf conf = new SparkConf(false)
        .set("spark.dynamicAllocation.enabled", "true")
        .set("spark.dynamicAllocation.maxExecutors", "4");
    assertFalse(SparkAllocationSettings.fromConf(conf, "e").hasMaxExecutors());
  }

  private static boolean spark41OrLater() {
    return org.apache.spark.package$.MODULE$.SPARK_VERSION().compareTo("4.1") >= 0;
  }

  /** Whether the running Spark's Config has the entry (4.1's keys are absent from 4.0). */
  private static boolean sparkHasEntry(String key) {
    return org.apache.spark.internal.config.ConfigEntry.findEntry(key) != null;
  }

  @Test
  void spark41sKeysAreReadThroughSparksEntryWhereItHasOne() {
    // 4.0.1 has no entry for them: they are read by name there.
    assertEquals(spark41OrLater(), sparkHasEntry("spark.kubernetes.allocation.maxPendingPodsPerRp"));
    assertEquals(spark41OrLater(), sparkHasEntry("spark.kubernetes.allocation.maximum"));
  }

  @Test
  void thePerProfilePendingCapIsSentOnEveryVersion() {
    SparkConf conf = new SparkConf(false)
        .set("spark.kubernetes.allocation.maxPendingPods", "8")
        .set("spark.kubernetes.allocation.maxPendingPodsPerRp", "3");
    AllocationSettings s = SparkAllocationSettings.fromConf(conf, "e");
    assertEquals(3, s.getMaxPendingPodsPerProfile());
    assertEquals(8, s.getMaxPendingPods());
    // Without a global cap (Spark's "no limit" default) any per-profile cap passes.
    assertEquals(5, SparkAllocationSettings.fromConf(new SparkConf(false)
        .set("spark.kubernetes.allocation.maxPendingPodsPerRp", "5"), "e")
        .getMaxPendingPodsPerProfile());
    // Equal to the global cap passes Spark's check.
    assertEquals(8, SparkAllocationSettings.fromConf(conf.clone()
        .set("spark.kubernetes.allocation.maxPendingPodsPerRp", "8"), "e")
        .getMaxPendingPodsPerProfile());
  }

  @Test
  void aPerProfilePendingCapAboveTheGlobalOneIsRefusedNamingBoth() {
    SparkConf conf = new SparkConf(false)
        .set("spark.kubernetes.allocation.maxPendingPods", "4")
        .set("spark.kubernetes.allocation.maxPendingPodsPerRp", "5");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SparkAllocationSettings.fromConf(conf, "e"));
    assertTrue(e.getMessage().contains("spark.kubernetes.allocation.maxPendingPodsPerRp (5)")
        && e.getMessage().contains("spark.kubernetes.allocation.maxPendingPods (4)"),
        e.getMessage());
    // Spark skips its check for its own "no limit" value.
    assertEquals(Integer.MAX_VALUE, SparkAllocationSettings.fromConf(conf.clone()
        .set("spark.kubernetes.allocation.maxPendingPodsPerRp", "2147483647"), "e")
        .getMaxPendingPodsPerProfile());
  }

  @Test
  void theAllocationMaximumIsTheLifetimeCapOfExecutorIdsBelowIt() {
    // Spark creates executor ids 1 .. maximum - 1 and then no more.
    SparkConf conf = new SparkConf(false).set("spark.kubernetes.allocation.maximum", "5");
    assertEquals(4, SparkAllocationSettings.fromConf(conf, "e").getMaxExecutors());
    assertEquals(1, SparkAllocationSettings.fromConf(new SparkConf(false)
        .set("spark.kubernetes.allocation.maximum", "2"), "e").getMaxExecutors());
    // Spark's "no limit" default given explicitly leaves the service's own cap.
    assertFalse(SparkAllocationSettings.fromConf(new SparkConf(false)
        .set("spark.kubernetes.allocation.maximum", "2147483647"), "e").hasMaxExecutors());
    IllegalArgumentException none = assertThrows(IllegalArgumentException.class,
        () -> SparkAllocationSettings.fromConf(new SparkConf(false)
            .set("spark.kubernetes.allocation.maximum", "1"), "e"));
    assertTrue(none.getMessage().startsWith("spark.kubernetes.allocation.maximum=1"),
        none.getMessage());
  }

  @Test
  void spark41sKeysNameThemselvesWhenInvalidOnEveryVersion() {
    for (String key : new String[] {
        "spark.kubernetes.allocation.maxPendingPodsPerRp", "spark.kubernetes.allocation.maximum"}) {
      for (String bad : new String[] {"0", "-3", "many"}) {
        SparkConf conf = new SparkConf(false).set(key, bad);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> SparkAllocationSettings.fromConf(conf, "e"), key + "=" + bad);
        assertTrue(e.getMessage().contains(key), e.getMessage());
      }
    }
  }

  @Test
  void badValuesNameTheirKey() {
    for (String[] bad : new String[][] {
        {"spark.kubernetes.allocation.batch.size", "0"},
        {"spark.kubernetes.allocation.batch.size", "ten"},
        {"spark.kubernetes.allocation.batch.delay", "100ms"},
        {"spark.kubernetes.allocation.batch.delay", "later"},
        {"spark.kubernetes.allocation.maxPendingPods", "-1"},
        {"spark.kubernetes.executor.deleteOnTermination", "no"},
    }) {
      SparkConf conf = new SparkConf(false).set(bad[0], bad[1]);
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> SparkAllocationSettings.fromConf(conf, "e"), bad[0] + "=" + bad[1]);
      assertTrue(e.getMessage().contains(bad[0]), e.getMessage());
    }
  }

  @Test
  void yuniKornsExecutorTaskGroupIsTheGang() {
    SparkConf conf = new SparkConf(false)
        .set("spark.kubernetes.scheduler.name", "yunikorn")
        .set("spark.executor.instances", "9")
        .set(SparkAllocationSettings.TASK_GROUPS, "[{\"name\":\"spark-driver\",\"minMember\":1},"
            + "{\"name\":\"spark-executor\",\"minMember\":6,\"minResource\":{\"cpu\":\"1\"}}]")
        .set(SparkAllocationSettings.EXECUTOR_TASK_GROUP, "spark-executor");
    assertEquals(6, SparkAllocationSettings.fromConf(conf, "e").getMinExecutorsAtOnce());
    // Bounded by the pending cap, which the service requires of a gang.
    conf.set("spark.kubernetes.allocation.maxPendingPods", "4");
    assertEquals(4, SparkAllocationSettings.fromConf(conf, "e").getMinExecutorsAtOnce());
    SparkConf bad = new SparkConf(false)
        .set(SparkAllocationSettings.TASK_GROUPS, "[{\"name\":\"spark-executor\"")
        .set(SparkAllocationSettings.EXECUTOR_TASK_GROUP, "spark-executor");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> SparkAllocationSettings.fromConf(bad, "e"));
    assertTrue(e.getMessage().contains(SparkAllocationSettings.TASK_GROUPS), e.getMessage());
  }

  @Test
  void aGangSchedulersGangIsTheExecutorsSparkKeepsAtLeast() {
    assertFalse(SparkAllocationSettings.fromConf(new SparkConf(false), "e")
        .hasMinExecutorsAtOnce());
    SparkConf plain = new SparkConf(false).set("spark.executor.instances", "8");
    assertFalse(SparkAllocationSettings.fromConf(plain, "e").hasMinExecutorsAtOnce());
    SparkConf volcano = new SparkConf(false)
        .set("spark.kubernetes.scheduler.name", "volcano")
        .set("spark.executor.instances", "8");
    assertEquals(8, SparkAllocationSettings.fromConf(volcano, "e").getMinExecutorsAtOnce());
    // Spark's default of spark.executor.instances.
    SparkConf byDefault = new SparkConf(false).set("spark.kubernetes.scheduler.name", "volcano");
    assertEquals(2, SparkAllocationSettings.fromConf(byDefault, "e").getMinExecutorsAtOnce());
    SparkConf dynamic = new SparkConf(false)
        .set("spark.kubernetes.executor.scheduler.name", "yunikorn")
        .set("spark.dynamicAllocation.enabled", "true")
        .set("spark.dynamicAllocation.minExecutors", "3")
        .set("spark.executor.instances", "8");
    assertEquals(3, SparkAllocationSettings.fromConf(dynamic, "e").getMinExecutorsAtOnce());
    // Dynamic allocation from none: no gang.
    dynamic.set("spark.dynamicAllocation.minExecutors", "0");
    assertFalse(SparkAllocationSettings.fromConf(dynamic, "e").hasMinExecutorsAtOnce());
  }

  @Test
  void sparksClaimKeysMapWithSparksDefaults() {
    AllocationSettings byDefault = SparkAllocationSettings.fromConf(new SparkConf(false), "e");
    assertTrue(byDefault.getDriverOwnsClaims());
    assertTrue(byDefault.getReuseClaims());
    assertFalse(byDefault.getWaitToReuseClaims());
    assertFalse(byDefault.hasMaxClaims());
    SparkConf waiting = new SparkConf(false)
        .set("spark.kubernetes.driver.ownPersistentVolumeClaim", "true")
        .set("spark.kubernetes.driver.reusePersistentVolumeClaim", "true")
        .set("spark.kubernetes.driver.waitToReusePersistentVolumeClaim", "true")
        .set("spark.executor.instances", "5");
    AllocationSettings fixed = SparkAllocationSettings.fromConf(waiting, "e");
    assertTrue(fixed.getWaitToReuseClaims());
    assertEquals(5, fixed.getMaxClaims());
    waiting.set("spark.dynamicAllocation.enabled", "true")
        .set("spark.dynamicAllocation.maxExecutors", "12");
    assertEquals(12, SparkAllocationSettings.fromConf(waiting, "e").getMaxClaims());
    SparkConf notOwned = new SparkConf(false)
        .set("spark.kubernetes.driver.ownPersistentVolumeClaim", "false")
        .set("spark.kubernetes.driver.reusePersistentVolumeClaim", "false");
    AllocationSettings off = SparkAllocationSettings.fromConf(notOwned, "e");
    assertFalse(off.getDriverOwnsClaims());
    assertFalse(off.getReuseClaims());
  }
}
