package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import io.fabric8.kubernetes.api.model.Pod;
import org.apache.spark.SparkConf;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.scheduler.cluster.k8s.AbstractPodsAllocator;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsLifecycleManager;
import org.apache.spark.scheduler.cluster.k8s.KubernetesClusterSchedulerBackend;
import org.apache.spark.util.ManualClock;
import org.junit.jupiter.api.Test;
import scala.Option;
import spark.allocator.v1.Allocator.ApplicationStatus;
import spark.allocator.v1.Allocator.CreateFailure;
import spark.allocator.v1.Allocator.ProfileStatus;

class CreationFailureCountTest {
  /** An allocator that does nothing but hold what Spark hands every allocator. */
  private static final class Allocator extends AbstractPodsAllocator {
    @Override
    public void setTotalExpectedExecutors(
        scala.collection.immutable.Map<ResourceProfile, Object> resourceProfileToTotalExecs) {}

    @Override
    public Option<Pod> driverPod() {
      return Option.empty();
    }

    @Override
    public boolean isDeleted(String executorId) {
      return false;
    }

    @Override
    public void start(String applicationId, KubernetesClusterSchedulerBackend backend) {}

    @Override
    public void stop(String applicationId) {}
  }

  private static ApplicationStatus failedCreates(long profile0, long profile1) {
    return ApplicationStatus.newBuilder()
        .addProfiles(ProfileStatus.newBuilder().setResourceProfileId(0)
            .setLastCreateFailure(CreateFailure.newBuilder().setTotalFailures(profile0)))
        .addProfiles(ProfileStatus.newBuilder().setResourceProfileId(1)
            .setLastCreateFailure(CreateFailure.newBuilder().setTotalFailures(profile1)))
        .build();
  }

  @Test
  void sparkCountsCreationFailuresFrom42() {
    String version = org.apache.spark.package$.MODULE$.SPARK_VERSION();
    assertEquals(version.compareTo("4.2") >= 0, CreationFailureCount.sparkCountsThem(), version);
  }

  @Test
  void eachFailedCreateIsCountedOnceWhereSparkCountsThem() throws Exception {
    ExecutorPodsLifecycleManager manager =
        new ExecutorPodsLifecycleManager(new SparkConf(false), null, null, new ManualClock());
    Allocator allocator = new Allocator();
    CreationFailureCount count = new CreationFailureCount();
    if (!CreationFailureCount.sparkCountsThem()) {
      // Spark 4.0: no hook, and Spark's own allocator does not count them either.
      assertEquals(0, count.takeIn(failedCreates(2, 1), allocator));
      assertEquals(0, manager.getNumExecutorsFailed());
      return;
    }
    // Before Spark hands over its lifecycle manager nothing can be counted, yet the totals
    // seen are remembered.
    assertEquals(0, count.takeIn(failedCreates(1, 0), allocator));
    // What KubernetesClusterManager does on Spark 4.2 (absent from the 4.0 API compiled against).
    java.lang.reflect.Method set = AbstractPodsAllocator.class
        .getMethod("setExecutorPodsLifecycleManager", ExecutorPodsLifecycleManager.class);
    assertNotNull(set);
    set.invoke(allocator, manager);

    assertEquals(3, count.takeIn(failedCreates(2, 2), allocator));
    assertEquals(3, manager.getNumExecutorsFailed());
    assertEquals(0, count.takeIn(failedCreates(2, 2), allocator));
    assertEquals(1, count.takeIn(failedCreates(3, 2), allocator));
    // A restarted service counts from 0 again: its totals are all new.
    assertEquals(1, count.takeIn(failedCreates(1, 0), allocator));
    assertEquals(5, manager.getNumExecutorsFailed());
  }
}
