package io.github.sparkpodallocator.spark;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.readiness.Readiness;
import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SecurityManager;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkException;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfile$;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerApplicationEnd;
import org.apache.spark.scheduler.TaskSchedulerImpl;
import org.apache.spark.scheduler.cluster.k8s.AbstractPodsAllocator;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshotsStore;
import org.apache.spark.scheduler.cluster.k8s.KubernetesClusterSchedulerBackend;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.apache.spark.util.Clock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;
import spark.allocator.v1.Allocator.AllocationSettings;
import spark.allocator.v1.Allocator.StartRequest;

/**
 * Spark's executor-pod allocator, delegated to the spark-pod-allocator service. Spark loads it
 * with {@code spark.kubernetes.allocation.pods.allocator=}{@value #CLASS_NAME}; the driver keeps
 * everything else (the lifecycle manager, killing executors). Its own pod watch and polling are
 * turned off while the service's event stream feeds the driver (see {@link SparkPodSources}).
 *
 * <p>Each resource profile's executor pod is built once, the way Spark builds it, with the
 * executor id {@code {{EXECUTOR_ID}}}, and sent to the service: profile 0 with Start, later
 * profiles with the SetTotalExpected that first asks for them.
 *
 * <p>When the driver begins to stop, every target goes to 0 (see {@link #endAllocation}).
 */
public class ServicePodsAllocator extends AbstractPodsAllocator {
  /** The value of {@code spark.kubernetes.allocation.pods.allocator} that selects this class. */
  public static final String CLASS_NAME = "io.github.sparkpodallocator.spark.ServicePodsAllocator";

  private static final Logger LOG = LoggerFactory.getLogger(ServicePodsAllocator.class);
  private static final String NAMESPACE = "spark.kubernetes.namespace";
  private static final String DRIVER_POD_NAME = "spark.kubernetes.driver.pod.name";
  /** The listener bus queue of the plugin's own listener, so no other listener delays it. */
  static final String LISTENER_QUEUE = "sparkPodAllocator";
  /** How often the driver pod is read while waiting for it to be Ready. */
  private static final long READY_CHECK_MS = 250;
  /**
   * How long start waits for the executor event stream's first full state, so that Spark's
   * first SetTotalExpected (right after start) comes after the stream is open: a stream opened
   * once pods are being created needs a LIST of them for its full state, one opened before
   * needs none. Bounded: a slow stream only costs that LIST.
   */
  private static final Duration FIRST_STATE_WAIT = Duration.ofSeconds(10);

  private final SparkConf conf;
  private final ExecutorPodTemplates templates;
  private final String namespace;
  private final Option<Pod> driverPod;
  private final KubernetesClient kubernetesClient;
  private final long driverReadinessTimeoutSeconds;
  private final AllocatorClient client;
  private final long registeredCheckMillis;
  private final long serviceCheckMillis;
  private final String address;
  private final ExecutorPodsSnapshotsStore snapshotsStore;
  private final boolean executorEvents;
  private final CreationFailureCount creationFailures = new CreationFailureCount();

  // Guarded by `this`.
  private String applicationId;
  private ScheduledExecutorService registeredExecutorsCheck;
  private ExecutorEventsFeed eventsFeed;
  private SparkContext sparkContext;
  private boolean allocationEnded;
  private boolean stopped;

  /**
   * The constructor Spark's {@code KubernetesClusterManager} calls by reflection. The snapshot
   * store is fed from the service's executor event stream (unless
   * {@code spark.kubernetes.allocation.service.executorEvents=false}), and then Spark's own pod
   * watch and polling are turned off on {@code conf}, the SparkContext's, unless the user set
   * their keys; the clock goes unused.
   */
  public ServicePodsAllocator(
      SparkConf conf,
      SecurityManager securityManager,
      KubernetesExecutorBuilder executorBuilder,
      KubernetesClient kubernetesClient,
      ExecutorPodsSnapshotsStore snapshotsStore,
      Clock clock) throws SparkException {
    this.conf = conf;
    this.templates =
        new ExecutorPodTemplates(conf, securityManager, executorBuilder, kubernetesClient);
    this.namespace = conf.get(NAMESPACE, "default");
    ServiceSettings settings;
    try {
      settings = ServiceSettings.fromConf(conf, ServiceSettings.SERVICE_ACCOUNT_TOKEN);
      // The same period Spark's allocator reads the registered executors at.
      this.registeredCheckMillis = SparkAllocationSettings.batchDelayMs(conf);
      this.driverReadinessTimeoutSeconds =
          SparkAllocationSettings.driverReadinessTimeoutSeconds(conf);
    } catch (IllegalArgumentException e) {
      throw new SparkException("Invalid configuration for " + CLASS_NAME + ": " + e.getMessage(),
          e);
    }
    this.address = settings.address();
    this.serviceCheckMillis = settings.checkInterval().toMillis();
    this.snapshotsStore = snapshotsStore;
    this.executorEvents = settings.executorEvents();
    if (executorEvents) {
      for (String warning : SparkPodSources.turnOff(conf)) {
        LOG.warn(warning);
      }
      LOG.info("The spark-pod-allocator event stream feeds the driver's executor pod states;"
          + " Spark's own sources: {}={}, {}={}", SparkPodSources.WATCHER,
          conf.get(SparkPodSources.WATCHER, "true"), SparkPodSources.POLLING,
          conf.get(SparkPodSources.POLLING, "true"));
    }
    this.kubernetesClient = kubernetesClient;
    this.driverPod = lookUpDriverPod(conf, kubernetesClient, namespace);
    try {
      this.client = new AllocatorClient(settings);
    } catch (IOException e) {
      throw new SparkException("Cannot set up the channel to the spark-pod-allocator service at "
          + settings.address() + ": " + e.getMessage(), e);
    }
  }

  private static Option<Pod> lookUpDriverPod(
      SparkConf conf, KubernetesClient client, String namespace) throws SparkException {
    if (!conf.contains(DRIVER_POD_NAME)) {
      return Option.empty();
    }
    String name = conf.get(DRIVER_POD_NAME);
    Pod pod = client.pods().inNamespace(namespace).withName(name).get();
    if (pod == null) {
      throw new SparkException("No pod named " + name + " in namespace " + namespace
          + " (" + DRIVER_POD_NAME + " names the driver pod)");
    }
    return Option.apply(pod);
  }

  /**
   * Waits up to {@code timeoutSeconds} for the pod {@code name} to be Ready, as Spark's
   * allocator waits for the driver pod before its first executor
   * ({@code spark.kubernetes.allocation.driver.readinessTimeout}): executors reach the driver
   * through its headless service, which resolves only once the pod is Ready. Executors are
   * asked for after the wait whatever its outcome, as in Spark. The pod is read with GETs
   * (fabric8's {@code waitUntilReady} would LIST and watch pods), the first one at once: a
   * driver runs in its pod, which is Ready by then unless a readiness probe holds it back.
   */
  static void awaitReady(
      KubernetesClient client, String namespace, String name, long timeoutSeconds) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutSeconds);
    try {
      while (true) {
        Pod pod = client.pods().inNamespace(namespace).withName(name).get();
        if (pod != null && Readiness.isPodReady(pod)) {
          return;
        }
        long leftMs = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
        if (leftMs <= 0) {
          LOG.warn("The driver pod {} was not Ready within {} s; asking for executors anyway",
              name, timeoutSeconds);
          return;
        }
        Thread.sleep(Math.min(leftMs, READY_CHECK_MS));
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException e) {
      LOG.warn("Could not read the driver pod {}; asking for executors anyway", name, e);
    }
  }

  @Override
  public Option<Pod> driverPod() {
    return driverPod;
  }

  @Override
  public void start(String appId, KubernetesClusterSchedulerBackend backend) {
    ResourceProfile defaultProfile = ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf);
    ExecutorPodTemplates.Template template = buildTemplate(appId, defaultProfile);
    AllocationSettings settings;
    try {
      settings = SparkAllocationSettings.fromConf(conf, template.executorContainerName());
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("Invalid configuration for " + CLASS_NAME + ": "
          + e.getMessage(), e);
    }
    String json = template.json();
    StartRequest.Builder request = StartRequest.newBuilder()
        .setApplicationId(appId)
        .setNamespace(namespace)
        .setExecutorPodTemplate(json)
        .addAllExecutorClaimTemplates(template.claimJsons())
        .setPodNamePrefix(template.podNamePrefix())
        .setSettings(settings);
    if (driverPod.isDefined()) {
      request.setDriverPodName(driverPod.get().getMetadata().getName());
    }
    synchronized (this) {
      applicationId = appId;
    }
    if (driverPod.isDefined()) {
      awaitReady(kubernetesClient, namespace, driverPod.get().getMetadata().getName(),
          driverReadinessTimeoutSeconds);
    }
    client.start(request.build());
    watchForTheDriversStop(backend);
    if (executorEvents) {
      ExecutorReclaimer reclaimer = new ExecutorReclaimer(conf, ExecutorReclaimer.of(backend));
      ExecutorEventsFeed feed =
          new ExecutorEventsFeed(client, snapshotsStore, reclaimer::reclaim);
      synchronized (this) {
        eventsFeed = feed;
      }
      feed.start();
      if (!feed.awaitFirstState(FIRST_STATE_WAIT)) {
        LOG.info("The spark-pod-allocator executor event stream sent no full state within {} s;"
            + " asking for executors without it", FIRST_STATE_WAIT.toSeconds());
      }
    }

    ScheduledExecutorService check = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread thread = new Thread(r, "spark-pod-allocator-checks");
      thread.setDaemon(true);
      return thread;
    });
    check.scheduleWithFixedDelay(() -> reportRegisteredExecutors(backend),
        0, registeredCheckMillis, TimeUnit.MILLISECONDS);
    check.scheduleWithFixedDelay(this::checkServiceKnowsApplication,
        serviceCheckMillis, serviceCheckMillis, TimeUnit.MILLISECONDS);
    synchronized (this) {
      registeredExecutorsCheck = check;
    }
  }

  @Override
  public void setTotalExpectedExecutors(
      scala.collection.immutable.Map<ResourceProfile, Object> resourceProfileToTotalExecs) {
    String appId;
    synchronized (this) {
      appId = applicationId;
    }
    if (appId == null) {
      throw new IllegalStateException(CLASS_NAME + ".setTotalExpectedExecutors before start");
    }
    if (driverIsStopping()) {
      // Spark's stop may still set targets (its allocation manager): none raises them now.
      endAllocation("SparkContext.stop() began");
      return;
    }
    Map<Integer, Integer> perProfile = new TreeMap<>();
    Map<Integer, String> newTemplates = new TreeMap<>();
    for (Map.Entry<ResourceProfile, Object> entry
        : CollectionConverters.asJava(resourceProfileToTotalExecs).entrySet()) {
      ResourceProfile profile = entry.getKey();
      perProfile.put(profile.id(), (Integer) entry.getValue());
      if (!client.hasTemplate(profile.id())) {
        newTemplates.put(profile.id(), buildTemplate(appId, profile).json());
      }
    }
    client.setTotalExpected(perProfile, newTemplates);
  }

  @Override
  public boolean isDeleted(String executorId) {
    return client.isDeleted(executorId);
  }

  /**
   * Stops the application in the service, which deletes its executor pods. Spark's scheduler
   * backend goes on with its own clean-up after this call, so a failure is logged, not thrown.
   */
  @Override
  public void stop(String appId) {
    ScheduledExecutorService check;
    ExecutorEventsFeed feed;
    boolean started;
    synchronized (this) {
      stopped = true;
      check = registeredExecutorsCheck;
      registeredExecutorsCheck = null;
      feed = eventsFeed;
      eventsFeed = null;
      started = applicationId != null;
    }
    // Before Stop, whose end of the stream must not be taken for a restarted service.
    if (feed != null) {
      feed.close();
    }
    if (check != null) {
      check.shutdownNow();
    }
    if (!started) {
      // Spark stops the backend even when its start failed before ours ran.
      client.close();
      return;
    }
    try {
      int deleted = client.stop();
      LOG.info("spark-pod-allocator stopped application {} and deleted {} executor pods", appId,
          deleted);
    } catch (RuntimeException e) {
      LOG.error("Could not stop application {} in the spark-pod-allocator service at {}; its"
          + " executor pods may remain", appId, address, e);
    } finally {
      client.close();
    }
  }

  /**
   * Registers the listener that ends allocation on Spark's application-end event. Spark
   * 4.0 and 4.2 post that event at the very start of {@code SparkContext.stop()}, before the
   * scheduler backend asks the executors to exit (StopExecutors) and long before it calls
   * {@link #stop}; the listener bus is asynchronous, so the periodic check and
   * {@link #setTotalExpectedExecutors} also look at {@code SparkContext.isStopped()}, which
   * is set before the event is posted.
   */
  private void watchForTheDriversStop(KubernetesClusterSchedulerBackend backend) {
    SparkContext sc = sparkContextOf(backend);
    if (sc == null) {
      LOG.warn("Found no SparkContext in {}: executors that exit while the driver stops may be"
          + " replaced until {}.stop", backend.getClass().getName(), CLASS_NAME);
      return;
    }
    synchronized (this) {
      sparkContext = sc;
    }
    try {
      sc.listenerBus().addToQueue(new DriverStopListener(this), LISTENER_QUEUE);
    } catch (RuntimeException | LinkageError e) {
      // Only the listener is lost: the isStopped() checks still end allocation.
      LOG.warn("Could not add the driver-stop listener to Spark's listener bus", e);
    }
  }

  /**
   * The SparkContext that owns {@code backend}. Spark hands it to the backend's constructor
   * but offers no accessor (the field's name is Scala's, per version), so it is found by type.
   */
  static SparkContext sparkContextOf(Object backend) {
    for (Class<?> c = backend.getClass(); c != null; c = c.getSuperclass()) {
      for (Field field : c.getDeclaredFields()) {
        if (Modifier.isStatic(field.getModifiers())
            || !SparkContext.class.isAssignableFrom(field.getType())) {
          continue;
        }
        try {
          field.setAccessible(true);
          Object value = field.get(backend);
          if (value != null) {
            return (SparkContext) value;
          }
        } catch (ReflectiveOperationException | RuntimeException e) {
          LOG.debug("Cannot read {}.{}", c.getName(), field.getName(), e);
        }
      }
    }
    return null;
  }

  private boolean driverIsStopping() {
    SparkContext sc;
    synchronized (this) {
      if (allocationEnded) {
        return true;
      }
      sc = sparkContext;
    }
    return sc != null && sc.isStopped();
  }

  /**
   * The driver began to stop: no executor is wanted any more. Spark asks its executors to
   * exit before it calls {@link #stop}, and the service, still holding the last targets, would
   * replace them in between; so every profile's target goes to 0 now, once, and stays there.
   */
  void endAllocation(String why) {
    synchronized (this) {
      if (applicationId == null || allocationEnded || stopped) {
        return;
      }
      allocationEnded = true;
    }
    LOG.info("{}: asking the spark-pod-allocator service for no more executors", why);
    try {
      client.endAllocation();
    } catch (RuntimeException e) {
      LOG.warn("Could not set the targets to 0 in the spark-pod-allocator service at {}; its"
          + " Stop follows", address, e);
    }
  }

  /** Ends allocation on Spark's application-end event, on a listener-bus queue of its own. */
  private static final class DriverStopListener extends SparkListener {
    private final ServicePodsAllocator allocator;

    DriverStopListener(ServicePodsAllocator allocator) {
      this.allocator = allocator;
    }

    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd end) {
      allocator.endAllocation("The application ended (SparkContext.stop() began)");
    }
  }

  private ExecutorPodTemplates.Template buildTemplate(String appId, ResourceProfile profile) {
    try {
      return templates.build(appId, driverPod, profile);
    } catch (SparkException e) {
      throw new IllegalStateException(e.getMessage(), e);
    }
  }

  /**
   * Asks the service about the application. A restarted service has resumed it from its
   * registration; one that lost it answers NOT_FOUND and the client starts the application
   * again (with its templates, targets and registered executors), so lost executors are
   * replaced even while Spark has nothing to say. The answer's failed creates go to Spark's
   * executor-failure count where Spark has one for them (see {@link CreationFailureCount}).
   */
  private void checkServiceKnowsApplication() {
    try {
      creationFailures.takeIn(client.status(), this);
    } catch (RuntimeException e) {
      LOG.warn("Could not check the application in the spark-pod-allocator service at {};"
          + " trying again in {} ms", address, serviceCheckMillis, e);
    }
  }

  /**
   * Sends the driver's registered executors when they changed since the last report, with the
   * tasks running on each (what Spark's task scheduler holds, read under its lock: no RPC);
   * running tasks that alone changed are sent at most once per {@code checkInterval}.
   */
  private void reportRegisteredExecutors(KubernetesClusterSchedulerBackend backend) {
    if (driverIsStopping()) {
      // In case the application-end event is late: the flag is set before it is posted.
      endAllocation("SparkContext.stop() began");
      return;
    }
    try {
      List<String> ids = new ArrayList<>(CollectionConverters.asJava(backend.getExecutorIds()));
      ids.sort((a, b) -> a.length() != b.length() ? a.length() - b.length() : a.compareTo(b));
      client.updateRegisteredExecutors(ids, runningTasks(ids),
          Duration.ofMillis(serviceCheckMillis));
    } catch (RuntimeException e) {
      LOG.warn("Could not report the registered executors to the spark-pod-allocator service;"
          + " trying again in {} ms", registeredCheckMillis, e);
    }
  }

  /**
   * The tasks running on each of {@code executorIds} (0 for one with none), as Spark's task
   * scheduler counts them; empty when the driver has no such scheduler.
   */
  private Map<String, Integer> runningTasks(List<String> executorIds) {
    SparkContext sc;
    synchronized (this) {
      sc = sparkContext;
    }
    if (sc == null || !(sc.taskScheduler() instanceof TaskSchedulerImpl scheduler)) {
      return Map.of();
    }
    return runningTasks(executorIds,
        CollectionConverters.asJava(scheduler.runningTasksByExecutors()));
  }

  /** {@code running} (Spark's counts, boxed) for {@code executorIds} alone, 0 where absent. */
  static Map<String, Integer> runningTasks(List<String> executorIds, Map<String, Object> running) {
    Map<String, Integer> counts = new TreeMap<>();
    for (String id : executorIds) {
      Object count = running.get(id);
      counts.put(id, count instanceof Integer n ? n : 0);
    }
    return counts;
  }
}
