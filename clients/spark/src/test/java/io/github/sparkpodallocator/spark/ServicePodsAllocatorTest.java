package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkException;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.apache.spark.util.SystemClock;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** What Spark's reflective construction of the plugin checks, against the simulated cluster. */
class ServicePodsAllocatorTest {
  @TempDir Path dir;

  private static ServicePodsAllocator construct(SparkConf conf, KubernetesClient client)
      throws SparkException {
    return new ServicePodsAllocator(conf, null, new KubernetesExecutorBuilder(), client, null,
        new SystemClock());
  }

  @Test
  void aMissingAddressStopsTheDriverNamingTheKey() {
    SparkException e = assertThrows(SparkException.class,
        () -> construct(new SparkConf(false), null));
    assertTrue(e.getMessage().contains("spark.kubernetes.allocation.service.address"),
        e.getMessage());
  }

  /** The plugin's required keys; the channel to the address is never used. */
  private static SparkConf required() {
    return new SparkConf(false)
        .set(ServiceSettings.ADDRESS, "127.0.0.1:1")
        .set(ServiceSettings.TOKEN_FILE, "");
  }

  /** Constructs the plugin as Spark does, on {@code conf}, and closes its channel. */
  private static void constructOn(SparkConf conf) throws SparkException {
    construct(conf, null).stop("never-started");
  }

  @Test
  void sparksOwnPodWatchAndPollingAreTurnedOffOnTheConfItIsGiven() throws Exception {
    SparkConf conf = required();
    constructOn(conf);
    assertEquals("false", conf.get(SparkPodSources.WATCHER, "(unset)"));
    assertEquals("false", conf.get(SparkPodSources.POLLING, "(unset)"));
  }

  @Test
  void keysTheUserSetAreKeptAndTrueOnesWarnedAbout() throws Exception {
    SparkConf on = required()
        .set(SparkPodSources.WATCHER, "true")
        .set(SparkPodSources.POLLING, " TRUE");
    constructOn(on);
    assertEquals("true", on.get(SparkPodSources.WATCHER, "(unset)"));
    assertEquals(" TRUE", on.get(SparkPodSources.POLLING, "(unset)"));
    List<String> warnings = SparkPodSources.turnOff(on);
    assertEquals(2, warnings.size(), String.valueOf(warnings));
    assertTrue(warnings.get(0).startsWith(SparkPodSources.WATCHER + "=true")
        && warnings.get(0).contains("watch"), warnings.get(0));
    assertTrue(warnings.get(1).startsWith(SparkPodSources.POLLING + "=true")
        && warnings.get(1).contains("LIST")
        && warnings.get(1).contains("spark.kubernetes.executor.apiPollingInterval"),
        warnings.get(1));

    // One set by the user, the other not.
    SparkConf mixed = required().set(SparkPodSources.POLLING, "true");
    constructOn(mixed);
    assertEquals("false", mixed.get(SparkPodSources.WATCHER, "(unset)"));
    assertEquals("true", mixed.get(SparkPodSources.POLLING, "(unset)"));

    SparkConf off = required()
        .set(SparkPodSources.WATCHER, "false")
        .set(SparkPodSources.POLLING, "False");
    constructOn(off);
    assertEquals("false", off.get(SparkPodSources.WATCHER, "(unset)"));
    assertEquals("False", off.get(SparkPodSources.POLLING, "(unset)"));
    assertEquals(List.of(), SparkPodSources.turnOff(off));
  }

  @Test
  void withoutTheEventFeedSparksOwnSourcesAreLeftAlone() throws Exception {
    SparkConf conf = required().set(ServiceSettings.EXECUTOR_EVENTS, "false");
    constructOn(conf);
    assertFalse(conf.contains(SparkPodSources.WATCHER));
    assertFalse(conf.contains(SparkPodSources.POLLING));
  }

  @Test
  void theDriverPodIsLookedUpInTheNamespace() throws Exception {
    int grpc = ServiceProcess.freePort();
    int api = ServiceProcess.freePort();
    try (ServiceProcess service = ServiceProcess.start(dir, Map.of(
            "SPARK_POD_ALLOCATOR__LISTEN", "127.0.0.1:" + grpc,
            "SPARK_POD_ALLOCATOR__SIMULATOR__LISTEN", "127.0.0.1:" + api),
            grpc, "serve", "--simulate");
        KubernetesClient k8s = new KubernetesClientBuilder()
            .withConfig(new ConfigBuilder().withMasterUrl("http://127.0.0.1:" + api).build())
            .build()) {
      SparkConf conf = new SparkConf(false)
          .set(ServiceSettings.ADDRESS, "127.0.0.1:" + grpc)
          .set(ServiceSettings.TOKEN_FILE, "")
          .set("spark.kubernetes.namespace", "default")
          .set("spark.kubernetes.driver.pod.name", "the-driver");

      SparkException missing = assertThrows(SparkException.class, () -> construct(conf, k8s));
      assertTrue(missing.getMessage().contains("the-driver")
          && missing.getMessage().contains("spark.kubernetes.driver.pod.name"),
          missing.getMessage());

      k8s.pods().inNamespace("default").resource(new PodBuilder()
          .withNewMetadata().withName("the-driver").endMetadata()
          .withNewSpec().addNewContainer().withName("driver").withImage("spark:4")
          .endContainer().endSpec()
          .build()).create();
      // Spark's wait for the driver pod to be Ready: none for a Ready pod (the simulated
      // kubelet runs it), and its timeout ends it without an error (a pod that never comes).
      long began = System.nanoTime();
      ServicePodsAllocator.awaitReady(k8s, "default", "the-driver", 30);
      long waitedMs = (System.nanoTime() - began) / 1_000_000;
      assertTrue(waitedMs < 10_000, "a Ready driver pod is waited for: " + waitedMs + " ms");
      began = System.nanoTime();
      ServicePodsAllocator.awaitReady(k8s, "default", "no-such-driver", 1);
      waitedMs = (System.nanoTime() - began) / 1_000_000;
      assertTrue(waitedMs >= 900 && waitedMs < 10_000, waitedMs + " ms");

      ServicePodsAllocator withDriver = construct(conf, k8s);
      ServicePodsAllocator withoutDriver =
          construct(conf.clone().remove("spark.kubernetes.driver.pod.name"), k8s);
      try {
        assertEquals("the-driver", withDriver.driverPod().get().getMetadata().getName());
        assertTrue(withoutDriver.driverPod().isEmpty(), service.log());
      } finally {
        // Never started: stop only closes each one's channel.
        withDriver.stop("never-started");
        withoutDriver.stop("never-started");
      }
    }
  }
}
