package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import java.time.Instant;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodState;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshot$;
import org.apache.spark.scheduler.cluster.k8s.PodDeleted;
import org.apache.spark.scheduler.cluster.k8s.PodRunning;
import org.junit.jupiter.api.Test;

/** How Spark's own snapshot (of the version under test) reads the pods the feed gives it. */
class ExecutorEventsFeedTest {
  private static final Instant NOW = Instant.parse("2026-01-02T03:04:05Z");

  private static Pod executorPod(String phase, String deletionTimestamp) {
    return new PodBuilder()
        .withNewMetadata().withName("app-exec-1").withDeletionTimestamp(deletionTimestamp)
        .addToLabels("spark-role", "executor").addToLabels("spark-exec-id", "1")
        .endMetadata()
        .withNewStatus().withPhase(phase).endStatus()
        .build();
  }

  private static ExecutorPodState sparksState(Pod pod) {
    return ExecutorPodsSnapshot$.MODULE$.apply().withUpdate(pod).executorPods()
        .apply((Object) 1L);
  }

  @Test
  void aPodGoneWhileRunningIsDeletedForSpark() {
    // The last state of a pod removed at once (grace period 0): Spark takes it as running.
    Pod last = executorPod("Running", "2026-01-02T03:04:00Z");
    assertInstanceOf(PodRunning.class, sparksState(last));

    Pod deleted = ExecutorEventsFeed.asDeleted(last, NOW);
    assertInstanceOf(PodDeleted.class, sparksState(deleted));
    assertEquals("2026-01-02T03:04:00Z", deleted.getMetadata().getDeletionTimestamp());
  }

  @Test
  void aPodGoneWithoutADeletionTimestampIsDeletedForSpark() {
    // Missing from the service's resync: its last phase, no deletion seen.
    for (String phase : new String[] {"Pending", "Running", "Succeeded", "Failed", null}) {
      Pod deleted = ExecutorEventsFeed.asDeleted(executorPod(phase, null), NOW);
      assertInstanceOf(PodDeleted.class, sparksState(deleted), String.valueOf(phase));
      assertEquals(NOW.toString(), deleted.getMetadata().getDeletionTimestamp());
    }
    // A finished pod keeps its phase.
    assertEquals("Succeeded", ExecutorEventsFeed.asDeleted(executorPod("Succeeded", null), NOW)
        .getStatus().getPhase());
  }
}
