package io.github.sparkpodallocator.spark;

import io.fabric8.kubernetes.api.model.Container;
import io.fabric8.kubernetes.api.model.HasMetadata;
import io.fabric8.kubernetes.api.model.PersistentVolumeClaim;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.utils.Serialization;
import java.util.List;
import java.util.stream.Collectors;
import org.apache.spark.SecurityManager;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkException;
import org.apache.spark.deploy.k8s.KubernetesConf;
import org.apache.spark.deploy.k8s.KubernetesExecutorConf;
import org.apache.spark.deploy.k8s.KubernetesExecutorSpec;
import org.apache.spark.deploy.k8s.SparkPod;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Builds the executor pod of a resource profile exactly as Spark's own allocator does (the same
 * feature steps, pod template file, labels, env, volumes), once per profile, with the executor id
 * {@value #EXECUTOR_ID_PLACEHOLDER}: the service substitutes it per executor and overwrites the
 * pod name, hostname and Spark's labels. The claims Spark's builder returns beside the pod
 * (on-demand PersistentVolumeClaims, named with the same placeholder) go with it: the service
 * creates them per executor, and reuses a lost executor's as Spark does.
 */
public final class ExecutorPodTemplates {
  /** What Spark substitutes per executor ({@code Utils.substituteAppNExecIds}); so does the service. */
  public static final String EXECUTOR_ID_PLACEHOLDER = "{{EXECUTOR_ID}}";

  private final SparkConf conf;
  private final SecurityManager securityManager;
  private final KubernetesExecutorBuilder builder;
  private final KubernetesClient client;

  public ExecutorPodTemplates(
      SparkConf conf,
      SecurityManager securityManager,
      KubernetesExecutorBuilder builder,
      KubernetesClient client) {
    this.conf = conf;
    this.securityManager = securityManager;
    this.builder = builder;
    this.client = client;
  }

  /** One profile's executor pod, ready to send. */
  public static final class Template {
    private final Pod pod;
    private final List<PersistentVolumeClaim> claims;
    private final String executorContainerName;
    private final String podNamePrefix;

    Template(Pod pod, List<PersistentVolumeClaim> claims, String executorContainerName,
        String podNamePrefix) {
      this.pod = pod;
      this.claims = List.copyOf(claims);
      this.executorContainerName = executorContainerName;
      this.podNamePrefix = podNamePrefix;
    }

    /** The claims created per executor (Spark's on-demand claims), as Spark's builder made them. */
    public List<PersistentVolumeClaim> claims() {
      return claims;
    }

    /** The claims as JSON, one manifest each (Start's {@code executor_claim_templates}). */
    public List<String> claimJsons() {
      return claims.stream().map(Serialization::asJson).collect(Collectors.toList());
    }

    /** The pod, executor container included. */
    public Pod pod() {
      return pod;
    }

    /** The pod as JSON (a Pod manifest, which the service reads as YAML or JSON). */
    public String json() {
      return Serialization.asJson(pod);
    }

    /** The name of the container that runs the executor. */
    public String executorContainerName() {
      return executorContainerName;
    }

    /** Spark's executor pod-name prefix ({@code <prefix>-exec-<id>}). */
    public String podNamePrefix() {
      return podNamePrefix;
    }
  }

  /**
   * The executor pod of {@code profile} for application {@code appId}.
   *
   * @throws SparkException when Spark's configuration asks for per-executor resources other
   *     than PersistentVolumeClaims, which the service does not create
   */
  public Template build(String appId, Option<Pod> driverPod, ResourceProfile profile)
      throws SparkException {
    KubernetesExecutorConf executorConf = KubernetesConf.createExecutorConf(
        conf, EXECUTOR_ID_PLACEHOLDER, appId, driverPod, profile.id());
    KubernetesExecutorSpec spec =
        builder.buildFromFeatures(executorConf, securityManager, client, profile);
    List<HasMetadata> resources =
        CollectionConverters.asJava(spec.executorKubernetesResources());
    String others = resources.stream()
        .filter(r -> !(r instanceof PersistentVolumeClaim))
        .map(r -> r.getKind() + " " + r.getMetadata().getName())
        .collect(Collectors.joining(", "));
    if (!others.isEmpty()) {
      throw new SparkException("The executor pods of this application need resources created"
          + " per executor (" + others + ") other than PersistentVolumeClaims; the"
          + " spark-pod-allocator service does not create them. Use"
          + " spark.kubernetes.allocation.pods.allocator=direct.");
    }
    List<PersistentVolumeClaim> claims = resources.stream()
        .map(PersistentVolumeClaim.class::cast)
        .collect(Collectors.toList());
    SparkPod sparkPod = spec.pod();
    Container container = sparkPod.container();
    Pod pod = new PodBuilder(sparkPod.pod())
        .editOrNewSpec()
        .addToContainers(container)
        .endSpec()
        .build();
    return new Template(pod, claims, container.getName(), executorConf.resourceNamePrefix());
  }
}
