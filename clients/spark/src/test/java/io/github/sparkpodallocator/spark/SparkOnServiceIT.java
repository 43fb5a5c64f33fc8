package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

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
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The Spark job ({@link SparkScenarios}) on the service's simulated cluster
 * ({@code serve --simulate}), whose kubelet runs each executor pod as a local {@code java}
 * process; plus what only the simulator can do: injected API latency and its request counts.
 */
class SparkOnServiceIT extends SparkScenarios {
  private int apiPort;

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
    k8s = client(apiPort);
  }

  private static KubernetesClient client(int apiPort) {
    return new KubernetesClientBuilder()
        .withConfig(new ConfigBuilder().withMasterUrl("http://127.0.0.1:" + apiPort)
            .withUserAgent(TEST_USER_AGENT).build())
        .build();
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

  @Override
  SparkConf onCluster(SparkConf conf) {
    return conf.setMaster("k8s://http://127.0.0.1:" + apiPort);
  }

  @Override
  Pod driverPlaceholder(String name) {
    return new io.fabric8.kubernetes.api.model.PodBuilder()
        .withNewMetadata().withName(name).endMetadata()
        .withNewSpec()
        .addNewContainer().withName("driver")
        .withImage(SimulatorProcessRuntime.DRIVER_PLACEHOLDER_IMAGE).endContainer()
        .endSpec()
        .build();
  }

  /** The simulator's garbage collector has no audit trail: the pods' disappearance is all. */
  @Override
  void assertDeletedByGarbageCollector(Set<String> pods) {}

  /** A simulated cluster on its own ({@code simulate}), apart from the services. */
  @Override
  StandaloneCluster standaloneCluster(Path dir) throws Exception {
    int api = ServiceProcess.freePort();
    Path clusterConfig = dir.resolve("cluster.toml");
    Files.writeString(clusterConfig, SimulatorProcessRuntime.simulatorConfig(api, IMAGE, dir),
        StandardCharsets.UTF_8);
    Path kubeconfig = dir.resolve("kubeconfig");
    ServiceProcess cluster = ServiceProcess.start(dir, Map.of(), api, "--config",
        clusterConfig.toString(), "simulate", "--listen", "127.0.0.1:" + api,
        "--kubeconfig", kubeconfig.toString());
    KubernetesClient client = client(api);
    return new StandaloneCluster() {
      @Override
      public KubernetesClient client() {
        return client;
      }

      @Override
      public SparkConf onCluster(SparkConf conf) {
        return conf.setMaster("k8s://http://127.0.0.1:" + api);
      }

      @Override
      public ServiceProcess serve(Path dir, int grpcPort) throws Exception {
        return ServiceProcess.start(dir, Map.of(
            "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpcPort,
            "SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig.toString()),
            grpcPort, "serve");
      }

      @Override
      public void close() {
        client.close();
        cluster.close();
      }
    };
  }

  /**
   * Pod LISTs and watches the driver made so far, as the simulator counted them: requests of
   * a fabric8 client (the driver's), not the test's own client.
   */
  @Override
  Map<String, Long> driverPodListsAndWatches() throws Exception {
    Map<String, Long> byVerb = new java.util.TreeMap<>();
    for (Map<?, ?> r : simRequests()) {
      String agent = String.valueOf(r.get("userAgent"));
      String verb = String.valueOf(r.get("verb"));
      if (agent.startsWith("fabric8") && "pods".equals(r.get("resource"))
          && ("list".equals(verb) || "watch".equals(verb))) {
        byVerb.merge(verb, ((Number) r.get("count")).longValue(), Long::sum);
      }
    }
    return byVerb;
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

}
