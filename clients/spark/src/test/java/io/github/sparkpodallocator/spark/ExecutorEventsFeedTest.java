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
import java.util.Set;
import java.util.TreeSet;
import org.apache.spark.SparkConf;
import org.apache.spark.scheduler.ExecutorDecommissionInfo;
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
import spark.allocator.v1.Allocator.ExecutorReclaim;

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
  static final class RecordingStore implements ExecutorPodsSnapshotsStore {
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

  /** Spark's scheduler backend as the reclaimer sees it: registered executors, decommissions. */
  private static final class FakeDriver implements ExecutorReclaimer.Driver {
    final Set<String> registered = new TreeSet<>();
    final List<String> decommissioned = new ArrayList<>();
    final List<ExecutorDecommissionInfo> infos = new ArrayList<>();

    @Override
    public boolean isRegistered(String executorId) {
      return registered.contains(executorId);
    }

    @Override
    public List<String> decommission(String executorId, ExecutorDecommissionInfo info) {
      decommissioned.add(executorId);
      infos.add(info);
      return List.of(executorId);
    }
  }

  private static ExecutorEvent reclaim(long sequence, Pod pod, String budget) {
    return event(ExecutorEventKind.EXECUTOR_EVENT_KIND_RECLAIM, sequence, pod).toBuilder()
        .setReclaim(ExecutorReclaim.newBuilder().setBudget(budget)
            .setDeadlineMs(1_767_323_045_000L))
        .build();
  }

  private static ExecutorEvent withId(ExecutorEvent event, long id) {
    return event.toBuilder()
        .setExecutor(event.getExecutor().toBuilder().setExecutorId(id)).build();
  }

  private static SparkConf decommissionOn() {
    return new SparkConf(false)
        .set("spark.decommission.enabled", "true")
        .set("spark.storage.decommission.enabled", "true");
  }

  @Test
  void aReclaimDecommissionsThatExecutorOnceThroughSpark() {
    FakeDriver driver = new FakeDriver();
    driver.registered.addAll(List.of("1", "2", "3"));
    List<String> warnings = new ArrayList<>();
    ExecutorReclaimer reclaimer = new ExecutorReclaimer(decommissionOn(), driver, warnings::add);
    RecordingStore store = new RecordingStore();
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, store, reclaimer::reclaim);
    for (int id = 1; id <= 3; id++) {
      feed.apply(withId(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0,
          executorPod(id, "Running", null)), id));
    }
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SYNCED, 10, null));
    Pod two = executorPod(2, "Running", null);
    feed.apply(withId(reclaim(11, two, "queue/gold"), 2));
    assertEquals(List.of("2"), driver.decommissioned);
    String message = driver.infos.get(0).message();
    assertTrue(message.contains("queue/gold"), message);
    // The host stays: only the executor goes (its shuffle files migrate, not lost with a host).
    assertTrue(driver.infos.get(0).workerHost().isEmpty());

    // A stream opened again repeats the reclaim in its full state, and the service may repeat
    // it: the executor is decommissioned once.
    for (int id = 1; id <= 3; id++) {
      feed.apply(withId(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SNAPSHOT, 0,
          executorPod(id, "Running", null)), id));
    }
    feed.apply(withId(reclaim(11, two, "queue/gold"), 2));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_SYNCED, 12, null));
    feed.apply(withId(reclaim(13, two, "queue/gold"), 2));
    assertEquals(List.of("2"), driver.decommissioned);
    assertEquals(List.of(), warnings);
    // The pods themselves are untouched by a reclaim: Spark learns of the exit from them.
    for (ExecutorPodState state : store.states(2)) {
      assertInstanceOf(PodRunning.class, state);
    }
  }

  @Test
  void anExecutorNotRegisteredYetIsLeftToTheService() {
    FakeDriver driver = new FakeDriver();
    driver.registered.add("1");
    ExecutorReclaimer reclaimer = new ExecutorReclaimer(decommissionOn(), driver, w -> {});
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, new RecordingStore(),
        reclaimer::reclaim);
    feed.apply(withId(reclaim(5, executorPod(4, "Pending", null), "namespace/team-a"), 4));
    assertEquals(List.of(), driver.decommissioned);

    // Registered by the time a full state repeats the reclaim: decommissioned then.
    driver.registered.add("4");
    feed.apply(withId(reclaim(5, executorPod(4, "Running", null), "namespace/team-a"), 4));
    assertEquals(List.of("4"), driver.decommissioned);
  }

  @Test
  void withDecommissionOffTheDriverWarnsOnceAndLeavesTheExecutorToTheDeadline() {
    FakeDriver driver = new FakeDriver();
    driver.registered.addAll(List.of("1", "2"));
    List<String> warnings = new ArrayList<>();
    ExecutorReclaimer reclaimer =
        new ExecutorReclaimer(new SparkConf(false), driver, warnings::add);
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, new RecordingStore(),
        reclaimer::reclaim);
    feed.apply(withId(reclaim(5, executorPod(1, "Running", null), "queue/gold"), 1));
    feed.apply(withId(reclaim(6, executorPod(2, "Running", null), "queue/gold"), 2));
    feed.apply(withId(reclaim(6, executorPod(2, "Running", null), "queue/gold"), 2));

    assertEquals(List.of(), driver.decommissioned);
    assertEquals(1, warnings.size(), warnings.toString());
    assertTrue(warnings.get(0).contains("spark.decommission.enabled=true")
        && warnings.get(0).contains("spark.storage.decommission.enabled=true")
        && warnings.get(0).contains("queue/gold"), warnings.get(0));
  }

  @Test
  void withoutBlockMigrationTheExecutorIsDecommissionedAndTheLossWarnedAbout() {
    FakeDriver driver = new FakeDriver();
    driver.registered.addAll(List.of("1", "2"));
    List<String> warnings = new ArrayList<>();
    ExecutorReclaimer reclaimer = new ExecutorReclaimer(
        new SparkConf(false).set("spark.decommission.enabled", "true"), driver, warnings::add);
    reclaimer.reclaim(1, ExecutorReclaim.newBuilder().setBudget("b").build());
    reclaimer.reclaim(2, ExecutorReclaim.newBuilder().setBudget("b").build());
    assertEquals(List.of("1", "2"), driver.decommissioned);
    assertEquals(1, warnings.size(), warnings.toString());
    assertTrue(warnings.get(0).contains("spark.storage.decommission.enabled=true"),
        warnings.get(0));
  }

  @Test
  void aFailingDecommissionDoesNotBreakTheFeed() {
    ExecutorReclaimer.Driver broken = new ExecutorReclaimer.Driver() {
      @Override
      public boolean isRegistered(String executorId) {
        return true;
      }

      @Override
      public List<String> decommission(String executorId, ExecutorDecommissionInfo info) {
        throw new IllegalStateException("the backend is stopping");
      }
    };
    ExecutorReclaimer reclaimer = new ExecutorReclaimer(decommissionOn(), broken, w -> {});
    RecordingStore store = new RecordingStore();
    ExecutorEventsFeed feed = new ExecutorEventsFeed(null, store, reclaimer::reclaim);
    feed.apply(withId(reclaim(5, executorPod(1, "Running", null), "b"), 1));
    feed.apply(event(ExecutorEventKind.EXECUTOR_EVENT_KIND_UPDATED, 6,
        executorPod(1, "Running", null)));
    assertInstanceOf(PodRunning.class, store.states(1).get(0));
  }
}
