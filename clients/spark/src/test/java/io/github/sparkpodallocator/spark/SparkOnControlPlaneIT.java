package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.fabric8.kubernetes.api.model.NamespaceBuilder;
import io.fabric8.kubernetes.api.model.Node;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.api.model.storage.StorageClassBuilder;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;

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
    service = ServiceProcess.start(work, serveEnv(grpcPort), grpcPort, "serve");
  }

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
