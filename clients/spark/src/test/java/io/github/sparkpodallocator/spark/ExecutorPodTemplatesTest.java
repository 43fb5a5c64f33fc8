package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fabric8.kubernetes.api.model.Container;
import io.fabric8.kubernetes.api.model.EnvVar;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.utils.Serialization;
import java.util.Map;
import java.util.stream.Collectors;
import org.apache.spark.SecurityManager;
import org.apache.spark.SecurityManager$;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkException;
import org.apache.spark.resource.ExecutorResourceRequests;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.resource.ResourceProfileBuilder;
import org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import scala.Option;

/** Templates built by Spark's own classes (the version under test), not by hand. */
class ExecutorPodTemplatesTest {
  private static final String APP = "spark-0123456789abcdef";
  private static KubernetesClient client;

  @BeforeAll
  static void client() {
    // Never contacted: building a pod without a pod template file makes no API call.
    client = new KubernetesClientBuilder().build();
  }

  @AfterAll
  static void closeClient() {
    client.close();
  }

  static SparkConf conf() {
    return new SparkConf(false)
        .set("spark.app.name", "Sum Test")
        .set("spark.kubernetes.container.image", "spark-executor:test")
        .set("spark.driver.host", "10.1.2.3")
        .set("spark.driver.port", "7078")
        .set("spark.executor.memory", "512m")
        .set("spark.executor.cores", "1")
        .set("spark.kubernetes.executor.podNamePrefix", "sum-test")
        .set("spark.executor.extraJavaOptions", "-Dexec.id={{EXECUTOR_ID}} -Dapp={{APP_ID}}")
        .set("spark.kubernetes.executor.label.team", "data-{{EXECUTOR_ID}}")
        .set("spark.kubernetes.executor.annotation.owner", "app-{{APP_ID}}");
  }

  static ExecutorPodTemplates templates(SparkConf conf) {
    SecurityManager secMgr = new SecurityManager(conf, Option.empty(),
        SecurityManager$.MODULE$.$lessinit$greater$default$3());
    return new ExecutorPodTemplates(conf, secMgr, new KubernetesExecutorBuilder(), client);
  }

  private static Map<String, EnvVar> env(Container container) {
    return container.getEnv().stream().collect(Collectors.toMap(EnvVar::getName, e -> e));
  }

  @Test
  void theDefaultProfilesPodIsSparksWithThePlaceholderId() throws SparkException {
    SparkConf conf = conf();
    ResourceProfile profile = org.apache.spark.resource.ResourceProfile$.MODULE$
        .getOrCreateDefaultProfile(conf);
    ExecutorPodTemplates.Template template =
        templates(conf).build(APP, Option.empty(), profile);

    assertEquals("sum-test", template.podNamePrefix());
    assertEquals("spark-kubernetes-executor", template.executorContainerName());

    // What the service receives: the JSON, read back as a Pod.
    Pod pod = Serialization.unmarshal(template.json(), Pod.class);
    assertEquals("sum-test-exec-{{EXECUTOR_ID}}", pod.getMetadata().getName());
    Map<String, String> labels = pod.getMetadata().getLabels();
    assertEquals(APP, labels.get("spark-app-selector"));
    assertEquals("executor", labels.get("spark-role"));
    assertEquals("{{EXECUTOR_ID}}", labels.get("spark-exec-id"));
    assertEquals(String.valueOf(profile.id()), labels.get("spark-exec-resourceprofile-id"));
    assertEquals("sum-test", labels.get("spark-app-name"));
    // Spark substitutes the application id itself; the executor id is left to the service.
    assertEquals("data-{{EXECUTOR_ID}}", labels.get("team"));
    assertEquals("app-" + APP, pod.getMetadata().getAnnotations().get("owner"));
    assertEquals("Never", pod.getSpec().getRestartPolicy());

    assertEquals(1, pod.getSpec().getContainers().size());
    Container container = pod.getSpec().getContainers().get(0);
    assertEquals("spark-executor:test", container.getImage());
    assertEquals(java.util.List.of("executor"), container.getArgs());
    Map<String, EnvVar> env = env(container);
    assertEquals("{{EXECUTOR_ID}}", env.get("SPARK_EXECUTOR_ID").getValue());
    assertEquals(APP, env.get("SPARK_APPLICATION_ID").getValue());
    assertEquals("spark://CoarseGrainedScheduler@10.1.2.3:7078",
        env.get("SPARK_DRIVER_URL").getValue());
    assertEquals("512m", env.get("SPARK_EXECUTOR_MEMORY").getValue());
    assertEquals("1", env.get("SPARK_EXECUTOR_CORES").getValue());
    assertEquals("-Dexec.id={{EXECUTOR_ID}}", env.get("SPARK_JAVA_OPT_0").getValue());
    assertEquals("-Dapp=" + APP, env.get("SPARK_JAVA_OPT_1").getValue());
    assertEquals("status.podIP",
        env.get("SPARK_EXECUTOR_POD_IP").getValueFrom().getFieldRef().getFieldPath());
    assertEquals("metadata.name",
        env.get("SPARK_EXECUTOR_POD_NAME").getValueFrom().getFieldRef().getFieldPath());
  }

  @Test
  void aSecondProfileGetsItsOwnIdAndResources() throws SparkException {
    SparkConf conf = conf();
    ResourceProfile profile = new ResourceProfileBuilder()
        .require(new ExecutorResourceRequests().cores(2).memory("700m"))
        .build();
    Pod pod = templates(conf).build(APP, Option.empty(), profile).pod();
    assertTrue(profile.id() > 0);
    assertEquals(String.valueOf(profile.id()),
        pod.getMetadata().getLabels().get("spark-exec-resourceprofile-id"));
    Map<String, EnvVar> env = env(pod.getSpec().getContainers().get(0));
    assertEquals(String.valueOf(profile.id()), env.get("SPARK_RESOURCE_PROFILE_ID").getValue());
    assertEquals("2", env.get("SPARK_EXECUTOR_CORES").getValue());
    assertEquals("700m", env.get("SPARK_EXECUTOR_MEMORY").getValue());
  }

  @Test
  void theDriverPodBecomesTheOwner() throws SparkException {
    SparkConf conf = conf();
    Pod driver = new io.fabric8.kubernetes.api.model.PodBuilder()
        .withNewMetadata().withName("driver").withUid("u-1").endMetadata()
        .build();
    driver.setApiVersion("v1");
    driver.setKind("Pod");
    Pod pod = templates(conf).build(APP, Option.apply(driver),
        org.apache.spark.resource.ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf)).pod();
    assertEquals("driver", pod.getMetadata().getOwnerReferences().get(0).getName());
    assertEquals("u-1", pod.getMetadata().getOwnerReferences().get(0).getUid());
  }

  @Test
  void perExecutorClaimsGoWithTheTemplateAsSparksBuilderMakesThem() throws SparkException {
    SparkConf conf = conf()
        .set("spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName",
            "OnDemand")
        .set("spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.storageClass",
            "standard")
        .set("spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.sizeLimit",
            "1Gi")
        .set("spark.kubernetes.executor.volumes.persistentVolumeClaim.data.mount.path", "/data");
    ExecutorPodTemplates.Template template = templates(conf).build(APP, Option.empty(),
        org.apache.spark.resource.ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf));
    assertEquals(1, template.claimJsons().size());
    // What the service receives: the claim's JSON, named with the placeholder id.
    io.fabric8.kubernetes.api.model.PersistentVolumeClaim claim = Serialization.unmarshal(
        template.claimJsons().get(0), io.fabric8.kubernetes.api.model.PersistentVolumeClaim.class);
    String name = claim.getMetadata().getName();
    assertEquals("sum-test-exec-{{EXECUTOR_ID}}-pvc-0", name);
    assertEquals("standard", claim.getSpec().getStorageClassName());
    assertEquals("1Gi",
        claim.getSpec().getResources().getRequests().get("storage").toString());
    assertEquals(APP, claim.getMetadata().getLabels().get("spark-app-selector"));
    // The pod mounts it by that name, which the service substitutes in both.
    Pod pod = Serialization.unmarshal(template.json(), Pod.class);
    assertTrue(pod.getSpec().getVolumes().stream().anyMatch(v ->
        v.getPersistentVolumeClaim() != null
            && name.equals(v.getPersistentVolumeClaim().getClaimName())),
        template.json());
  }

  @Test
  void aTemplateWithoutClaimsSendsNone() throws SparkException {
    SparkConf conf = conf();
    ExecutorPodTemplates.Template template = templates(conf).build(APP, Option.empty(),
        org.apache.spark.resource.ResourceProfile$.MODULE$.getOrCreateDefaultProfile(conf));
    assertTrue(template.claimJsons().isEmpty());
  }
}
