package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.utils.Serialization;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
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
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A real Spark driver (client mode, in this JVM, the plugin from the shaded jar) on the
 * service's simulated cluster, whose kubelet runs each executor pod as a local {@code java}
 * process with this JVM's class path. Spark itself talks to the simulated API server (its pod
 * watch, the lifecycle manager, killing executors); the executor pods come from the service.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(value = 3, unit = TimeUnit.MINUTES)
class SparkOnServiceIT {
  /** The executor image the simulated kubelet runs as a process. */
  static final String IMAGE = "spark-pod-allocator/spark-executor:it";

  /** Kept after the run under target/ (the service's log, each executor pod's log). */
  private Path work;

  private ServiceProcess service;
  private int grpcPort;
  private int apiPort;
  private KubernetesClient k8s;
  private JavaSparkContext sc;

  @BeforeAll
  void startService() throws Exception {
    work = Files.createDirectories(Path.of("target", "spark-it")).toAbsolutePath();
    work = Files.createTempDirectory(work, "run-");
    grpcPort = ServiceProcess.freePort();
    apiPort = ServiceProcess.freePort();
    Path config = work.resolve("service.toml");
    Files.writeString(config, SimulatorProcessRuntime.config(grpcPort, apiPort, IMAGE, work),
        StandardCharsets.UTF_8);
    service = ServiceProcess.start(work, Map.of(), grpcPort,
        "--config", config.toString(), "serve", "--simulate");
    k8s = new KubernetesClientBuilder()
        .withConfig(new ConfigBuilder().withMasterUrl("http://127.0.0.1:" + apiPort)
            .withUserAgent(TEST_USER_AGENT).build())
        .build();
  }

  /** The test's own Kubernetes client, told apart from the driver's in the request counts. */
  static final String TEST_USER_AGENT = "spark-on-service-it";

  /**
   * Pod LISTs and watches the driver made so far, as the simulator counted them: requests of
   * a fabric8 client (the driver's), not the test's own client.
   */
  private long driverPodListsAndWatches() throws Exception {
    long count = 0;
    for (Map<?, ?> r : simRequests()) {
      String agent = String.valueOf(r.get("userAgent"));
      if (agent.startsWith("fabric8") && "pods".equals(r.get("resource"))
          && ("list".equals(r.get("verb")) || "watch".equals(r.get("verb")))) {
        count += ((Number) r.get("count")).longValue();
      }
    }
    return count;
  }

  /** Executor pods created so far by any client, as the simulator counted them. */
  private long podCreates() throws Exception {
    long count = 0;
    for (Map<?, ?> r : simRequests()) {
      if ("pods".equals(r.get("resource")) && "create".equals(r.get("verb"))) {
        count += ((Number) r.get("count")).longValue();
      }
    }
    return count;
  }

  /** Sets the simulated API server's injected faults (JSON of its fault settings). */
  private void putFaults(String json) throws Exception {
    HttpResponse<String> response = HttpClient.newHttpClient().send(
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + apiPort + "/sim/faults"))
            .header("Content-Type", "application/json")
            .PUT(HttpRequest.BodyPublishers.ofString(json))
            .build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(200, response.statusCode(), response.body());
  }

  /** The simulator's request counts, by (User-Agent, verb, resource). */
  private List<Map<?, ?>> simRequests() throws Exception {
    HttpResponse<String> response = HttpClient.newHttpClient().send(
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + apiPort + "/sim/requests"))
            .build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(200, response.statusCode(), response.body());
    Map<?, ?> body = Serialization.unmarshal(response.body(), Map.class);
    List<Map<?, ?>> rows = new ArrayList<>();
    for (Object row : (List<?>) body.get("requests")) {
      rows.add((Map<?, ?>) row);
    }
    return rows;
  }

  @AfterEach
  void stopSpark() {
    if (sc != null) {
      sc.stop();
      sc = null;
    }
  }

  @AfterAll
  void stopService() throws Exception {
    if (k8s != null) {
      k8s.close();
    }
    if (service != null) {
      service.close();
    }
  }

  /** The driver's settings shared by every scenario; {@code prefix} names its executor pods. */
  private SparkConf conf(String prefix) {
    return conf(prefix, apiPort, grpcPort);
  }

  private SparkConf conf(String prefix, int apiPort, int grpcPort) {
    return new SparkConf(false)
        .setMaster("k8s://http://127.0.0.1:" + apiPort)
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

  private JavaSparkContext start(SparkConf conf) {
    sc = new JavaSparkContext(conf);
    return sc;
  }

  private List<Pod> executorPods(String appId) {
    return k8s.pods().inNamespace("default")
        .withLabel("spark-app-selector", appId)
        .withLabel("spark-role", "executor")
        .list().getItems();
  }

  private static Set<String> names(List<Pod> pods) {
    return pods.stream()
        .map(p -> p.getMetadata().getName())
        .collect(Collectors.toCollection(TreeSet::new));
  }

  private static Set<String> registeredExecutors(JavaSparkContext sc) {
    return new TreeSet<>(CollectionConverters.asJava(sc.sc().getExecutorIds()));
  }

  private void await(String what, Duration timeout, BooleanSupplier done)
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

  private static String tail(String text, int chars) {
    return text.length() <= chars ? text : text.substring(text.length() - chars);
  }

  /** The sum of 1..1e6 computed in 8 partitions, and which executors computed it. */
  private static Map.Entry<Long, Set<String>> sumOneToAMillion(JavaSparkContext sc, long sleepMs) {
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

  /**
   * Issue 19, point 9: SparkContext.stop() asks the executors to exit before it calls the
   * allocator's stop; the service, still holding the old target, used to create replacements
   * for the exited executors in between. Ten short applications of 2 executors each, one after
   * the other in this driver: no pod may be created from the moment stop() begins.
   */
  @Test
  @Timeout(value = 8, unit = TimeUnit.MINUTES) // 10 applications: ~45 s, minutes when loaded
  void aStoppingDriverGetsNoNewExecutorPods() throws Exception {
    List<String> runsWithCreates = new ArrayList<>();
    for (int run = 1; run <= 10; run++) {
      String prefix = "it-end-" + run;
      JavaSparkContext sc = start(conf(prefix)
          .set("spark.executor.instances", "2")
          // The context waits for both executors, so no create is in flight at the stop.
          .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
          .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
      String appId = sc.sc().applicationId();
      assertEquals(Set.of("1", "2"), registeredExecutors(sc));
      assertEquals(8L, sc.parallelize(List.of(1, 2, 3, 4, 5, 6, 7, 8), 8).count());
      await(prefix + ": exec-1 and exec-2 running", Duration.ofSeconds(30),
          () -> executorPods(appId).stream()
              .filter(p -> "Running".equals(p.getStatus().getPhase())).count() == 2);

      // An API server answering in 200 ms, as a busy one does: Spark's own requests during
      // its stop (deleting the driver's services and claims) then take as long as they would.
      putFaults("{\"latency_ms\": 200}");
      long before = podCreates();
      try {
        sc.stop();
      } finally {
        this.sc = null;
        putFaults("{}");
      }
      long created = podCreates() - before;
      if (created != 0) {
        runsWithCreates.add("run " + run + ": " + created + " pods created");
      }
      await(prefix + ": executor pods deleted by Stop", Duration.ofSeconds(60),
          () -> executorPods(appId).isEmpty());
    }
    assertEquals(List.of(), runsWithCreates,
        "executor pods created after SparkContext.stop() began");
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
    Pod driver = new io.fabric8.kubernetes.api.model.PodBuilder()
        .withNewMetadata().withName("it-reuse-driver").endMetadata()
        .withNewSpec()
        .addNewContainer().withName("driver")
        .withImage(SimulatorProcessRuntime.DRIVER_PLACEHOLDER_IMAGE).endContainer()
        .endSpec()
        .build();
    k8s.pods().inNamespace("default").resource(driver).create();
    String pvc = "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.";
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
    k8s.pods().inNamespace("default").withName("it-reuse-exec-1").delete();

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
    // The cluster on its own, so that it (and the executor processes) outlive the service.
    int api = ServiceProcess.freePort();
    int grpc = ServiceProcess.freePort();
    Path dir = Files.createDirectories(work.resolve("restart"));
    Path clusterConfig = dir.resolve("cluster.toml");
    Files.writeString(clusterConfig, SimulatorProcessRuntime.simulatorConfig(api, IMAGE, dir),
        StandardCharsets.UTF_8);
    Path kubeconfig = dir.resolve("kubeconfig");
    Map<String, String> serveEnv = Map.of(
        "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
        "SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig.toString());
    try (ServiceProcess cluster = ServiceProcess.start(dir, Map.of(), api, "--config",
            clusterConfig.toString(), "simulate", "--listen", "127.0.0.1:" + api,
            "--kubeconfig", kubeconfig.toString());
        KubernetesClient k8s = new KubernetesClientBuilder()
            .withConfig(new ConfigBuilder().withMasterUrl("http://127.0.0.1:" + api).build())
            .build()) {
      ServiceProcess first = ServiceProcess.start(dir, serveEnv, grpc, "serve");
      JavaSparkContext sc;
      try {
        sc = start(conf("it-restart", api, grpc)
            .set("spark.executor.instances", "2")
            .set("spark.kubernetes.allocation.service.checkInterval", "1s")
            .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s"));
        await("2 registered executors", Duration.ofSeconds(120),
            () -> registeredExecutors(sc).size() == 2);
      } finally {
        first.close();
      }

      try (ServiceProcess restarted = ServiceProcess.start(dir, serveEnv, grpc, "serve")) {
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
            p -> p.getMetadata().getDeletionTimestamp() != null), cluster.log());
      }
    }
  }

  @Test
  void withoutItsOwnPodWatchOrPollingTheDriverLearnsOfAFailedExecutorFromTheService()
      throws Exception {
    long before = driverPodListsAndWatches();
    JavaSparkContext sc = start(conf("it-events")
        .set("spark.kubernetes.executor.enableApiWatcher", "false")
        .set("spark.kubernetes.executor.enableApiPolling", "false")
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
    assertEquals(0, driverPodListsAndWatches() - before,
        "the driver listed or watched pods itself");
  }
}
