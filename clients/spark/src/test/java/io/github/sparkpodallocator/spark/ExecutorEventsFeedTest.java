package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.utils.Serialization;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodState;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshot;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshot$;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshotsStore;
import org.apache.spark.scheduler.cluster.k8s.PodDeleted;
import org.apache.spark.scheduler.cluster.k8s.PodRunning;
import org.junit.jupiter.api.Test;
import scala.Function1;
import scala.collection.immutable.Seq;
import scala.runtime.BoxedUnit;
import spark.allocator.v1.Allocator.ExecutorEvent;
import spark.allocator.v1.Allocator.ExecutorEventKind;
import spark.allocator.v1.Allocator.ExecutorPod;

/** How Spark's own snapshot (of the version under test) reads the pods the feed gives it. */
class ExecutorEventsFeedTest {
  private static final Instant NOW = Instant.parse("2026-01-02T03:04:05Z");

  private static Pod executorPod(String phase, String deletionTimestamp) {
    return executorPod(1, phase, deletionTimestamp);
  }

  private static Pod executorPod(int id, String phase, String deletionTimestamp) {
    return new PodBuilder()
        .withNewMetadata().withName("app-exec-" + id).withDeletionTimestamp(deletionTimestamp)
        .addToLabels("spark-role", "executor").addToLabels("spark-exec-id", String.valueOf(id))
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

  /**
   * The snapshots Spark's own store would publish from the feed's calls: an update applied to
   * the current snapshot, a full snapshot replacing it.
   */
  private static final class RecordingStore implements ExecutorPodsSnapshotsStore {
    final List<ExecutorPodsSnapshot> snapshots = new ArrayList<>();
    private ExecutorPodsSnapshot current = ExecutorPodsSnapshot$.MODULE$.apply();

    @Override
    public void updatePod(Pod pod) {
      current = current.withUpdate(pod);
      snapshots.add(current);
    }

    @Override
    public void replaceSnapshot(Seq<Pod> pods) {
      current = ExecutorPodsSnapshot$.MODULE$.apply(pods, System.currentTimeMillis());
      snapshots.add(current);
    }

    /** Executor {@code id}'s state in each snapshot that has it, in order. */
    List<ExecutorPodState> states(long id) {
      List<ExecutorPodState> states = new ArrayList<>();
      for (ExecutorPodsSnapshot snapshot : snapshots) {
        scala.Option<ExecutorPodState> state = snapshot.executorPods().get((Object) id);
        if (state.isDefined()) {
          states.add(state.get());
        }
      }
      return states;
    }

    @Override
    public void addSubscriber(long interval, Function1<Seq<ExecutorPodsSnapshot>, BoxedUnit> f) {}

    @Override
    public void notifySubscribers() {}

    @Override
    public void stop() {}
  }

  private static ExecutorEvent event(ExecutorEventKind kind, long sequence, Pod pod) {
    ExecutorEvent.Builder event = ExecutorEvent.newBuilder().setKind(kind).setSequence(sequence);
    if (pod != null) {
      event.setExecutor(ExecutorPod.newBuilder()
          .setPodName(pod.getMetadata().getName())
          .setPodJson(Serialization.asJson(pod)));
    }
    return event.build();
  }

  @Test
  void aDeletedEventEndsTheExecutorForSpark() {
    RecordingStore store = new RecordingStore();
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, store);
    Pod running = executorPod(1, "Running", null);
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0, running));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SYNCED, 10, null));
    // Removed with grace period 0: the last state is still Running.
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_DELETED, 11,
        executorPod(1, "Running", "2026-01-02T03:04:00Z")));

    List<ExecutorPodState> states = store.states(1);
    assertInstanceOf(PodRunning.class, states.get(0));
    assertInstanceOf(PodDeleted.class, states.get(states.size() - 1), states.toString());
    // The last snapshot is full and without the pod.
    ExecutorPodsSnapshot last = store.snapshots.get(store.snapshots.size() - 1);
    assertEquals(0, last.executorPods().size());
  }

  @Test
  void aPodGoneWhileTheStreamWasAwayEndsTheExecutorForSpark() {
    RecordingStore store = new RecordingStore();
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, store);
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0,
        executorPod(1, "Running", null)));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0,
        executorPod(2, "Running", null)));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SYNCED, 10, null));

    // A restarted service's full state, without executor 1's pod, deleted meanwhile: Spark
    // would act on a pod merely missing from it only missingPodDetectDelta after registration.
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0,
        executorPod(2, "Running", null)));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SYNCED, 20, null));

    List<ExecutorPodState> gone = store.states(1);
    assertInstanceOf(PodDeleted.class, gone.get(gone.size() - 1), gone.toString());
    for (ExecutorPodState state : store.states(2)) {
      assertInstanceOf(PodRunning.class, state);
    }
    ExecutorPodsSnapshot last = store.snapshots.get(store.snapshots.size() - 1);
    assertEquals(1, last.executorPods().size());
  }

  @Test
  void startWaitsForTheFirstFullStateOnly() {
    RecordingStore store = new RecordingStore();
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, store);
    assertFalse(feed.awaitFirstState(Duration.ZERO));
    // A full state's pods alone do not release it: its SYNCED does.
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0,
        executorPod(1, "Running", null)));
    assertFalse(feed.awaitFirstState(Duration.ZERO));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SYNCED, 10, null));
    assertTrue(feed.awaitFirstState(Duration.ZERO));
  }

  @Test
  void aClosedFeedReleasesTheWait() {
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, new RecordingStore());
    feed.close();
    assertTrue(feed.awaitFirstState(Duration.ZERO));
  }
}
