//! Writes executor pods built by `ExecutorPodBuilder` from a Spark-like template as JSON
//! files into the directory given as the first argument, for an offline schema check
//! against the Kubernetes OpenAPI (`scripts/validate-executor-pods.sh`).
use std::collections::BTreeMap;
use std::error::Error;

use k8s_openapi::api::core::v1::Pod;
use spark_pod_allocator::allocator::{
    DriverOwner, ExecutorId, ExecutorPodBuilder, ResourceProfileId,
};

const TEMPLATE: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  labels: {team: data}
  annotations: {owner: data-platform}
spec:
  serviceAccountName: spark
  containers:
  - name: spark-kubernetes-executor
    image: apache/spark:4.0.0
    args: [executor]
    resources:
      requests: {cpu: "1", memory: 2Gi}
      limits: {memory: 2Gi}
    volumeMounts: [{name: spark-local-dir-1, mountPath: /var/data/spark-local}]
  - name: sidecar
    image: busybox
  volumes: [{name: spark-local-dir-1, emptyDir: {}}]
"#;

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: executor_pods OUTPUT_DIR")?;
    let template: Pod = serde_yaml::from_str(TEMPLATE)?;
    let long_prefix = "x".repeat(80);
    // Application ids and prefixes as drivers send them: dots, underscores, capitals,
    // a prefix too long for a pod name; with and without a driver pod owner.
    let cases = [
        ("spark-1234abcd", "spark-pi", true),
        ("App_1.x", "My_App.Prefix", false),
        ("a", long_prefix.as_str(), true),
    ];
    for (i, (app, prefix, owned)) in cases.into_iter().enumerate() {
        let driver = owned.then(|| DriverOwner {
            name: "spark-pi-driver".into(),
            uid: "6f7c3a0e-1111-2222-3333-444455556666".into(),
        });
        let builder = ExecutorPodBuilder::new(
            app,
            prefix,
            BTreeMap::from([(ResourceProfileId(0), template.clone())]),
            driver,
            "spark-kubernetes-executor",
        )?;
        for id in [1, 123_456_789] {
            let pod = builder.build(ExecutorId(id), ResourceProfileId(0))?;
            let path = format!("{dir}/executor-{i}-{id}.json");
            std::fs::write(&path, serde_json::to_string_pretty(&pod)?)?;
            println!("{path}");
        }
    }
    Ok(())
}
