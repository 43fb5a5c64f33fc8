package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.client.KubernetesClient;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import org.apache.spark.SecurityManager;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkException;
import org.apache.spark.scheduler.cluster.k8s.AbstractPodsAllocator;
import org.apache.spark.scheduler.cluster.k8s.ExecutorPodsSnapshotsStore;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.apache.spark.util.Clock;
import org.junit.jupiter.api.Test;

/** The jar a user puts on the driver's class path: loadable the way Spark loads it. */
class ShadedJarIT {
  @Test
  void thePluginComesFromTheShadedJarWithItsDependenciesRelocated() throws Exception {
    Class<?> plugin = Class.forName(ServicePodsAllocator.CLASS_NAME);
    String source = plugin.getProtectionDomain().getCodeSource().getLocation().getPath();
    assertTrue(source.endsWith(".jar"), "loaded from " + source);
    assertTrue(AbstractPodsAllocator.class.isAssignableFrom(plugin));
    // Only the relocated copies of grpc-java and protobuf exist for the driver.
    assertThrows(ClassNotFoundException.class, () -> Class.forName("io.grpc.Channel"));
    Class.forName("io.github.sparkpodallocator.spark.shaded.io.grpc.Channel");
    Class.forName("io.github.sparkpodallocator.spark.shaded.com.google.protobuf.Message");
    // The stubs keep the proto's package and, above all, the service's name on the wire.
    Class<?> stubs = Class.forName("spark.allocator.v1.ExecutorAllocatorGrpc");
    assertEquals("spark.allocator.v1.ExecutorAllocator", stubs.getField("SERVICE_NAME").get(null));
    // Spark's own version, as the build selected it.
    assertEquals(System.getProperty("spark.test.version"),
        org.apache.spark.package$.MODULE$.SPARK_VERSION());
  }

  @Test
  void sparksReflectiveConstructorReportsAMissingAddressByKey() throws Exception {
    // What KubernetesClusterManager does with spark.kubernetes.allocation.pods.allocator.
    Constructor<?> constructor = Class.forName(ServicePodsAllocator.CLASS_NAME).getConstructor(
        SparkConf.class, SecurityManager.class, KubernetesExecutorBuilder.class,
        KubernetesClient.class, ExecutorPodsSnapshotsStore.class, Clock.class);
    InvocationTargetException e = assertThrows(InvocationTargetException.class,
        () -> constructor.newInstance(new SparkConf(false), null, null, null, null, null));
    assertTrue(e.getCause() instanceof SparkException, e.getCause().toString());
    assertTrue(e.getCause().getMessage().contains("spark.kubernetes.allocation.service.address"),
        e.getCause().getMessage());
  }
}
