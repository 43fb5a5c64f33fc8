//! The pod policy against the real Pod Security admission: each pod below is checked by
//! `PodPolicy` at a level and created (dry run) in a namespace that enforces the same level.
//! Both must decide alike, except the differences listed, each for a stated reason. (The
//! server refuses privileged containers before admission, as `--allow-privileged=false`
//! does by default; that counts as a refusal.)

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use spark_pod_allocator::allocator::pod_policy::{PodPolicy, PodSecurityLevel, TemplateUse};
use test_kit::cluster::{Cluster, RealBackend};

/// A pod with one executor container carrying `container` and `spec` merged into its spec.
fn pod(spec: Value, container: Value) -> Value {
    let mut executor = json!({"name": "spark-kubernetes-executor", "image": "spark:4"});
    if let (Some(c), Value::Object(extra)) = (executor.as_object_mut(), container) {
        c.extend(extra);
    }
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [executor]}});
    if let (Some(s), Value::Object(extra)) = (pod["spec"].as_object_mut(), spec) {
        s.extend(extra);
    }
    pod
}

fn annotated(mut pod: Value, key: &str, value: &str) -> Value {
    pod["metadata"]["annotations"] = json!({key: value});
    pod
}

/// What `restricted` asks of a container.
fn hardened(extra: Value) -> Value {
    let mut context = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    if let (Some(c), Value::Object(extra)) = (context.as_object_mut(), extra) {
        c.extend(extra);
    }
    json!({"securityContext": context})
}

fn restricted_spec(extra: Value) -> Value {
    let mut spec = json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 185,
        "seccompProfile": {"type": "RuntimeDefault"}}});
    if let (Some(s), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        s.extend(extra);
    }
    spec
}

fn cases() -> Vec<(&'static str, Value)> {
    let sc = |fields: Value| json!({"securityContext": fields});
    let sidecar = |fields: Value| {
        json!({"initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always",
            "securityContext": fields}]})
    };
    let safe_sysctls: Vec<Value> = spark_pod_allocator::allocator::pod_policy::BASELINE_SYSCTLS
        .iter()
        .map(|name| json!({"name": name, "value": "1"}))
        .collect();
    vec![
        ("plain", pod(json!({}), json!({}))),
        (
            "what Spark builds",
            pod(
                json!({"restartPolicy": "Never", "volumes": [
                    {"name": "spark-local-dir-1", "emptyDir": {}},
                    {"name": "spark-conf-volume-exec", "configMap": {"name": "conf"}}]}),
                json!({"ports": [{"name": "blockmanager", "containerPort": 7079}],
                    "lifecycle": {"preStop": {"exec": {"command": ["/opt/decom.sh"]}}}}),
            ),
        ),
        ("hostNetwork", pod(json!({"hostNetwork": true}), json!({}))),
        ("hostPID", pod(json!({"hostPID": true}), json!({}))),
        ("hostIPC", pod(json!({"hostIPC": true}), json!({}))),
        (
            "privileged",
            pod(json!({}), sc(json!({"privileged": true}))),
        ),
        (
            "privileged sidecar",
            pod(sidecar(json!({"privileged": true})), json!({})),
        ),
        (
            "SYS_ADMIN",
            pod(
                json!({}),
                sc(json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
            ),
        ),
        (
            "CHOWN",
            pod(json!({}), sc(json!({"capabilities": {"add": ["CHOWN"]}}))),
        ),
        (
            "chown in lower case",
            pod(json!({}), sc(json!({"capabilities": {"add": ["chown"]}}))),
        ),
        (
            "hostPath",
            pod(
                json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
                json!({}),
            ),
        ),
        (
            "hostPort",
            pod(
                json!({}),
                json!({"ports": [{"containerPort": 80, "hostPort": 80}]}),
            ),
        ),
        (
            "probe host",
            pod(
                json!({}),
                json!({"livenessProbe": {"httpGet": {"port": 80, "host": "10.0.0.1"}}}),
            ),
        ),
        (
            "hook host",
            pod(
                json!({}),
                json!({"lifecycle": {"postStart": {"httpGet": {"port": 80, "host": "10.0.0.1"}}}}),
            ),
        ),
        (
            "AppArmor Unconfined, pod",
            pod(
                sc(json!({"appArmorProfile": {"type": "Unconfined"}})),
                json!({}),
            ),
        ),
        (
            "AppArmor Unconfined, sidecar",
            pod(
                sidecar(json!({"appArmorProfile": {"type": "Unconfined"}})),
                json!({}),
            ),
        ),
        (
            "AppArmor RuntimeDefault",
            pod(
                json!({}),
                sc(json!({"appArmorProfile": {"type": "RuntimeDefault"}})),
            ),
        ),
        (
            "AppArmor annotation unconfined",
            annotated(
                pod(json!({}), json!({})),
                "container.apparmor.security.beta.kubernetes.io/spark-kubernetes-executor",
                "unconfined",
            ),
        ),
        (
            "seccomp annotation unconfined",
            annotated(
                pod(json!({}), json!({})),
                "seccomp.security.alpha.kubernetes.io/pod",
                "unconfined",
            ),
        ),
        (
            "SELinux spc_t",
            pod(sc(json!({"seLinuxOptions": {"type": "spc_t"}})), json!({})),
        ),
        (
            "SELinux container_engine_t",
            pod(
                json!({}),
                sc(json!({"seLinuxOptions": {"type": "container_engine_t", "level": "s0:c1,c2"}})),
            ),
        ),
        (
            "SELinux user",
            pod(
                json!({}),
                sc(json!({"seLinuxOptions": {"user": "system_u"}})),
            ),
        ),
        (
            "procMount Unmasked in a user namespace",
            pod(
                json!({"hostUsers": false}),
                sc(json!({"procMount": "Unmasked"})),
            ),
        ),
        (
            "seccomp Unconfined, pod",
            pod(
                sc(json!({"seccompProfile": {"type": "Unconfined"}})),
                json!({}),
            ),
        ),
        (
            "seccomp Unconfined, container",
            pod(
                json!({}),
                sc(json!({"seccompProfile": {"type": "Unconfined"}})),
            ),
        ),
        (
            "unsafe sysctl",
            pod(
                sc(json!({"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]})),
                json!({}),
            ),
        ),
        (
            "every safe sysctl",
            pod(sc(json!({"sysctls": safe_sysctls})), json!({})),
        ),
        (
            "explicit allowPrivilegeEscalation",
            pod(json!({}), sc(json!({"allowPrivilegeEscalation": true}))),
        ),
        (
            "restricted",
            pod(
                restricted_spec(json!({})),
                hardened(json!({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}})),
            ),
        ),
        (
            "restricted with NFS",
            pod(
                restricted_spec(
                    json!({"volumes": [{"name": "n", "nfs": {"server": "nfs", "path": "/"}}]}),
                ),
                hardened(json!({})),
            ),
        ),
        (
            "restricted as root",
            pod(
                restricted_spec(json!({})),
                hardened(json!({"runAsUser": 0})),
            ),
        ),
        (
            "restricted without runAsNonRoot",
            pod(
                json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}),
                hardened(json!({})),
            ),
        ),
        (
            "restricted without drop ALL",
            pod(
                restricted_spec(json!({})),
                json!({"securityContext": {"allowPrivilegeEscalation": false}}),
            ),
        ),
        (
            "restricted without seccomp",
            pod(
                json!({"securityContext": {"runAsNonRoot": true}}),
                hardened(json!({})),
            ),
        ),
        (
            "restricted, Unmasked in a user namespace",
            pod(
                restricted_spec(json!({"hostUsers": false})),
                hardened(json!({"procMount": "Unmasked"})),
            ),
        ),
    ]
}

/// Where the policy decides otherwise than the admission, on purpose: (case, level), in the
/// order of [`cases`].
const DIFFERENCES: &[(&str, PodSecurityLevel)] = &[
    // The policy ignores case and `CAP_` (the same capability, or none the runtime knows);
    // the admission compares the name as written.
    ("chown in lower case", PodSecurityLevel::Baseline),
    // The older seccomp annotation: this server ignores it (it no longer copies it into the
    // field), older ones honour it; the policy refuses it.
    ("seccomp annotation unconfined", PodSecurityLevel::Baseline),
    // The service's own rule: escalation asked for explicitly (baseline leaves it alone).
    (
        "explicit allowPrivilegeEscalation",
        PodSecurityLevel::Baseline,
    ),
];

#[tokio::test]
async fn the_policy_decides_as_pod_security_admission() {
    let Some(c) = RealBackend::start("pod-security").await else {
        return;
    };
    let admin = c.admin_client();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let levels = [
        (
            c.namespace().to_string(),
            PodSecurityLevel::Baseline,
            "baseline",
        ),
        (
            c.other_namespace().to_string(),
            PodSecurityLevel::Restricted,
            "restricted",
        ),
    ];
    for (ns, _, label) in &levels {
        let patch = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": label}}});
        namespaces
            .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("label the namespace");
    }
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut differences = Vec::new();
    let mut decided = 0;
    for (what, template) in cases() {
        let manifest: Pod = serde_json::from_value(template.clone()).expect(what);
        for (ns, level, _) in &levels {
            let policy = PodPolicy {
                level: *level,
                ..PodPolicy::default()
            };
            let use_ = TemplateUse {
                namespace: Some(ns),
                driver_pod_name: None,
            };
            let ours = policy.check(&manifest, use_);
            let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
            let admitted = match pods.create(&dry_run, &manifest).await {
                Ok(_) => true,
                Err(kube::Error::Api(status))
                    if status.code == 403 && status.message.contains("violates PodSecurity") =>
                {
                    false
                }
                // Privileged containers, before admission: kube-apiserver's default
                // `--allow-privileged=false`.
                Err(kube::Error::Api(status))
                    if status.code == 422
                        && status.message.contains("disallowed by cluster policy") =>
                {
                    false
                }
                Err(e) => panic!("{what} ({level:?}): not a valid pod: {e}"),
            };
            decided += 1;
            if ours.is_ok() != admitted {
                differences.push((what, *level, format!("{ours:?}")));
            }
        }
    }
    let found: Vec<(&str, PodSecurityLevel)> = differences
        .iter()
        .map(|(what, level, _)| (*what, *level))
        .collect();
    assert_eq!(found, DIFFERENCES, "{differences:#?}");
    assert_eq!(decided, cases().len() * 2);
}
