package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.KubernetesClient;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import java.util.stream.LongStream;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaFutureAction;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.resource.ExecutorResourceRequests;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfileBuilder;
import org.apache.spark.resource.TaskResourceRequests;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The Spark job's scenarios, written once and run on each cluster a subclass provides: a real
 * Spark driver (client mode, in this JVM, the plugin from the shaded jar) whose executor pods
 * the service creates and a node runs as local {@code java} processes with this JVM's class
 * path. Spark itself talks to the API server (its pod watch, the lifecycle manager, killing
 * executors). {@link SparkOnServiceIT}: the simulated cluster; {@link SparkOnControlPlaneIT}:
 * the real kube-apiserver with its scheduler, controller-manager and a process node.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(value = 3, unit = TimeUnit.MINUTES)
abstract class SparkScenarios {
  /** The executor image the node runs as a process. */
  static final String IMAGE = "spark-pod-allocator/spark-executor:it";

  /** The test's own Kubernetes client, told apart from the driver's in the request counts. */
  static final String TEST_USER_AGENT = "spark-on-service-it";

  /** Kept after the run under target/ (the service's log, each executor pod's log). */
  protected Path work;

  /** The service the scenarios' drivers call. */
  protected ServiceProcess service;
  protected int grpcPort;
  /** The test's client of the cluster (user agent {@link #TEST_USER_AGENT}). */
  protected KubernetesClient k8s;
  protected JavaSparkContext sc;

  /** The cluster's master URL and access keys, and where the executors must run. */
  abstract SparkConf onCluster(SparkConf conf);

  /**
   * Pod LISTs and watches the driver (a fabric8 client, not the test's) made so far, counted
   * by verb ({@code list}, {@code watch}).
   */
  abstract Map<String, Long> driverPodListsAndWatches() throws Exception;

  /** The driver's pod LISTs and watches since {@code before}, by verb; empty when none. */
  Map<String, Long> driverPodListsAndWatchesSince(Map<String, Long> before) throws Exception {
    Map<String, Long> since = new java.util.TreeMap<>();
    driverPodListsAndWatches().forEach((verb, count) -> {
      long more = count - before.getOrDefault(verb, 0L);
      if (more != 0) {
        since.put(verb, more);
      }
    });
    return since;
  }

  /**
   * A pod standing for the driver pod of the driver in this JVM: it runs (a process that
   * sleeps, or a pod a fake node keeps Running), and is never an executor.
   */
  abstract Pod driverPlaceholder(String name);

  /** Checks, where the cluster can tell, that the garbage collector deleted these pods. */
  abstract void assertDeletedByGarbageCollector(Set<String> pods) throws Exception;

  /** A cluster that outlives the services started against it: the restart scenario. */
  abstract StandaloneCluster standaloneCluster(Path dir) throws Exception;

  interface StandaloneCluster extends AutoCloseable {
    KubernetesClient client();

    SparkConf onCluster(SparkConf conf);

    /** Starts {@code serve} against this cluster on {@code grpcPort}. */
    ServiceProcess serve(Path dir, int grpcPort) throws Exception;

    @Override
    void close();
  }

  @AfterEach
  void stopSpark() {
    if (sc != null) {
      sc.stop();
      sc = null;
    }
  }

  /** The driver's settings shared by every scenario; {@code prefix} names its executor pods. */
  SparkConf conf(String prefix) {
    return onCluster(baseConf(prefix, grpcPort));
  }

  static SparkConf baseConf(String prefix, int grpcPort) {
    return new SparkConf(false)
        .setAppName("on-service-" + prefix)
        .set("spark.submit.deployMode", "client")
        .set("spark.kubernetes.allocation.pods.allocator", ServicePodsAllocator.CLASS_NAME)
        .set("spark.kubernetes.allocation.service.address", "127.0.0.1:" + grpcPort)
        .set("spark.kubernetes.allocation.service.tokenFile", "")
        .set("spark.kubernetes.allocation.batch.delay", "200ms")
        .set("spark.kubernetes.namespace", "default")
        .set("spark.kubernetes.container.image", IMAGE)
        .set("spark.kubernetes.executor.podNamePrefix", prefix)
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.executor.cores", "1")
        .set("spark.executor.memory", "512m")
        .set("spark.executor.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1");
  }

  JavaSparkContext start(SparkConf conf) {
    sc = new JavaSparkContext(conf);
    return sc;
  }

  List<Pod> executorPods(String appId) {
    return k8s.pods().inNamespace("default")
        .withLabel("spark-app-selector", appId)
        .withLabel("spark-role", "executor")
        .list().getItems();
  }

  static Set<String> names(List<Pod> pods) {
    return pods.stream()
        .map(p -> p.getMetadata().getName())
        .collect(Collectors.toCollection(TreeSet::new));
  }

  static Set<String> registeredExecutors(JavaSparkContext sc) {
    return new TreeSet<>(CollectionConverters.asJava(sc.sc().getExecutorIds()));
  }

  void await(String what, Duration timeout, BooleanSupplier done)
      throws InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    while (System.nanoTime() < end) {
      if (done.getAsBoolean()) {
        return;
      }
      Thread.sleep(100);
    }
    throw new AssertionError("timed out after " + timeout + " waiting for " + what
        + " (executor pod logs under " + work + ")"
        + "\n--- service log (last 4000 chars) ---\n" + tail(service.log(), 4000));
  }

  static String tail(String text, int chars) {
    return text.length() <= chars ? text : text.substring(text.length() - chars);
  }

  /** The sum of 1..1e6 computed in 8 partitions, and which executors computed it. */
  static Map.Entry<Long, Set<String>> sumOneToAMillion(JavaSparkContext sc, long sleepMs) {
    JavaRDD<Integer> slices =
        sc.parallelize(IntStream.range(0, 8).boxed().collect(Collectors.toList()), 8);
    List<Tuple2<Long, String>> parts = slices.map(i -> {
      if (sleepMs > 0) {
        Thread.sleep(sleepMs);
      }
      long sum = LongStream.rangeClosed(i * 125_000L + 1, (i + 1) * 125_000L).sum();
      return new Tuple2<>(sum, SparkEnv.get().executorId());
    }).collect();
    long total = parts.stream().mapToLong(Tuple2::_1).sum();
    Set<String> executors =
        parts.stream().map(Tuple2::_2).collect(Collectors.toCollection(TreeSet::new));
    return Map.entry(total, executors);
  }

  @Test
  void aJobOnTwoExecutorsPodsNamedAndLabelledAsSparkDoes() throws Exception {
    JavaSparkContext sc = start(conf("it-sum")
        .set("spark.executor.instances", "2")
        // The context waits for both executors before the job.
        .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
    String appId = sc.sc().applicationId();
    await("2 registered executors", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).size() == 2);

    Map.Entry<Long, Set<String>> result = sumOneToAMillion(sc, 0);
    assertEquals(500_000_500_000L, result.getKey());
    assertEquals(Set.of("1", "2"), registeredExecutors(sc));
    assertTrue(Set.of("1", "2").containsAll(result.getValue()),
        "tasks ran on " + result.getValue());

    List<Pod> pods = executorPods(appId);
    assertEquals(Set.of("it-sum-exec-1", "it-sum-exec-2"), names(pods));
    for (Pod pod : pods) {
      Map<String, String> labels = pod.getMetadata().getLabels();
      String id = pod.getMetadata().getName().substring("it-sum-exec-".length());
      assertEquals(appId, labels.get("spark-app-selector"));
      assertEquals("executor", labels.get("spark-role"));
      assertEquals(id, labels.get("spark-exec-id"));
      assertEquals("0", labels.get("spark-exec-resourceprofile-id"));
      assertEquals("on-service-it-sum", labels.get("spark-app-name"));
      assertEquals(org.apache.spark.package$.MODULE$.SPARK_VERSION(), labels.get("spark-version"));
      assertEquals("Running", pod.getStatus().getPhase());
    }

    sc.stop();
    this.sc = null;
    await("the executor pods deleted by Stop", Duration.ofSeconds(60),
        () -> executorPods(appId).isEmpty());
  }

  @Test
  void dynamicAllocationScalesUpUnderLoadAndRemovesIdleExecutors() throws Exception {
    JavaSparkContext sc = start(conf("it-dyn")
        .set("spark.dynamicAllocation.enabled", "true")
        .set("spark.dynamicAllocation.shuffleTracking.enabled", "true")
        .set("spark.dynamicAllocation.minExecutors", "0")
        .set("spark.dynamicAllocation.initialExecutors", "0")
        .set("spark.dynamicAllocation.maxExecutors", "4")
        .set("spark.dynamicAllocation.executorIdleTimeout", "2s")
        .set("spark.dynamicAllocation.schedulerBacklogTimeout", "1s")
        .set("spark.dynamicAllocation.sustainedSchedulerBacklogTimeout", "1s"));
    String appId = sc.sc().applicationId();
    assertTrue(executorPods(appId).isEmpty(), "no executor before any load");

    AtomicInteger mostPods = new AtomicInteger();
    Set<String> seen = java.util.concurrent.ConcurrentHashMap.newKeySet();
    Thread watcher = new Thread(() -> {
      while (!Thread.currentThread().isInterrupted()) {
        List<Pod> pods = executorPods(appId);
        mostPods.accumulateAndGet(pods.size(), Math::max);
        seen.addAll(names(pods));
        try {
          Thread.sleep(200);
        } catch (InterruptedException e) {
          return;
        }
      }
    });
    watcher.setDaemon(true);
    watcher.start();
    Map.Entry<Long, Set<String>> result;
    try {
      // 8 tasks of 2 s on 1-core executors: a backlog that asks for more executors.
      result = sumOneToAMillion(sc, 2_000);
    } finally {
      watcher.interrupt();
      watcher.join();
    }
    assertEquals(500_000_500_000L, result.getKey());
    assertTrue(result.getValue().size() >= 2, "tasks ran on " + result.getValue());
    assertTrue(mostPods.get() >= 2 && mostPods.get() <= 4,
        "at most " + mostPods + " executor pods at once");

    // Idle for 2 s: Spark releases them, the service lowers its target; no pod is replaced.
    await("idle executors removed", Duration.ofSeconds(90),
        () -> registeredExecutors(sc).isEmpty() && executorPods(appId).isEmpty());
    Thread.sleep(1_500);
    assertTrue(executorPods(appId).isEmpty(), "no executor comes back without load");
    // Ids 1..n with n <= maxExecutors: no executor was lost and replaced along the way.
    Set<String> expected = IntStream.rangeClosed(1, seen.size())
        .mapToObj(i -> "it-dyn-exec-" + i).collect(Collectors.toSet());
    assertEquals(expected, seen);

    // Load again: new executors with new ids (maxExecutors bounds executors at once, not
    // the ids an application may ever use).
    Map.Entry<Long, Set<String>> again = sumOneToAMillion(sc, 500);
    assertEquals(500_000_500_000L, again.getKey());
    assertTrue(again.getValue().stream().allMatch(id -> Integer.parseInt(id) > seen.size()),
        "the second job ran on " + again.getValue() + " after " + seen);
  }

  @Test
  void aStageWithItsOwnResourceProfileGetsItsOwnExecutors() throws Exception {
    // No pod-name prefix: Spark derives one from the application name.
    JavaSparkContext sc = start(conf("it-rp")
        .remove("spark.kubernetes.executor.podNamePrefix")
        .set("spark.dynamicAllocation.enabled", "true")
        .set("spark.dynamicAllocation.shuffleTracking.enabled", "true")
        .set("spark.dynamicAllocation.minExecutors", "0")
        .set("spark.dynamicAllocation.initialExecutors", "0")
        .set("spark.dynamicAllocation.maxExecutors", "2")
        .set("spark.dynamicAllocation.executorIdleTimeout", "60s")
        .set("spark.dynamicAllocation.schedulerBacklogTimeout", "1s"));
    String appId = sc.sc().applicationId();
    ResourceProfile profile = new ResourceProfileBuilder()
        .require(new ExecutorResourceRequests().cores(1).memory("512m"))
        .require(new TaskResourceRequests().cpus(1))
        .build();
    assertTrue(profile.id() != 0);

    List<String> ranOn = sc.parallelize(List.of(1, 2, 3, 4), 4)
        .withResources(profile)
        .map(i -> SparkEnv.get().executorId())
        .collect();

    String prefix = sc.getConf().get("spark.kubernetes.executor.podNamePrefix");
    assertTrue(prefix.startsWith("on-service-it-rp-"), prefix);
    List<Pod> pods = executorPods(appId);
    assertFalse(pods.isEmpty());
    Set<String> profileExecutors = new TreeSet<>();
    for (Pod pod : pods) {
      String id = pod.getMetadata().getLabels().get("spark-exec-id");
      assertEquals(prefix + "-exec-" + id, pod.getMetadata().getName());
      assertEquals(String.valueOf(profile.id()),
          pod.getMetadata().getLabels().get("spark-exec-resourceprofile-id"),
          pod.getMetadata().getName());
      profileExecutors.add(id);
    }
    assertTrue(profileExecutors.containsAll(ranOn), "tasks ran on " + ranOn
        + ", the profile's executors are " + profileExecutors);
  }

  /**
   * Spark's on-demand claims: the plugin sends the claims Spark's builder returns, the service
   * creates one per executor (bound by the simulator), each executor pod mounts its own, and
   * without a driver pod each claim is owned by its executor's pod.
   */
  @Test
  void aJobWithOnDemandClaimsGetsOneClaimPerExecutor() throws Exception {
    String pvc = "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.";
    JavaSparkContext sc = start(conf("it-pvc")
        .set("spark.executor.instances", "2")
        .set(pvc + "options.claimName", "OnDemand")
        .set(pvc + "options.storageClass", "standard")
        .set(pvc + "options.sizeLimit", "1Gi")
        .set(pvc + "mount.path", "/data")
        .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
    String appId = sc.sc().applicationId();
    await("2 registered executors", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).size() == 2);
    assertEquals(500_000_500_000L, sumOneToAMillion(sc, 0).getKey());
    List<Pod> pods = executorPods(appId);
    assertEquals(Set.of("it-pvc-exec-1", "it-pvc-exec-2"), names(pods));
    for (Pod pod : pods) {
      String name = pod.getMetadata().getName();
      String claimName = pod.getSpec().getVolumes().stream()
          .filter(v -> v.getPersistentVolumeClaim() != null)
          .map(v -> v.getPersistentVolumeClaim().getClaimName())
          .findFirst().orElse("");
      assertEquals(name + "-pvc-0", claimName);
      io.fabric8.kubernetes.api.model.PersistentVolumeClaim claim =
          k8s.persistentVolumeClaims().inNamespace("default").withName(claimName).get();
      assertEquals("Bound", claim.getStatus().getPhase());
      assertEquals("standard", claim.getSpec().getStorageClassName());
      assertEquals(appId, claim.getMetadata().getLabels().get("spark-app-selector"));
      assertEquals(name, claim.getMetadata().getOwnerReferences().get(0).getName());
    }
  }

  /**
   * With a driver pod (here a placeholder that only runs: the driver runs in the test's JVM),
   * the claims are the driver pod's, and a killed executor's replacement mounts
   * the lost executor's claim instead of a new one, as Spark's reusePersistentVolumeClaim does.
   */
  @Test
  void aKilledExecutorsClaimIsMountedByItsReplacement() throws Exception {
    k8s.pods().inNamespace("default").resource(driverPlaceholder("it-reuse-driver")).create();
    await("the driver pod running", Duration.ofSeconds(60), () -> "Running".equals(
        k8s.pods().inNamespace("default").withName("it-reuse-driver").get().getStatus()
            .getPhase()));
    String pvc = "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.";
    Map<String, Long> before = driverPodListsAndWatches();
    JavaSparkContext sc = start(conf("it-reuse")
        .set("spark.kubernetes.driver.pod.name", "it-reuse-driver")
        .set("spark.executor.instances", "2")
        .set(pvc + "options.claimName", "OnDemand")
        .set(pvc + "options.storageClass", "standard")
        .set(pvc + "options.sizeLimit", "1Gi")
        .set(pvc + "mount.path", "/data")
        .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
    String appId = sc.sc().applicationId();
    await("2 registered executors", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).size() == 2);
    // The wait for its own pod to be Ready (the plugin's, as Spark's allocator) reads the pod.
    assertEquals(Map.of(), driverPodListsAndWatchesSince(before),
        "the driver's own pod LISTs and watches, by verb");
    io.fabric8.kubernetes.api.model.PersistentVolumeClaim claim = k8s.persistentVolumeClaims()
        .inNamespace("default").withName("it-reuse-exec-1-pvc-0").get();
    assertEquals("it-reuse-driver", claim.getMetadata().getOwnerReferences().get(0).getName());

    JavaRDD<Integer> slices =
        sc.parallelize(IntStream.range(0, 8).boxed().collect(Collectors.toList()), 8);
    JavaFutureAction<List<Long>> job = slices.map(i -> {
      Thread.sleep(1_500);
      return LongStream.rangeClosed(i * 125_000L + 1, (i + 1) * 125_000L).sum();
    }).collectAsync();
    Thread.sleep(1_000); // the first tasks are running on both executors
    // Killed: removed at once (grace 0), so its claim is free when the replacement is created.
    // A graceful delete would leave the pod Terminating while its JVM shuts down, and a claim
    // still mounted by a pod is not reused (on the real control plane that window is wide).
    k8s.pods().inNamespace("default").withName("it-reuse-exec-1").withGracePeriod(0).delete();

    List<Long> parts = job.get(3, TimeUnit.MINUTES);
    assertEquals(500_000_500_000L, parts.stream().mapToLong(Long::longValue).sum());
    await("the replacement executor 3 registered", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).equals(Set.of("2", "3")));
    Pod replacement = k8s.pods().inNamespace("default").withName("it-reuse-exec-3").get();
    String mounted = replacement.getSpec().getVolumes().stream()
        .filter(v -> v.getPersistentVolumeClaim() != null)
        .map(v -> v.getPersistentVolumeClaim().getClaimName())
        .findFirst().orElse("");
    assertEquals("it-reuse-exec-1-pvc-0", mounted);
    assertEquals(null, k8s.persistentVolumeClaims().inNamespace("default")
        .withName("it-reuse-exec-3-pvc-0").get());
    assertEquals(2, k8s.persistentVolumeClaims().inNamespace("default")
        .withLabel("spark-app-selector", appId).list().getItems().size());

    // The driver pod owns the executors: deleting it makes the garbage collector delete them.
    Set<String> executors = names(executorPods(appId).stream()
        .filter(p -> p.getMetadata().getDeletionTimestamp() == null)
        .collect(Collectors.toList()));
    assertEquals(Set.of("it-reuse-exec-2", "it-reuse-exec-3"), executors);
    k8s.pods().inNamespace("default").withName("it-reuse-driver").delete();
    await("the driver's executor pods deleted by the garbage collector", Duration.ofSeconds(90),
        () -> executorPods(appId).isEmpty());
    assertDeletedByGarbageCollector(executors);
  }

  @Test
  void aKilledExecutorIsReplacedByANewIdAndTheJobCompletes() throws Exception {
    JavaSparkContext sc = start(conf("it-kill")
        .set("spark.executor.instances", "2")
        .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
    String appId = sc.sc().applicationId();
    await("2 registered executors", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).size() == 2);

    JavaRDD<Integer> slices =
        sc.parallelize(IntStream.range(0, 8).boxed().collect(Collectors.toList()), 8);
    JavaFutureAction<List<Long>> job = slices.map(i -> {
      Thread.sleep(1_500);
      return LongStream.rangeClosed(i * 125_000L + 1, (i + 1) * 125_000L).sum();
    }).collectAsync();
    Thread.sleep(1_000); // the first tasks are running on both executors

    k8s.pods().inNamespace("default").withName("it-kill-exec-1").delete();

    List<Long> parts = job.get(3, TimeUnit.MINUTES);
    assertEquals(500_000_500_000L, parts.stream().mapToLong(Long::longValue).sum());
    await("the replacement executor 3 registered", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).equals(Set.of("2", "3")));
    Supplier<Set<String>> podNames = () -> names(executorPods(appId));
    await("pods exec-2 and exec-3 only", Duration.ofSeconds(60),
        () -> podNames.get().equals(Set.of("it-kill-exec-2", "it-kill-exec-3")));
    List<String> ids = new ArrayList<>(registeredExecutors(sc));
    assertFalse(ids.contains("1"));
  }

  @Test
  void aRestartedServiceGetsTheApplicationBackAndReplacesALostExecutor() throws Exception {
    int grpc = ServiceProcess.freePort();
    Path dir = Files.createDirectories(work.resolve("restart"));
    // A cluster that outlives the services started against it (and its executor processes).
    try (StandaloneCluster cluster = standaloneCluster(dir)) {
      KubernetesClient k8s = cluster.client();
      ServiceProcess first = cluster.serve(dir, grpc);
      JavaSparkContext sc;
      try {
        sc = start(cluster.onCluster(baseConf("it-restart", grpc))
            .set("spark.executor.instances", "2")
            .set("spark.kubernetes.allocation.service.checkInterval", "1s")
            .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
        await("2 registered executors", Duration.ofSeconds(120),
            () -> registeredExecutors(sc).size() == 2);
      } finally {
        first.close();
      }

      try (ServiceProcess restarted = cluster.serve(dir, grpc)) {
        // The executors ran on while the service was away; the new service resumed the
        // application from its registration, the last target included.
        Thread.sleep(3_000);
        assertEquals(Set.of("1", "2"), registeredExecutors(sc));
        k8s.pods().inNamespace("default").withName("it-restart-exec-1").delete();
        await("executor 3 replacing the deleted executor 1", Duration.ofSeconds(120),
            () -> registeredExecutors(sc).equals(Set.of("2", "3")));
        assertEquals(500_000_500_000L, sumOneToAMillion(sc, 0).getKey(), restarted.log());
        String appId = sc.sc().applicationId();
        sc.stop();
        this.sc = null;
        List<Pod> left = k8s.pods().inNamespace("default")
            .withLabel("spark-app-selector", appId).list().getItems();
        assertTrue(left.isEmpty() || left.stream().allMatch(
            p -> p.getMetadata().getDeletionTimestamp() != null), String.valueOf(left));
      }
    }
  }

  /**
   * A driver with the plugin's required settings only (and Spark's defaults for its own pod
   * watch and polling): the plugin turns Spark's own sources off, so the driver makes no pod
   * watch and no pod LIST, and learns of a failed executor from the service's stream alone.
   * A fixed number of executors: Spark's only other pod LIST, after it removes executors
   * (dynamic allocation), has no cause here.
   */
  @Test
  void withThePluginsDefaultsTheDriverNeitherWatchesNorListsPodsAndLearnsOfAFailedExecutor()
      throws Exception {
    Map<String, Long> before = driverPodListsAndWatches();
    JavaSparkContext sc = start(conf("it-events")
        // Not a switch: Spark's first LIST would come 30 s after start, past this test's end,
        // so its polling, were it on, shows within the test.
        .set("spark.kubernetes.executor.apiPollingInterval", "1s")
        .set("spark.executor.instances", "2")
        .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
    String appId = sc.sc().applicationId();
    await("2 registered executors", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).equals(Set.of("1", "2")));

    // The pod fails in Kubernetes while its process still answers the driver: only the pod's
    // state, which the driver now gets from the service alone, tells Spark the executor is lost.
    k8s.pods().inNamespace("default").withName("it-events-exec-1").editStatus(pod -> {
      pod.getStatus().setPhase("Failed");
      pod.getStatus().setContainerStatuses(List.of(
          new io.fabric8.kubernetes.api.model.ContainerStatusBuilder()
              .withName("spark-kubernetes-executor").withImage(IMAGE).withImageID("")
              .withReady(false).withRestartCount(0)
              .withNewState().withNewTerminated().withExitCode(137).withReason("OOMKilled")
              .endTerminated().endState().build()));
      return pod;
    });
    await("Spark removing executor 1 and executor 3 replacing it", Duration.ofSeconds(120),
        () -> registeredExecutors(sc).equals(Set.of("2", "3")));
    assertEquals(500_000_500_000L, sumOneToAMillion(sc, 0).getKey());
    await("pods exec-2 and exec-3 only", Duration.ofSeconds(60),
        () -> names(executorPods(appId)).equals(Set.of("it-events-exec-2", "it-events-exec-3")));
    assertEquals(Map.of(), driverPodListsAndWatchesSince(before),
        "the driver's own pod LISTs and watches, by verb");
  }
}
