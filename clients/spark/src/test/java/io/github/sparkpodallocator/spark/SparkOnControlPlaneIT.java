package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.NamespaceBuilder;
import io.fabric8.kubernetes.api.model.Node;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.api.model.storage.StorageClassBuilder;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import spark.allocator.v1.Allocator.AllocationSettings;
import spark.allocator.v1.Allocator.StartRequest;

/**
 * The Spark job ({@link SparkScenarios}) on the real control plane: the test API server
 * (kube-apiserver over etcd, with kube-scheduler, kube-controller-manager and a kwok node;
 * docs/real-apiserver.md) and a process node ({@code spark-pod-allocator process-node},
 * docs/process-runtime.md) that runs the pods the scheduler binds to it as local processes.
 * The executors select the process node; the placeholder driver pods select the kwok node.
 * The driver reaches the API server over HTTPS with the admin's token; the service runs as
 * {@code serve} with the admin's kubeconfig.
 */
class SparkOnControlPlaneIT extends SparkScenarios {
  /** The process node's name (and its {@code kubernetes.io/hostname} label). */
  static final String PROCESS_NODE = "process-node";

  /** The provisioner of the process node's StorageClasses (crates/sim/src/node.rs). */
  static final String PROVISIONER = "spark-pod-allocator.test/process-node";

  private TestApiServer api;
  private ServiceProcess node;
  /** The class's service's Prometheus endpoint. */
  private int metricsPort;

  @BeforeAll
  void startControlPlane() throws Exception {
    work = Files.createDirectories(Path.of("target", "spark-it")).toAbsolutePath();
    work = Files.createTempDirectory(work, "control-plane-");
    // One kwok node for the placeholder driver pods; the executors go to the process node.
    api = TestApiServer.start(work.resolve("apiserver"), "--kwok-nodes", "1");
    k8s = new KubernetesClientBuilder()
        .withConfig(new ConfigBuilder().withMasterUrl(api.url)
            .withCaCertFile(api.caCert().toString())
            .withOauthToken(api.adminToken)
            .withUserAgent(TEST_USER_AGENT).build())
        .build();
    // Spark's OnDemand claims ask for class "standard": here it is the process node's
    // provisioner, binding each claim when the scheduler picks the node for its pod.
    k8s.storage().v1().storageClasses().resource(new StorageClassBuilder()
        .withNewMetadata().withName("standard").endMetadata()
        .withProvisioner(PROVISIONER)
        .withVolumeBindingMode("WaitForFirstConsumer")
        .withReclaimPolicy("Delete")
        .build()).create();

    Path nodeConfig = work.resolve("node.toml");
    Files.writeString(nodeConfig, SimulatorProcessRuntime.simulatorConfig(0, IMAGE, work),
        StandardCharsets.UTF_8);
    node = ServiceProcess.launch(work, Map.of(
            "SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", api.kubeconfig().toString()),
        "--config", nodeConfig.toString(), "process-node", "--node", PROCESS_NODE);
    await("the process node Ready", Duration.ofSeconds(60), () -> {
      Node n = k8s.nodes().withName(PROCESS_NODE).get();
      return n != null && n.getStatus() != null && n.getStatus().getConditions() != null
          && n.getStatus().getConditions().stream().anyMatch(
              c -> "Ready".equals(c.getType()) && "True".equals(c.getStatus()))
          && (n.getSpec().getTaints() == null || n.getSpec().getTaints().isEmpty());
    });

    grpcPort = ServiceProcess.freePort();
    metricsPort = ServiceProcess.freePort();
    Path serviceConfig = work.resolve("service.yaml");
    Files.writeString(serviceConfig, "metrics:\n  listen: \"127.0.0.1:" + metricsPort + "\"\n"
        + RECLAIM_BUDGETS, StandardCharsets.UTF_8);
    service = ServiceProcess.start(work, serveEnv(grpcPort), grpcPort,
        "--config", serviceConfig.toString(), "serve");
  }

  /**
   * The budgets of the reclaim scenario, one queue per way of reclaiming: 4 executors, 2
   * guaranteed to each of its two namespaces (a borrower's and an owner's). The other
   * scenarios run in {@code default}, under no budget.
   */
  static final String RECLAIM_BUDGETS = String.join("\n",
      "budgets:",
      "- queue: reclaim-graceful",
      "  max_executors: 4",
      "  reclaim_deadline_ms: " + ReclaimScenario.GRACEFUL_DEADLINE_MS,
      "  namespaces:",
      "  - namespace: reclaim-graceful-borrower",
      "    guaranteed_executors: 2",
      "  - namespace: reclaim-graceful-owner",
      "    guaranteed_executors: 2",
      "- queue: reclaim-kill",
      "  max_executors: 4",
      "  reclaim_deadline_ms: 0",
      "  namespaces:",
      "  - namespace: reclaim-kill-borrower",
      "    guaranteed_executors: 2",
      "  - namespace: reclaim-kill-owner",
      "    guaranteed_executors: 2",
      "");

  /**
   * Issue 41's proof: a borrower holds a whole budget with a shuffle-heavy job when the
   * budget's owner arrives wanting its guaranteed part. Run twice, graceful (the service
   * asks the borrower's driver, which decommissions the executors through Spark: their
   * blocks migrate) and kill-style (the pods deleted at once, as a scheduler's preemption).
   * Goals, asserted for the graceful run: the owner's executors run within the deadline plus
   * pod start, the borrower's job fails no task, runs no stage again, and its result is
   * right. Both runs' figures are printed ({@code -Dreclaim.runs=N} repeats the pair).
   */
  @Test
  @Timeout(value = 15, unit = TimeUnit.MINUTES)
  void aBorrowerGivesExecutorsBackGracefullyWhereAKillMakesItComputeAgain() throws Exception {
    for (String mode : List.of("graceful", "kill")) {
      for (String role : List.of("borrower", "owner")) {
        String ns = "reclaim-" + mode + "-" + role;
        k8s.namespaces().resource(new NamespaceBuilder().withNewMetadata().withName(ns)
            .endMetadata().build()).create();
        await("the service account of " + ns, Duration.ofSeconds(60),
            () -> k8s.serviceAccounts().inNamespace(ns).withName("default").get() != null);
      }
    }
    int runs = Integer.getInteger("reclaim.runs", 1);
    List<ReclaimScenario.Figures> figures = new ArrayList<>();
    for (int run = 1; run <= runs; run++) {
      figures.add(reclaimRun("graceful", ReclaimScenario.GRACEFUL_DEADLINE_MS, run));
      figures.add(reclaimRun("kill", 0, run));
    }
    System.out.println("\n--- reclaim on the control plane (Spark "
        + org.apache.spark.package$.MODULE$.SPARK_VERSION() + ") ---");
    figures.forEach(f -> System.out.println(f.line()));
    for (ReclaimScenario.Figures f : figures) {
      assertTrue(f.resultRight(), f.line());
      if (f.mode().equals("graceful")) {
        assertTrue(f.ownerRunningMs() < f.deadlineMs() + POD_START.toMillis(), f.line());
        assertEquals(0, f.tasksFailed(), f.line());
        assertEquals(0, f.stageAttemptsRerun(), f.line());
        assertEquals(2, f.exitedOnTheirOwn().size(), f.line());
        assertEquals(2, f.reclaimsGraceful(), f.line());
        assertEquals(0, f.reclaimsForced(), f.line());
      }
    }
  }

  /** What a pod's start may take here, beyond the reclaim (scheduling, the node's start). */
  static final Duration POD_START = Duration.ofSeconds(30);

  /**
   * One borrower and one owner under the {@code mode} queue: the borrower's Spark driver
   * takes the 4 executors and runs jobs A, B and C ({@link ReclaimScenario}); as job B's
   * tasks run, the owner (a client of the service, as a driver would be; its pods run on
   * the kwok node) asks for its 2.
   */
  private ReclaimScenario.Figures reclaimRun(String mode, long deadlineMs, int run)
      throws Exception {
    String borrowerNs = "reclaim-" + mode + "-borrower";
    String ownerNs = "reclaim-" + mode + "-owner";
    SparkConf borrowerConf = conf("rc-" + mode + "-" + run)
        .set("spark.kubernetes.namespace", borrowerNs)
        // Each executor a host of its own, as on a cluster (see the image).
        .set("spark.kubernetes.container.image", SimulatorProcessRuntime.IMAGE_HOST_PER_EXECUTOR)
        .set("spark.executor.instances", "4")
        .set("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .set("spark.scheduler.maxRegisteredResourcesWaitingTime", "180s");
    ReclaimScenario.GRACEFUL_CONFS.forEach(borrowerConf::set);
    JavaSparkContext sc = start(borrowerConf);
    String borrowerApp = sc.sc().applicationId();
    ReclaimScenario.Observed observed = new ReclaimScenario.Observed();
    sc.sc().addSparkListener(observed);
    await("4 registered executors", Duration.ofSeconds(180),
        () -> registeredExecutors(sc).size() == 4);

    JavaPairRDD<Long, Long> sums = ReclaimScenario.sumsByKey(sc);
    observed.armed = true;
    long jobsStarted = System.nanoTime();
    CompletableFuture<Map<Long, Long>> jobB =
        CompletableFuture.supplyAsync(() -> ReclaimScenario.sumsByLastDigits(sums));
    assertTrue(observed.jobBRunning.await(60, TimeUnit.SECONDS), "job B's tasks started");

    String queue = "reclaim-" + mode;
    long gracefulBefore = reclaimsCompleted(queue, "graceful");
    long forcedBefore = reclaimsCompleted(queue, "forced");
    String ownerApp = "reclaim-owner-" + mode + "-" + run;
    long ownerRunningMs;
    ServiceSettings settings = ServiceSettings.fromConf(new SparkConf(false)
        .set(ServiceSettings.ADDRESS, "127.0.0.1:" + grpcPort)
        .set(ServiceSettings.TOKEN_FILE, ""), Path.of("/nonexistent"));
    Map<Long, Long> byLastDigits;
    long total;
    long jobsMs;
    try (AllocatorClient owner = new AllocatorClient(settings)) {
      long ownerStarted = System.nanoTime();
      owner.start(StartRequest.newBuilder()
          .setApplicationId(ownerApp)
          .setNamespace(ownerNs)
          .setExecutorPodTemplate(OWNER_EXECUTOR_POD)
          .setPodNamePrefix("owner-" + mode + "-" + run)
          .setSettings(AllocationSettings.newBuilder().setBatchDelayMs(200))
          .build());
      owner.setTotalExpected(Map.of(0, 2), Map.of());
      await("the owner's 2 executors Running", Duration.ofMillis(deadlineMs).plus(POD_START)
          .plus(Duration.ofSeconds(60)), () -> runningPods(ownerNs, ownerApp) == 2);
      ownerRunningMs = (System.nanoTime() - ownerStarted) / 1_000_000;

      byLastDigits = jobB.get(5, TimeUnit.MINUTES);
      total = ReclaimScenario.total(sums);
      jobsMs = (System.nanoTime() - jobsStarted) / 1_000_000;
      sc.sc().listenerBus().waitUntilEmpty();
      // The borrower first: with the owner gone first, it would get its 4 executors back.
      sc.stop();
      this.sc = null;
      owner.stop();
    }
    await("the borrower's and the owner's pods gone", Duration.ofSeconds(120),
        () -> k8s.pods().inNamespace(borrowerNs).withLabel("spark-app-selector", borrowerApp)
            .list().getItems().isEmpty()
            && k8s.pods().inNamespace(ownerNs).list().getItems().isEmpty());
    boolean right = byLastDigits.equals(ReclaimScenario.expectedByLastDigits())
        && total == ReclaimScenario.EXPECTED_TOTAL;
    ReclaimScenario.Figures figures = new ReclaimScenario.Figures(mode, deadlineMs,
        ownerRunningMs, observed.tasksFailed.get(), observed.stageAttemptsRerun.get(),
        observed.exitedOnTheirOwn(), new TreeSet<>(observed.failures), right, jobsMs,
        reclaimsCompleted(queue, "graceful") - gracefulBefore,
        reclaimsCompleted(queue, "forced") - forcedBefore);
    System.out.println(figures.line());
    return figures;
  }

  /**
   * The service's {@code reclaims_completed} counter of budget {@code queue/<queue>} with
   * this outcome ({@code graceful}, {@code forced}); 0 before its first reclaim.
   */
  private long reclaimsCompleted(String queue, String outcome) throws Exception {
    String labels = "{budget=\"queue/" + queue + "\",outcome=\"" + outcome + "\"}";
    HttpResponse<String> metrics = HttpClient.newHttpClient().send(
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + metricsPort + "/metrics"))
            .timeout(Duration.ofSeconds(10)).build(),
        HttpResponse.BodyHandlers.ofString());
    for (String line : metrics.body().split("\n")) {
      if (line.startsWith("spark_pod_allocator_reclaims_completed_total" + labels + " ")) {
        return Long.parseLong(line.substring(line.lastIndexOf(' ') + 1).trim());
      }
    }
    return 0;
  }

  private long runningPods(String namespace, String appId) {
    return k8s.pods().inNamespace(namespace).withLabel("spark-app-selector", appId).list()
        .getItems().stream()
        .filter(p -> p.getMetadata().getDeletionTimestamp() == null
            && p.getStatus() != null && "Running".equals(p.getStatus().getPhase()))
        .count();
  }

  /** The owner's executor pod: on the kwok node, which keeps it Running (nothing runs). */
  static final String OWNER_EXECUTOR_POD = "{\"apiVersion\":\"v1\",\"kind\":\"Pod\","
      + "\"metadata\":{},\"spec\":{\"nodeSelector\":{\"type\":\"kwok\"},"
      + "\"containers\":[{\"name\":\"spark-kubernetes-executor\","
      + "\"image\":\"spark-pod-allocator/owner:it\"}]}}";

  /** {@code serve} on the API server with the admin's kubeconfig. */
  private Map<String, String> serveEnv(int grpcPort) {
    Map<String, String> env = new HashMap<>();
    env.put("SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpcPort);
    env.put("SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", api.kubeconfig().toString());
    return env;
  }

  @Override
  void await(String what, Duration timeout, java.util.function.BooleanSupplier done)
      throws InterruptedException {
    try {
      super.await(what, timeout, done);
    } catch (AssertionError e) {
      String nodeLog = node == null ? "" : node.log();
      throw new AssertionError(e.getMessage() + "\n--- process node log (last 4000 chars) ---\n"
          + tail(nodeLog, 4000) + "\n(the API server's logs and audit log under " + api.dir
          + ")", e);
    }
  }

  @AfterAll
  void stopControlPlane() {
    if (k8s != null) {
      k8s.close();
    }
    if (service != null) {
      service.close();
    }
    if (node != null) {
      node.close();
    }
    if (api != null) {
      api.close();
    }
  }

  @Override
  SparkConf onCluster(SparkConf conf) {
    return conf.setMaster("k8s://" + api.url)
        // Client mode reads the driver's credentials under this prefix.
        .set("spark.kubernetes.authenticate.caCertFile", api.caCert().toString())
        .set("spark.kubernetes.authenticate.oauthToken", api.adminToken)
        .set("spark.kubernetes.executor.node.selector.kubernetes.io/hostname", PROCESS_NODE);
  }

  /** A pod on the kwok node: kwok keeps it Running; nothing runs it as a process. */
  @Override
  Pod driverPlaceholder(String name) {
    return new PodBuilder()
        .withNewMetadata().withName(name).endMetadata()
        .withNewSpec()
        .addToNodeSelector("type", "kwok")
        .addNewContainer().withName("driver")
        .withImage(SimulatorProcessRuntime.DRIVER_PLACEHOLDER_IMAGE).endContainer()
        .endSpec()
        .build();
  }

  /**
   * The driver's pod LISTs and watches from the audit log. Every client here holds the admin's
   * token, so the driver is told apart by its user agent: Spark's fabric8 client (the
   * plugin's calls included) sends fabric8's own, the test's client {@link #TEST_USER_AGENT},
   * the service and the process node kube-rs's. Each request is counted once (a watch has
   * several stages, one audit event each).
   */
  @Override
  Map<String, Long> driverPodListsAndWatches() throws Exception {
    Map<String, Set<String>> requests = new TreeMap<>();
    for (Map<?, ?> event : api.auditEvents()) {
      String agent = String.valueOf(event.get("userAgent"));
      Object ref = event.get("objectRef");
      String verb = String.valueOf(event.get("verb"));
      if (agent.startsWith("fabric8") && ref instanceof Map<?, ?> objectRef
          && "pods".equals(objectRef.get("resource")) && objectRef.get("subresource") == null
          && ("list".equals(verb) || "watch".equals(verb))) {
        requests.computeIfAbsent(verb, v -> new HashSet<>())
            .add(String.valueOf(event.get("auditID")));
      }
    }
    Map<String, Long> byVerb = new TreeMap<>();
    requests.forEach((verb, ids) -> byVerb.put(verb, (long) ids.size()));
    return byVerb;
  }

  /** Each pod's delete in the audit log was the garbage collector's. */
  @Override
  void assertDeletedByGarbageCollector(Set<String> pods) throws Exception {
    Set<String> deletedByCollector = new TreeSet<>();
    for (Map<?, ?> event : api.auditEvents()) {
      Object ref = event.get("objectRef");
      Object user = event.get("user");
      if ("delete".equals(event.get("verb")) && ref instanceof Map<?, ?> objectRef
          && "pods".equals(objectRef.get("resource")) && user instanceof Map<?, ?> u
          && String.valueOf(u.get("username")).endsWith(":generic-garbage-collector")) {
        deletedByCollector.add(String.valueOf(objectRef.get("name")));
      }
    }
    Set<String> missing = new TreeSet<>(pods);
    missing.removeAll(deletedByCollector);
    assertEquals(Set.of(), missing, "pods the garbage collector did not delete (it deleted "
        + deletedByCollector + ")");
  }

  /**
   * The same API server and process node: they outlive the services. The restart scenario's
   * services keep their registrations and shard Lease in a namespace of their own, so they
   * never contend with the class's service for a Lease.
   */
  @Override
  StandaloneCluster standaloneCluster(Path dir) throws Exception {
    String namespace = "it-restart-service";
    if (k8s.namespaces().withName(namespace).get() == null) {
      k8s.namespaces().resource(new NamespaceBuilder().withNewMetadata().withName(namespace)
          .endMetadata().build()).create();
    }
    return new StandaloneCluster() {
      @Override
      public KubernetesClient client() {
        return k8s;
      }

      @Override
      public SparkConf onCluster(SparkConf conf) {
        return SparkOnControlPlaneIT.this.onCluster(conf);
      }

      @Override
      public ServiceProcess serve(Path dir, int grpcPort) throws Exception {
        Map<String, String> env = serveEnv(grpcPort);
        env.put("SPARK_POD_ALLOCATOR__REGISTRATIONS__NAMESPACE", namespace);
        env.put("POD_NAME", "it-restart-service");
        return ServiceProcess.start(dir, env, grpcPort, "serve");
      }

      @Override
      public void close() {}
    };
  }
}
