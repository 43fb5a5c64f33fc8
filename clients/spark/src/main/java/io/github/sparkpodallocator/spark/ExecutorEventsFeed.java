package io.github.sparkpodallocator.spark;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.utils.Serialization;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshotsStore;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.jdk.javaapi.CollectionConverters;
import spark.allocator.v1.Allocator.ExecutorEvent;
import spark.allocator.v1.Allocator.ExecutorReclaim;

/**
 * Feeds the service's executor event stream (WatchExecutors) into the driver's snapshot store,
 * as Spark's own pod watch and polling would: a full state replaces the snapshot, a changed pod
 * updates it, a pod gone is shown deleted and then leaves it. So the driver, whose own watch
 * and polling {@link SparkPodSources} turns off, still learns of every executor failure
 * without a pod watch or LIST of its own.
 *
 * <p>A RECLAIM event (the service asks an executor back for a budget's owner) goes to the
 * reclaim handler, which decommissions the executor through Spark ({@link ExecutorReclaimer}).
 *
 * <p>A broken stream is opened again (backoff 100 ms … 5 s) resuming after the last change
 * applied; NOT_FOUND (a service that lost the application) has the client start it again first.
 */
final class ExecutorEventsFeed implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ExecutorEventsFeed.class);
  private static final Duration FIRST_BACKOFF = Duration.ofMillis(100);
  private static final Duration MAX_BACKOFF = Duration.ofSeconds(5);

  private final AllocatorClient client;
  private final ExecutorPodsSnapshotsStore store;
  private final Reclaims reclaims;
  private final Thread thread;
  private volatile boolean closed;
  private volatile Context.CancellableContext current;
  /** Released by the stream's first full state applied, or by close. */
  private final CountDownLatch firstState = new CountDownLatch(1);

  /** The pods as the driver's snapshot store has them, by name (owned by the thread). */
  private final Map<String, Pod> pods = new LinkedHashMap<>();
  /** The sequence of the last full state or change applied; 0 = none. */
  private long appliedUpTo;
  /** The full state being received (SNAPSHOT events before their SYNCED); null = none. */
  private List<Pod> fullState;

  /** What is done with a RECLAIM event; it must not throw (the deadline takes the executor). */
  interface Reclaims {
    void reclaim(long executorId, ExecutorReclaim reclaim);
  }

  ExecutorEventsFeed(AllocatorClient client, ExecutorPodsSnapshotsStore store) {
    this(client, store, (id, reclaim) -> LOG.debug("Ignoring the reclaim of executor {}", id));
  }

  ExecutorEventsFeed(AllocatorClient client, ExecutorPodsSnapshotsStore store,
      Reclaims reclaims) {
    this.client = client;
    this.store = store;
    this.reclaims = reclaims;
    this.thread = new Thread(this::run, "spark-pod-allocator-executor-events");
    this.thread.setDaemon(true);
  }

  void start() {
    thread.start();
  }

  /**
   * Waits until the stream's first full state is applied, for at most {@code bound}: true
   * when it was. A stream opened before the application's first pod is asked for gets its full
   * state from the service's own events, without a LIST of the application's pods.
   */
  boolean awaitFirstState(Duration bound) {
    try {
      return firstState.await(bound.toMillis(), TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  @Override
  public void close() {
    closed = true;
    firstState.countDown();
    Context.CancellableContext context = current;
    if (context != null) {
      context.cancel(null);
    }
    thread.interrupt();
    try {
      thread.join(5_000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void run() {
    Duration backoff = FIRST_BACKOFF;
    // The stream broke since the targets were last sent again: the application may have
    // moved to another replica, or the service restarted.
    boolean broken = false;
    while (!closed) {
      Context.CancellableContext context = Context.current().withCancellation();
      current = context;
      try {
        Iterator<ExecutorEvent> events = client.watchExecutors(appliedUpTo, context);
        // A full state's SNAPSHOT events count only with their SYNCED, in the same stream.
        fullState = null;
        while (events.hasNext()) {
          ExecutorEvent event = events.next();
          backoff = FIRST_BACKOFF;
          if (broken) {
            broken = !sendTargetsAgain();
          }
          apply(event);
        }
        // Ended cleanly: the application was stopped or forgotten, or the service shut down.
        if (!closed) {
          LOG.info("The spark-pod-allocator executor event stream ended; opening it again");
        }
        broken = true;
      } catch (StatusRuntimeException e) {
        if (closed) {
          break;
        }
        broken = true;
        Status.Code code = e.getStatus().getCode();
        LOG.warn("The spark-pod-allocator executor event stream failed ({}); opening it again"
            + " in {} ms", code, backoff.toMillis());
        if (code == Status.Code.NOT_FOUND) {
          try {
            // The client answers NOT_FOUND with a new Start (the service lost the application).
            client.status();
          } catch (RuntimeException restart) {
            LOG.warn("Could not start the application again in the service", restart);
          }
        }
      } catch (RuntimeException e) {
        if (closed) {
          break;
        }
        LOG.warn("Cannot apply an executor event; opening the stream again", e);
        appliedUpTo = 0;
      } finally {
        context.cancel(null);
      }
      if (closed) {
        break;
      }
      try {
        Thread.sleep(backoff.toMillis());
      } catch (InterruptedException e) {
        break;
      }
      backoff = backoff.multipliedBy(2).compareTo(MAX_BACKOFF) > 0
          ? MAX_BACKOFF : backoff.multipliedBy(2);
    }
  }

  /** The service that answers the stream again gets the last targets again: true if sent. */
  private boolean sendTargetsAgain() {
    try {
      client.sendTargetsAgain();
      return true;
    } catch (RuntimeException e) {
      LOG.warn("Could not send the application's targets to spark-pod-allocator again; trying"
          + " with the next event", e);
      return false;
    }
  }

    /** Applies one event of the stream to the snapshot store (on the feed's thread). */
  void apply(ExecutorEvent event) {
    switch (event.getKind()) {
      case EXECUTOR_EVENT_KIND_SNAPSHOT:
        if (fullState == null) {
          fullState = new ArrayList<>();
        }
        fullState.add(pod(event));
        break;
      case EXECUTOR_EVENT_KIND_SYNCED:
        replace(fullState == null ? List.of() : fullState);
        fullState = null;
        appliedUpTo = event.getSequence();
        firstState.countDown();
        break;
      case EXECUTOR_EVENT_KIND_UPDATED:
        Pod updated = pod(event);
        pods.put(updated.getMetadata().getName(), updated);
        store.updatePod(updated);
        appliedUpTo = event.getSequence();
        break;
      case EXECUTOR_EVENT_KIND_DELETED:
        Pod last = pods.remove(event.getExecutor().getPodName());
        // First the pod as deleted, which Spark's lifecycle manager acts on at once;
        // then a full snapshot without it, as Spark's own polling would list it.
        Pod gone = event.getExecutor().getPodJson().isEmpty() ? last : pod(event);
        if (gone != null) {
          store.updatePod(asDeleted(gone, Instant.now()));
        }
        store.replaceSnapshot(
            CollectionConverters.asScala(new ArrayList<>(pods.values())).toSeq());
        appliedUpTo = event.getSequence();
        break;
      case EXECUTOR_EVENT_KIND_RECLAIM:
        // Acted on at once, also within a full state: a decommission is not undone, and the
        // handler takes each executor once however often the reclaim is repeated.
        reclaims.reclaim(event.getExecutor().getExecutorId(), event.getReclaim());
        if (fullState == null) {
          appliedUpTo = Math.max(appliedUpTo, event.getSequence());
        }
        break;
      default:
        LOG.debug("Ignoring an executor event of an unknown kind: {}", event);
    }
  }

  /**
   * A full state: a pod the feed knew that is not in it went while the stream was away (a
   * service restarted, a stream broken), and is shown deleted first, as a watch would have
   * shown it (see {@link #asDeleted}).
   */
  private void replace(List<Pod> fullState) {
    Map<String, Pod> next = new LinkedHashMap<>();
    for (Pod pod : fullState) {
      next.put(pod.getMetadata().getName(), pod);
    }
    Instant now = Instant.now();
    for (Map.Entry<String, Pod> known : pods.entrySet()) {
      if (!next.containsKey(known.getKey())) {
        store.updatePod(asDeleted(known.getValue(), now));
      }
    }
    pods.clear();
    pods.putAll(next);
    store.replaceSnapshot(CollectionConverters.asScala(fullState).toSeq());
  }

  /**
   * The pod as Spark's snapshot takes a deleted one: a deletion timestamp and a phase other
   * than Running or Terminating. Spark's lifecycle manager removes the executor of such a pod
   * at once ("deleted by a user or the framework"). A pod merely missing from a full snapshot
   * is removed only once a full snapshot comes more than
   * {@code spark.kubernetes.executor.missingPodDetectDelta} (30 s) after the executor
   * registered, and with Spark's own polling off no later full snapshot comes; a pod removed
   * at once (grace period 0) goes while still Running, so its last state alone is not enough.
   */
  static Pod asDeleted(Pod pod, Instant now) {
    PodBuilder deleted = new PodBuilder(pod);
    if (pod.getMetadata() == null || pod.getMetadata().getDeletionTimestamp() == null) {
      deleted.editOrNewMetadata().withDeletionTimestamp(now.toString()).endMetadata();
    }
    String phase = pod.getStatus() == null ? null : pod.getStatus().getPhase();
    if (!"Failed".equalsIgnoreCase(phase) && !"Succeeded".equalsIgnoreCase(phase)) {
      // Gone from the cluster, its containers with it.
      deleted.editOrNewStatus().withPhase("Failed").endStatus();
    }
    return deleted.build();
  }

  private static Pod pod(ExecutorEvent event) {
    return Serialization.unmarshal(event.getExecutor().getPodJson(), Pod.class);
  }
}
