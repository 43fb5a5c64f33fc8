package io.github.sparkpodallocator.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;

/**
 * A Spark driver that allocates its executors with Spark's own {@code ExecutorPodsAllocator}
 * (no plugin), for {@code spark-pod-allocator-bench control-plane}: client mode, Spark's
 * allocation defaults, a static number of executors. On kwok nodes its executor pods go
 * Running without a JVM, so what it does to the API server is real while nothing registers.
 * It holds the executors until its stdin closes, then stops (Spark deletes its pods).
 *
 * <p>Arguments: API server URL, CA certificate file, bearer token, namespace, executors,
 * application name (also the executor pod name prefix), and optionally the service's gRPC
 * address: the driver then allocates through the plugin with only its two required settings
 * (the allocator class and the address), everything else at its defaults.
 */
public final class OwnAllocatorDriver {
  private OwnAllocatorDriver() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 6 && args.length != 7) {
      System.err.println(
          "usage: OwnAllocatorDriver URL CA_FILE TOKEN NAMESPACE EXECUTORS APP [SERVICE]");
      System.exit(2);
    }
    SparkConf conf = new SparkConf(false)
        .setMaster("k8s://" + args[0])
        .setAppName(args[5])
        .set("spark.submit.deployMode", "client")
        .set("spark.kubernetes.authenticate.caCertFile", args[1])
        .set("spark.kubernetes.authenticate.oauthToken", args[2])
        .set("spark.kubernetes.namespace", args[3])
        .set("spark.executor.instances", args[4])
        .set("spark.kubernetes.executor.podNamePrefix", args[5])
        .set("spark.kubernetes.container.image", "spark:4")
        // The same requests as the service's executors in the bench: small enough that a
        // kwok node's pod count (110), not its CPU, bounds what it holds.
        .set("spark.kubernetes.executor.request.cores", "100m")
        .set("spark.executor.memory", "512m")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false");
    if (args.length == 7) {
      conf.set("spark.kubernetes.allocation.pods.allocator", ServicePodsAllocator.CLASS_NAME)
          .set(ServiceSettings.ADDRESS, args[6]);
    }
    SparkContext sc = new SparkContext(conf);
    System.out.println("started " + sc.applicationId());
    System.out.flush();
    while (System.in.read() != -1) {
      // Holds the executors until stdin closes.
    }
    sc.stop();
  }
}
