package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.fabric8.kubernetes.api.model.EnvVar;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.utils.Serialization;
import io.grpc.Status;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.function.Supplier;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.spark.SparkConf;
import org.apache.spark.resource.ExecutorResourceRequests;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfile$;
import org.apache.spark.resource.ResourceProfileBuilder;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import scala.Option;
import spark.allocator.v1.Allocator.ApplicationStatus;
import spark.allocator.v1.Allocator.ProfileStatus;
import spark.allocator.v1.Allocator.StartRequest;

/** The client against the real service binary on its simulated cluster. */
class AllocatorClientTest {
  private static final String APP = "spark-client-test";

  @TempDir Path dir;

  private static ServiceSettings settings(int port, String... extra) {
    SparkConf conf = new SparkConf(false).set(ServiceSettings.ADDRESS, "127.0.0.1:" + port);
    for (int i = 0; i < extra.length; i += 2) {
      conf.set(extra[i], extra[i + 1]);
    }
    return ServiceSettings.fromConf(conf, Path.of("/nonexistent/token"));
  }

  /** Spark's executor pod for the default profile, as the plugin sends it. */
  private static StartRequest startRequest(String app) throws Exception {
    SparkConf conf = ExecutorPodTemplatesTest.conf();
    ExecutorPodTemplates.Template template = ExecutorPodTemplatesTest.templates(conf)
        .build(app, Option.empty(), ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf));
    return StartRequest.newBuilder()
        .setApplicationId(app)
        .setNamespace("default")
        .setExecutorPodTemplate(template.json())
        .setPodNamePrefix(template.podNamePrefix())
        .setSettings(SparkAllocationSettings.fromConf(
            conf.clone().set("spark.kubernetes.allocation.batch.delay", "200ms"),
            template.executorContainerName()))
        .build();
  }

  private static <T> T await(String what, Supplier<T> value, java.util.function.Predicate<T> done)
      throws InterruptedException {
    long end = System.nanoTime() + Duration.ofSeconds(30).toNanos();
    T last = null;
    while (System.nanoTime() < end) {
      last = value.get();
      if (done.test(last)) {
        return last;
      }
      Thread.sleep(50);
    }
    throw new AssertionError("timed out waiting for " + what + "; last: " + last);
  }

  private static ProfileStatus profile(ApplicationStatus status, int id) {
    return status.getProfilesList().stream()
        .filter(p -> p.getResourceProfileId() == id)
        .findFirst()
        .orElse(ProfileStatus.getDefaultInstance());
  }

  private static KubernetesClient kubernetes(int apiPort) {
    return new KubernetesClientBuilder()
        .withConfig(new ConfigBuilder().withMasterUrl("http://127.0.0.1:" + apiPort).build())
        .build();
  }

  private static Map<String, Pod> executorPods(KubernetesClient k8s, String app) {
    return k8s.pods().inNamespace("default").withLabel("spark-app-selector", app).list()
        .getItems().stream()
        .collect(Collectors.toMap(p -> p.getMetadata().getName(), p -> p));
  }

  @Test
  void endedAllocationSetsEveryTargetToZeroAndLaterTargetsDoNotRaiseIt() throws Exception {
    int grpc = ServiceProcess.freePort();
    int api = ServiceProcess.freePort();
    try (ServiceProcess service = ServiceProcess.start(dir, Map.of(
            "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
            "SPARK_POD_ALLOCATOR__SIMULATOR__LISTEN", "127.0.0.1:" + api),
            grpc, "serve", "--simulate");
        AllocatorClient client = new AllocatorClient(settings(grpc))) {
      String app = APP + "-end";
      client.start(startRequest(app));
      client.setTotalExpected(Map.of(0, 2), Map.of());
      await("2 running executors", client::status, s -> profile(s, 0).getRunning() == 2);

      client.endAllocation();
      assertEquals(0, profile(client.status(), 0).getTarget(), service.log());
      // What Spark may still ask while it stops changes nothing.
      client.setTotalExpected(Map.of(0, 5), Map.of());
      ApplicationStatus status = client.status();
      assertEquals(0, profile(status, 0).getTarget());
      assertEquals(2, status.getLastExecutorId(), "no executor was created after the end");
    }
  }

  @Test
  void sparksTemplateProfilesAndTheCallsOfAnApplication() throws Exception {
    int grpc = ServiceProcess.freePort();
    int api = ServiceProcess.freePort();
    try (ServiceProcess service = ServiceProcess.start(dir, Map.of(
            "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
            "SPARK_POD_ALLOCATOR__SIMULATOR__LISTEN", "127.0.0.1:" + api),
            grpc, "serve", "--simulate");
        AllocatorClient client = new AllocatorClient(settings(grpc));
        KubernetesClient k8s = kubernetes(api)) {
      assertFalse(client.start(startRequest(APP)).getResumed());
      client.setTotalExpected(Map.of(0, 2), Map.of());
      await("2 running executors", client::status, s -> profile(s, 0).getRunning() == 2);

      Map<String, Pod> pods = executorPods(k8s, APP);
      assertEquals(List.of("sum-test-exec-1", "sum-test-exec-2"),
          pods.keySet().stream().sorted().collect(Collectors.toList()), service.log());
      Pod first = pods.get("sum-test-exec-1");
      Map<String, String> labels = first.getMetadata().getLabels();
      assertEquals("1", labels.get("spark-exec-id"));
      assertEquals("executor", labels.get("spark-role"));
      assertEquals(APP, labels.get("spark-app-selector"));
      assertEquals("0", labels.get("spark-exec-resourceprofile-id"));
      assertEquals("data-1", labels.get("team"));
      assertEquals("sum-test-exec-1", first.getSpec().getHostname());
      Map<String, String> env = first.getSpec().getContainers().get(0).getEnv().stream()
          .filter(e -> e.getValue() != null)
          .collect(Collectors.toMap(EnvVar::getName, EnvVar::getValue));
      assertEquals("1", env.get("SPARK_EXECUTOR_ID"));
      assertEquals("-Dexec.id=1", env.get("SPARK_JAVA_OPT_0"));

      client.updateRegisteredExecutors(List.of("1", "2"));
      assertFalse(client.isDeleted("1"));

      // A profile created while the application runs: its template travels with its target.
      SparkConf conf = ExecutorPodTemplatesTest.conf();
      ResourceProfile second = new ResourceProfileBuilder()
          .require(new ExecutorResourceRequests().cores(1).memory("600m")).build();
      String template = ExecutorPodTemplatesTest.templates(conf)
          .build(APP, Option.empty(), second).json();
      client.setTotalExpected(Map.of(second.id(), 1), Map.of(second.id(), template));
      await("the second profile's executor", client::status,
          s -> profile(s, second.id()).getRunning() == 1);
      Pod third = executorPods(k8s, APP).get("sum-test-exec-3");
      assertEquals(String.valueOf(second.id()),
          third.getMetadata().getLabels().get("spark-exec-resourceprofile-id"));

      // The same template again is accepted (the plugin may resend after a restart).
      client.setTotalExpected(Map.of(second.id(), 1), Map.of(second.id(), template));

      assertEquals(3, client.stop());
      await("no executor pods", () -> executorPods(k8s, APP), Map::isEmpty);
    }
  }

  @Test
  void aRestartedServiceGetsTheApplicationAgain() throws Exception {
    int grpc = ServiceProcess.freePort();
    int api = ServiceProcess.freePort();
    Path kubeconfig = dir.resolve("kubeconfig");
    Map<String, String> serveEnv = Map.of(
        "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
        "SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig.toString());
    try (ServiceProcess cluster = ServiceProcess.start(dir, Map.of(), api,
            "simulate", "--listen", "127.0.0.1:" + api, "--kubeconfig", kubeconfig.toString());
        AllocatorClient client = new AllocatorClient(settings(grpc));
        KubernetesClient k8s = kubernetes(api)) {
      ServiceProcess service = ServiceProcess.start(dir, serveEnv, grpc, "serve");
      try {
        client.start(startRequest(APP));
        client.setTotalExpected(Map.of(0, 2), Map.of());
        await("2 running executors", client::status, s -> profile(s, 0).getRunning() == 2);
        client.updateRegisteredExecutors(List.of("1", "2"));
      } finally {
        service.close();
      }

      // The call starts while the service is down (UNAVAILABLE, retried) and lands on a new
      // service that resumed the application from its registration before it listened.
      CompletableFuture<Boolean> call = CompletableFuture.supplyAsync(() -> client.isDeleted("2"));
      Thread.sleep(500);
      assertFalse(call.isDone(), "the call waits for the service");
      try (ServiceProcess restarted = ServiceProcess.start(dir, serveEnv, grpc, "serve")) {
        assertFalse(call.get());
        ApplicationStatus status = client.status();
        // Resumed: the same two executors, the last target, no new executor.
        assertEquals(2, profile(status, 0).getTarget(), restarted.log());
        assertEquals(2, status.getLastExecutorId());
        assertEquals(2, executorPods(k8s, APP).size(), cluster.log());
        // By the service itself: the client sent no Start again.
        String log = restarted.log();
        assertTrue(log.contains("application resumed from its registration"), log);
        assertFalse(log.contains("method=\"Start\""), log);
        assertEquals(2, client.stop());
      }
    }
  }

  @Test
  void whenItsEventStreamBrokeTheDriverSendsItsLastTargetsAgain() throws Exception {
    int grpc = ServiceProcess.freePort();
    int api = ServiceProcess.freePort();
    Path kubeconfig = dir.resolve("kubeconfig");
    Map<String, String> serveEnv = Map.of(
        "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
        "SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig.toString());
    String app = APP + "-again";
    StartRequest start = startRequest(app);
    try (ServiceProcess cluster = ServiceProcess.start(dir, Map.of(), api,
            "simulate", "--listen", "127.0.0.1:" + api, "--kubeconfig", kubeconfig.toString());
        AllocatorClient client = new AllocatorClient(settings(grpc));
        KubernetesClient k8s = kubernetes(api);
        ExecutorEventsFeed feed =
            new ExecutorEventsFeed(client, new ExecutorEventsFeedTest.RecordingStore())) {
      ServiceProcess service = ServiceProcess.start(dir, serveEnv, grpc, "serve");
      try {
        client.start(start);
        feed.start();
        assertTrue(feed.awaitFirstState(Duration.ofSeconds(30)), service.log());
        client.setTotalExpected(Map.of(0, 2), Map.of());
        await("2 running executors", client::status, s -> profile(s, 0).getRunning() == 2);
        // A registration that lacks the last target answered (its owner lost before it was
        // written): here another client of the application lowered it behind the driver.
        try (AllocatorClient other = new AllocatorClient(settings(grpc))) {
          other.start(start);
          other.setTotalExpected(Map.of(0, 1), Map.of());
        }
        assertEquals(1, profile(client.status(), 0).getTarget());
      } finally {
        service.close();
      }
      try (ServiceProcess restarted = ServiceProcess.start(dir, serveEnv, grpc, "serve")) {
        // Resumed from the registration (1), then the driver's stream, opened again, sent 2.
        await("the driver's target again", client::status, s -> profile(s, 0).getTarget() == 2);
        assertTrue(restarted.log().contains("application resumed from its registration"),
            restarted.log());
        assertEquals(2, executorPods(k8s, app).size(), cluster.log());
        assertEquals(2, client.stop());
      }
    }
  }

  @Test
  void aServiceThatLostTheApplicationGetsEveryTemplateTargetAndRegisteredExecutorAgain()
      throws Exception {
    int grpc = ServiceProcess.freePort();
    int api = ServiceProcess.freePort();
    Path kubeconfig = dir.resolve("kubeconfig");
    Map<String, String> serveEnv = Map.of(
        "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
        "SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig.toString());
    String app = APP + "-lost";
    try (ServiceProcess cluster = ServiceProcess.start(dir, Map.of(), api,
            "simulate", "--listen", "127.0.0.1:" + api, "--kubeconfig", kubeconfig.toString());
        AllocatorClient client = new AllocatorClient(settings(grpc));
        KubernetesClient k8s = kubernetes(api)) {
      SparkConf conf = ExecutorPodTemplatesTest.conf();
      ResourceProfile second = new ResourceProfileBuilder()
          .require(new ExecutorResourceRequests().cores(1).memory("600m")).build();
      String template = ExecutorPodTemplatesTest.templates(conf)
          .build(app, Option.empty(), second).json();
      ServiceProcess service = ServiceProcess.start(dir, serveEnv, grpc, "serve");
      try {
        client.start(startRequest(app));
        client.setTotalExpected(Map.of(0, 1, second.id(), 1), Map.of(second.id(), template));
        await("an executor of each profile", client::status,
            s -> profile(s, 0).getRunning() == 1 && profile(s, second.id()).getRunning() == 1);
        client.updateRegisteredExecutors(List.of("1", "2"));
      } finally {
        service.close();
      }

      // Signed with another key, the registration the first service kept is refused: the new
      // service does not know the application (NOT_FOUND) and only the client can give it back.
      Map<String, String> otherKey = new HashMap<>(serveEnv);
      otherKey.put("SPARK_POD_ALLOCATOR__REGISTRATIONS__KEY_SECRET", "another-registration-key");
      try (ServiceProcess restarted = ServiceProcess.start(dir, otherKey, grpc, "serve")) {
        assertFalse(client.isDeleted("2"), restarted.log());
        ApplicationStatus status = client.status();
        // Every template (a target for a profile without one would be refused), the targets,
        // the same two executors and no new one.
        assertEquals(1, profile(status, 0).getTarget(), restarted.log());
        assertEquals(1, profile(status, second.id()).getTarget());
        assertEquals(2, status.getLastExecutorId());
        assertEquals(2, executorPods(k8s, app).size(), cluster.log());
        // The registered executors reached it too: its new registration holds them.
        await("the new registration with executors 1 and 2", () -> registered(k8s, app),
            List.of(1L, 2L)::equals);
        assertEquals(2, client.stop());
      }
    }
  }

  /** The executors registered with the driver, as the application's registration keeps them. */
  private static List<Long> registered(KubernetesClient k8s, String app) {
    return k8s.configMaps().inNamespace("default").withLabel("spark-app-selector", app).list()
        .getItems().stream()
        .map(c -> c.getData() == null ? null : c.getData().get("registration"))
        .filter(Objects::nonNull)
        .flatMap(json -> {
          try {
            JsonNode node =
                Serialization.jsonMapper().readTree(json);
            List<Long> ids = new ArrayList<>();
            node.path("registered").forEach(id -> ids.add(id.asLong()));
            return Stream.of(ids);
          } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
          }
        })
        .findFirst()
        .orElse(List.of());
  }

  @Test
  void anUnreachableServiceIsRetriedForTheRetryTimeoutThenFails() throws Exception {
    int nothing = ServiceProcess.freePort();
    try (AllocatorClient client = new AllocatorClient(settings(nothing,
        ServiceSettings.RETRY_TIMEOUT, "1500ms",
        ServiceSettings.DEADLINE, "300ms",
        ServiceSettings.IS_DELETED_WHEN_UNAVAILABLE, "true"))) {
      long began = System.nanoTime();
      AllocatorServiceException e = assertThrows(AllocatorServiceException.class,
          () -> client.start(StartRequest.newBuilder().setApplicationId(APP).build()));
      long tookMs = (System.nanoTime() - began) / 1_000_000;
      assertEquals(Status.Code.UNAVAILABLE, e.code());
      assertTrue(e.getMessage().startsWith("spark-pod-allocator Start failed: UNAVAILABLE"),
          e.getMessage());
      assertTrue(tookMs >= 700 && tookMs < 10_000, "retried for " + tookMs + " ms");

      // IsDeleted is on the driver's registration path: the documented answer, quickly.
      began = System.nanoTime();
      assertTrue(client.isDeleted("3"));
      assertTrue((System.nanoTime() - began) / 1_000_000 < 5_000);
    }
  }
}
