//! The pod policy (`pod_policy.rs`): one test per Pod Security Standards control, each
//! over its forms (pod level, every container kind — container, init container, sidecar,
//! ephemeral container — and annotations), then the service's own rules and settings.
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::allocator::pod_policy::{
    BASELINE_SYSCTLS, PodPolicy, PodSecurityLevel, PolicyViolation, TemplateUse,
};

const NS: &str = "team-a";
const DRIVER: &str = "driver-0";

fn at() -> TemplateUse<'static> {
    TemplateUse {
        namespace: Some(NS),
        driver_pod_name: Some(DRIVER),
    }
}

fn restricted() -> PodPolicy {
    PodPolicy {
        level: PodSecurityLevel::Restricted,
        ..PodPolicy::default()
    }
}

fn parse(template: &Value) -> Pod {
    serde_json::from_value(template.clone()).expect("test template")
}

fn check_with(policy: &PodPolicy, template: &Value) -> Result<(), PolicyViolation> {
    policy.check(&parse(template), at())
}

/// A pod with one executor container and `spec` merged into its spec.
fn pod(spec: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}]},
    });
    if let (Some(base), Value::Object(extra)) = (pod["spec"].as_object_mut(), spec) {
        base.extend(extra);
    }
    pod
}

/// The same pod with `metadata` set.
fn with_metadata(mut pod: Value, metadata: Value) -> Value {
    pod["metadata"] = metadata;
    pod
}

/// A pod with `fields` merged into the second container of each kind, and the path that
/// names that container: (kind, template, path).
fn in_each_container_kind(fields: &Value) -> Vec<(&'static str, Value, &'static str)> {
    let with = |base: Value| {
        let mut container = base;
        if let (Some(c), Some(extra)) = (container.as_object_mut(), fields.as_object()) {
            c.extend(extra.clone());
        }
        container
    };
    let plain = |name: &str| json!({"name": name, "image": "busybox"});
    vec![
        (
            "container",
            pod(json!({"containers": [plain("spark-kubernetes-executor"), with(plain("c"))]})),
            "spec.containers[1]",
        ),
        (
            "init container",
            pod(json!({"initContainers": [plain("first"), with(plain("init"))]})),
            "spec.initContainers[1]",
        ),
        (
            "sidecar",
            pod(json!({"initContainers": [
                plain("first"),
                with(json!({"name": "proxy", "image": "envoy", "restartPolicy": "Always"})),
            ]})),
            "spec.initContainers[1]",
        ),
        (
            "ephemeral container",
            pod(json!({"ephemeralContainers": [plain("debug-0"), with(plain("debug"))]})),
            "spec.ephemeralContainers[1]",
        ),
    ]
}

/// Asserts that `policy` refuses `template` naming `path`, and says which control.
#[track_caller]
fn refuses_with(policy: &PodPolicy, template: &Value, path: &str, control: &str) {
    let err = check_with(policy, template).expect_err(path);
    assert_eq!(err.path, path, "{template}");
    assert!(
        err.reason.contains(control),
        "{path}: the reason should name {control:?}: {}",
        err.reason
    );
}

#[track_caller]
fn refuses(template: &Value, path: &str, control: &str) {
    refuses_with(&PodPolicy::default(), template, path, control);
}

#[track_caller]
fn accepts(template: &Value) {
    if let Err(err) = check_with(&PodPolicy::default(), template) {
        panic!("refused {template}: {err}");
    }
}

/// Checks a container-level field in every container kind: `bad` refused at
/// `<container>.<suffix>`, `good` accepted.
#[track_caller]
fn each_kind_refuses(bad: &Value, suffix: &str, control: &str, good: &[Value]) {
    for (kind, template, container) in in_each_container_kind(bad) {
        let path = format!("{container}.{suffix}");
        let err = check_with(&PodPolicy::default(), &template).expect_err(kind);
        assert_eq!(err.path, path, "{kind}");
        assert!(err.reason.contains(control), "{kind}: {}", err.reason);
    }
    for fields in good {
        for (kind, template, _) in in_each_container_kind(fields) {
            if let Err(err) = check_with(&PodPolicy::default(), &template) {
                panic!("{kind} with {fields}: {err}");
            }
        }
    }
}

fn security_context(fields: Value) -> Value {
    json!({"securityContext": fields})
}

#[test]
fn host_process() {
    refuses(
        &pod(security_context(
            json!({"windowsOptions": {"hostProcess": true}}),
        )),
        "spec.securityContext.windowsOptions.hostProcess",
        "HostProcess",
    );
    accepts(&pod(security_context(
        json!({"windowsOptions": {"hostProcess": false}}),
    )));
    each_kind_refuses(
        &security_context(json!({"windowsOptions": {"hostProcess": true}})),
        "securityContext.windowsOptions.hostProcess",
        "HostProcess",
        &[security_context(
            json!({"windowsOptions": {"hostProcess": false, "runAsUserName": "spark"}}),
        )],
    );
}

#[test]
fn host_namespaces() {
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        refuses(
            &pod(json!({field: true})),
            &format!("spec.{field}"),
            "Host Namespaces",
        );
        accepts(&pod(json!({field: false})));
    }
}

#[test]
fn privileged_containers() {
    each_kind_refuses(
        &security_context(json!({"privileged": true})),
        "securityContext.privileged",
        "Privileged Containers",
        &[security_context(json!({"privileged": false}))],
    );
}

#[test]
fn capabilities() {
    each_kind_refuses(
        &security_context(json!({"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}})),
        "securityContext.capabilities.add[1]",
        "Capabilities",
        &[security_context(json!({"capabilities": {
            "add": ["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"],
            "drop": ["NET_RAW"],
        }}))],
    );
    // The `CAP_` prefix and case do not hide a capability.
    each_kind_refuses(
        &security_context(json!({"capabilities": {"add": ["cap_net_admin"]}})),
        "securityContext.capabilities.add[0]",
        "Capabilities",
        &[security_context(
            json!({"capabilities": {"add": ["CAP_CHOWN", "kill"]}}),
        )],
    );
}

#[test]
fn host_path_volumes() {
    refuses(
        &pod(json!({"volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "root", "hostPath": {"path": "/"}},
        ]})),
        "spec.volumes[1].hostPath",
        "HostPath Volumes",
    );
}

#[test]
fn host_ports() {
    each_kind_refuses(
        &json!({"ports": [{"containerPort": 7078}, {"containerPort": 80, "hostPort": 80}]}),
        "ports[1].hostPort",
        "Host Ports",
        &[json!({"ports": [{"containerPort": 7079, "hostPort": 0, "name": "blockmanager"}]})],
    );
}

#[test]
fn host_probes_and_lifecycle_hooks() {
    let probes = ["livenessProbe", "readinessProbe", "startupProbe"];
    for probe in probes {
        each_kind_refuses(
            &json!({probe: {"httpGet": {"port": 8080, "host": "10.0.0.1"}}}),
            &format!("{probe}.httpGet.host"),
            "Host Probes / Lifecycle Hooks",
            &[json!({probe: {"httpGet": {"port": 8080, "host": ""}}})],
        );
        each_kind_refuses(
            &json!({probe: {"tcpSocket": {"port": 22, "host": "metadata.internal"}}}),
            &format!("{probe}.tcpSocket.host"),
            "Host Probes / Lifecycle Hooks",
            &[json!({probe: {"tcpSocket": {"port": 22}}})],
        );
    }
    for hook in ["postStart", "preStop"] {
        for action in ["httpGet", "tcpSocket"] {
            each_kind_refuses(
                &json!({"lifecycle": {hook: {action: {"port": 80, "host": "169.254.169.254"}}}}),
                &format!("lifecycle.{hook}.{action}.host"),
                "Host Probes / Lifecycle Hooks",
                &[json!({"lifecycle": {hook: {action: {"port": 80}}}})],
            );
        }
    }
}

#[test]
fn app_armor() {
    refuses(
        &pod(security_context(
            json!({"appArmorProfile": {"type": "Unconfined"}}),
        )),
        "spec.securityContext.appArmorProfile.type",
        "AppArmor",
    );
    for allowed in [
        json!({"type": "RuntimeDefault"}),
        json!({"type": "Localhost", "localhostProfile": "spark"}),
    ] {
        accepts(&pod(security_context(json!({"appArmorProfile": allowed}))));
    }
    each_kind_refuses(
        &security_context(json!({"appArmorProfile": {"type": "Unconfined"}})),
        "securityContext.appArmorProfile.type",
        "AppArmor",
        &[security_context(
            json!({"appArmorProfile": {"type": "RuntimeDefault"}}),
        )],
    );
    // The annotation form, for any container name (the policy does not need it to match).
    let key = "container.apparmor.security.beta.kubernetes.io/spark-kubernetes-executor";
    refuses(
        &with_metadata(pod(json!({})), json!({"annotations": {key: "unconfined"}})),
        &format!("metadata.annotations[{key}]"),
        "AppArmor",
    );
    // A placeholder is refused as it stands: it could become `unconfined`.
    refuses(
        &with_metadata(
            pod(json!({})),
            json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/x": "{{APP_ID}}"}}),
        ),
        "metadata.annotations[container.apparmor.security.beta.kubernetes.io/x]",
        "AppArmor",
    );
    for allowed in ["runtime/default", "localhost/spark-{{APP_ID}}", ""] {
        accepts(&with_metadata(
            pod(json!({})),
            json!({"annotations": {key: allowed, "other.example.com/profile": "unconfined"}}),
        ));
    }
}

#[test]
fn se_linux() {
    for (options, field) in [
        (json!({"type": "spc_t"}), "type"),
        (json!({"type": "container_t", "user": "system_u"}), "user"),
        (json!({"role": "system_r"}), "role"),
    ] {
        refuses(
            &pod(security_context(json!({"seLinuxOptions": options}))),
            &format!("spec.securityContext.seLinuxOptions.{field}"),
            "SELinux",
        );
        each_kind_refuses(
            &security_context(json!({"seLinuxOptions": options})),
            &format!("securityContext.seLinuxOptions.{field}"),
            "SELinux",
            &[],
        );
    }
    let allowed = [
        "container_t",
        "container_init_t",
        "container_kvm_t",
        "container_engine_t",
        "",
    ]
    .map(|t| {
        security_context(
            json!({"seLinuxOptions": {"type": t, "level": "s0:c123,c456", "user": ""}}),
        )
    });
    for options in &allowed {
        accepts(&pod(options.clone()));
    }
    each_kind_refuses(
        &security_context(json!({"seLinuxOptions": {"type": "unconfined_t"}})),
        "securityContext.seLinuxOptions.type",
        "SELinux",
        &allowed,
    );
}

#[test]
fn proc_mount_type() {
    each_kind_refuses(
        &security_context(json!({"procMount": "Unmasked"})),
        "securityContext.procMount",
        "/proc Mount Type",
        &[security_context(json!({"procMount": "Default"}))],
    );
    // In a user namespace baseline accepts any value (v1.35+), restricted still refuses.
    let unmasked = pod(json!({
        "hostUsers": false,
        "containers": [{"name": "c", "image": "i", "securityContext": {"procMount": "Unmasked"}}],
    }));
    accepts(&unmasked);
    refuses_with(
        &restricted(),
        &unmasked,
        "spec.containers[0].securityContext.procMount",
        "/proc Mount Type",
    );
}

#[test]
fn seccomp() {
    refuses(
        &pod(security_context(
            json!({"seccompProfile": {"type": "Unconfined"}}),
        )),
        "spec.securityContext.seccompProfile.type",
        "Seccomp",
    );
    for allowed in [
        json!({"type": "RuntimeDefault"}),
        json!({"type": "Localhost", "localhostProfile": "profiles/spark.json"}),
    ] {
        accepts(&pod(security_context(json!({"seccompProfile": allowed}))));
    }
    each_kind_refuses(
        &security_context(json!({"seccompProfile": {"type": "Unconfined"}})),
        "securityContext.seccompProfile.type",
        "Seccomp",
        &[security_context(
            json!({"seccompProfile": {"type": "RuntimeDefault"}}),
        )],
    );
    // The older annotation forms, for the pod and a container.
    for key in [
        "seccomp.security.alpha.kubernetes.io/pod",
        "container.seccomp.security.alpha.kubernetes.io/spark-kubernetes-executor",
    ] {
        refuses(
            &with_metadata(pod(json!({})), json!({"annotations": {key: "unconfined"}})),
            &format!("metadata.annotations[{key}]"),
            "Seccomp",
        );
        for allowed in ["runtime/default", "docker/default", "localhost/spark.json"] {
            accepts(&with_metadata(
                pod(json!({})),
                json!({"annotations": {key: allowed}}),
            ));
        }
    }
}

#[test]
fn sysctls() {
    let sysctls = |names: &[&str]| {
        let list: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "value": "1"}))
            .collect();
        pod(security_context(json!({"sysctls": list})))
    };
    for unsafe_ in [
        "kernel.msgmax",
        "kernel.shm_rmid_forced.x",
        "net.core.somaxconn",
        "vm.max_map_count",
        // The slash form of a safe name: the admission compares names as written.
        "kernel/shm_rmid_forced",
    ] {
        refuses(
            &sysctls(&["net.ipv4.tcp_syncookies", unsafe_]),
            "spec.securityContext.sysctls[1].name",
            "Sysctls",
        );
    }
    accepts(&sysctls(BASELINE_SYSCTLS));
    assert_eq!(BASELINE_SYSCTLS.len(), 14);
}

#[test]
fn restricted_volume_types() {
    let allowed = json!({"volumes": [
        {"name": "a", "configMap": {"name": "conf"}},
        {"name": "b", "csi": {"driver": "csi.example.com"}},
        {"name": "c", "downwardAPI": {}},
        {"name": "d", "emptyDir": {}},
        {"name": "e", "ephemeral": {}},
        {"name": "f", "image": {"reference": "data:1"}},
        {"name": "g", "persistentVolumeClaim": {"claimName": "pvc-{{EXECUTOR_ID}}"}},
        {"name": "h", "projected": {"sources": []}},
        {"name": "i", "secret": {"secretName": "s"}},
    ]});
    let compliant = restricted_pod(allowed);
    check_with(&restricted(), &compliant).expect("every allowed type");
    for (kind, source) in [
        ("nfs", json!({"server": "nfs", "path": "/"})),
        (
            "gitRepo",
            json!({"repository": "https://example.com/r.git"}),
        ),
        ("iscsi", json!({"targetPortal": "t", "iqn": "i", "lun": 0})),
        ("rbd", json!({"monitors": ["m"], "image": "i"})),
        ("cephfs", json!({"monitors": ["m"]})),
        ("flexVolume", json!({"driver": "d"})),
        ("azureFile", json!({"secretName": "s", "shareName": "x"})),
        ("hostPath", json!({"path": "/"})),
    ] {
        let template = restricted_pod(json!({"volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "v", kind: source},
        ]}));
        // hostPath is baseline's already; baseline accepts the others.
        let control = match kind {
            "hostPath" => "HostPath Volumes",
            _ => {
                accepts(&template);
                "Volume Types"
            }
        };
        refuses_with(
            &restricted(),
            &template,
            &format!("spec.volumes[1].{kind}"),
            control,
        );
    }
}

/// A pod that meets `restricted` in every container kind, with `spec` merged in.
fn restricted_pod(spec: Value) -> Value {
    let context = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    });
    let container =
        |name: &str| json!({"name": name, "image": "spark:4", "securityContext": context});
    let mut template = pod(json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 185, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container("spark-kubernetes-executor")],
        "initContainers": [container("init")],
        "ephemeralContainers": [container("debug")],
    }));
    if let (Some(base), Value::Object(extra)) = (template["spec"].as_object_mut(), spec) {
        base.extend(extra);
    }
    template
}

/// Edits of [`restricted_pod`] at `pointer` (a JSON pointer) that `restricted` refuses at
/// `path`: (pointer, new value, path).
#[track_caller]
fn restricted_refuses(edits: &[(&str, Value, &str)], control: &str) {
    for (pointer, value, path) in edits {
        let mut template = restricted_pod(json!({}));
        match template.pointer_mut(pointer) {
            Some(slot) => *slot = value.clone(),
            None => panic!("no {pointer} in the restricted pod"),
        }
        refuses_with(&restricted(), &template, path, control);
    }
}

#[test]
fn restricted_accepts_a_compliant_pod_and_baseline_what_restricted_refuses() {
    check_with(&restricted(), &restricted_pod(json!({}))).expect("compliant");
    // What Spark builds without a securityContext is baseline, not restricted.
    accepts(&pod(json!({})));
    refuses_with(
        &restricted(),
        &pod(json!({})),
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "Privilege Escalation",
    );
}

#[test]
fn restricted_privilege_escalation() {
    let kinds = ["initContainers", "containers", "ephemeralContainers"];
    for kind in kinds {
        for value in [Value::Null, json!(true)] {
            let pointer = format!("/spec/{kind}/0/securityContext/allowPrivilegeEscalation");
            let mut template = restricted_pod(json!({}));
            if let Some(slot) = template.pointer_mut(&pointer) {
                *slot = value.clone();
            }
            refuses_with(
                &restricted(),
                &template,
                &format!("spec.{kind}[0].securityContext.allowPrivilegeEscalation"),
                "Privilege Escalation",
            );
        }
    }
    // Windows pods are exempt.
    let mut windows = restricted_pod(json!({"os": {"name": "windows"}}));
    for kind in kinds {
        if let Some(context) = windows.pointer_mut(&format!("/spec/{kind}/0/securityContext")) {
            *context = json!({});
        }
    }
    check_with(&restricted(), &windows).expect("windows exempt");
}

#[test]
fn restricted_running_as_non_root() {
    restricted_refuses(
        &[
            (
                "/spec/securityContext/runAsNonRoot",
                json!(false),
                "spec.securityContext.runAsNonRoot",
            ),
            (
                "/spec/securityContext/runAsNonRoot",
                Value::Null,
                "spec.initContainers[0].securityContext.runAsNonRoot",
            ),
        ],
        "Running as Non-root",
    );
    for kind in ["initContainers", "containers", "ephemeralContainers"] {
        let mut template = restricted_pod(json!({}));
        if let Some(context) = template.pointer_mut(&format!("/spec/{kind}/0/securityContext")) {
            context["runAsNonRoot"] = json!(false);
        }
        refuses_with(
            &restricted(),
            &template,
            &format!("spec.{kind}[0].securityContext.runAsNonRoot"),
            "Running as Non-root",
        );
    }
    // Each container saying so is enough; so is a user namespace.
    let mut each = restricted_pod(json!({}));
    each["spec"]["securityContext"]["runAsNonRoot"] = Value::Null;
    for kind in ["initContainers", "containers", "ephemeralContainers"] {
        each["spec"][kind][0]["securityContext"]["runAsNonRoot"] = json!(true);
    }
    check_with(&restricted(), &each).expect("every container");
    let mut user_namespace = restricted_pod(json!({"hostUsers": false}));
    user_namespace["spec"]["securityContext"]["runAsNonRoot"] = json!(false);
    user_namespace["spec"]["securityContext"]["runAsUser"] = json!(0);
    check_with(&restricted(), &user_namespace).expect("hostUsers: false");
}

#[test]
fn restricted_running_as_non_root_user() {
    restricted_refuses(
        &[
            (
                "/spec/securityContext/runAsUser",
                json!(0),
                "spec.securityContext.runAsUser",
            ),
            (
                "/spec/containers/0/securityContext",
                json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "runAsUser": 0}),
                "spec.containers[0].securityContext.runAsUser",
            ),
            (
                "/spec/ephemeralContainers/0/securityContext",
                json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "runAsUser": 0}),
                "spec.ephemeralContainers[0].securityContext.runAsUser",
            ),
        ],
        "Running as Non-root user",
    );
}

#[test]
fn restricted_seccomp() {
    restricted_refuses(
        &[(
            "/spec/securityContext/seccompProfile",
            Value::Null,
            "spec.initContainers[0].securityContext.seccompProfile.type",
        )],
        "Seccomp",
    );
    // Set in every container instead of the pod.
    let mut each = restricted_pod(json!({}));
    each["spec"]["securityContext"]["seccompProfile"] = Value::Null;
    for kind in ["initContainers", "containers", "ephemeralContainers"] {
        each["spec"][kind][0]["securityContext"]["seccompProfile"] =
            json!({"type": "Localhost", "localhostProfile": "spark.json"});
    }
    check_with(&restricted(), &each).expect("every container");
    each["spec"]["ephemeralContainers"][0]["securityContext"]["seccompProfile"] = Value::Null;
    refuses_with(
        &restricted(),
        &each,
        "spec.ephemeralContainers[0].securityContext.seccompProfile.type",
        "Seccomp",
    );
}

#[test]
fn restricted_capabilities() {
    let context = |capabilities: Value| json!({"allowPrivilegeEscalation": false, "capabilities": capabilities});
    restricted_refuses(
        &[
            (
                "/spec/containers/0/securityContext",
                context(json!({"drop": ["NET_RAW"]})),
                "spec.containers[0].securityContext.capabilities.drop",
            ),
            (
                "/spec/initContainers/0/securityContext",
                context(json!({"drop": ["all"]})),
                "spec.initContainers[0].securityContext.capabilities.drop",
            ),
            (
                "/spec/ephemeralContainers/0/securityContext",
                context(json!({"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CHOWN"]})),
                "spec.ephemeralContainers[0].securityContext.capabilities.add[1]",
            ),
        ],
        "Capabilities",
    );
}

#[test]
fn restricted_contradicting_settings_are_named() {
    let escalation = PodPolicy {
        allow_privilege_escalation: true,
        ..restricted()
    };
    assert_eq!(
        escalation.check_settings().map_err(|(key, _)| key),
        Err("allow_privilege_escalation")
    );
    let host_path = PodPolicy {
        allow_host_path: true,
        ..restricted()
    };
    assert_eq!(
        host_path.check_settings().map_err(|(key, _)| key),
        Err("allow_host_path")
    );
    assert_eq!(restricted().check_settings(), Ok(()));
    let baseline = PodPolicy {
        allow_host_path: true,
        allow_privilege_escalation: true,
        ..PodPolicy::default()
    };
    assert_eq!(baseline.check_settings(), Ok(()));
}

/// The service's own rules: one row per rule (the template and the path refused).
#[test]
fn each_service_rule_refuses_its_path() {
    let rows: &[(Value, &str)] = &[
        (
            pod(json!({"containers": [
                {"name": "a", "image": "i"},
                {"name": "c", "image": "i", "securityContext": {"allowPrivilegeEscalation": true}},
            ]})),
            "spec.containers[1].securityContext.allowPrivilegeEscalation",
        ),
        (pod(json!({"nodeName": "node-1"})), "spec.nodeName"),
        (
            pod(json!({"schedulerName": "my-scheduler"})),
            "spec.schedulerName",
        ),
        (
            pod(json!({"serviceAccountName": "cluster-admin"})),
            "spec.serviceAccountName",
        ),
        (
            pod(json!({"serviceAccount": "cluster-admin"})),
            "spec.serviceAccount",
        ),
        (
            with_metadata(
                pod(json!({})),
                json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "victim", "uid": "u"}]}),
            ),
            "metadata.ownerReferences[0]",
        ),
        (
            with_metadata(
                pod(json!({})),
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "other-driver", "uid": "u"}]}),
            ),
            "metadata.ownerReferences[0]",
        ),
        (
            with_metadata(
                pod(json!({})),
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": DRIVER, "uid": "u", "blockOwnerDeletion": true}]}),
            ),
            "metadata.ownerReferences[0].blockOwnerDeletion",
        ),
        (
            with_metadata(pod(json!({})), json!({"finalizers": ["example.com/keep"]})),
            "metadata.finalizers[0]",
        ),
        (
            with_metadata(pod(json!({})), json!({"namespace": "kube-system"})),
            "metadata.namespace",
        ),
    ];
    for (template, path) in rows {
        let err = check_with(&PodPolicy::default(), template).expect_err(path);
        assert_eq!(err.path, *path, "{template}");
        assert!(!err.reason.is_empty());
    }
}

#[test]
fn what_spark_puts_in_an_executor_pod_is_accepted() {
    let spark = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "namespace": NS,
            "labels": {"spark-role": "executor"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": DRIVER, "uid": "u-1", "controller": true}],
        },
        "spec": {
            "serviceAccountName": "default", "restartPolicy": "Never",
            "containers": [{
                "name": "spark-kubernetes-executor", "image": "spark:4",
                "ports": [{"name": "blockmanager", "containerPort": 7079}],
                // Decommissioning's hook (spark.decommission.enabled).
                "lifecycle": {"preStop": {"exec": {"command": ["/opt/decom.sh"]}}},
                "securityContext": {"privileged": false, "allowPrivilegeEscalation": false,
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}},
            }],
            "volumes": [
                {"name": "spark-local-dir-1", "emptyDir": {}},
                {"name": "spark-conf-volume-exec", "configMap": {"name": "spark-exec-conf-map"}},
            ],
        },
    });
    accepts(&spark);
    accepts(&pod(json!({})));
    accepts(&with_metadata(pod(json!({})), json!({"namespace": NS})));
    // A template with no spec at all still has its annotations checked.
    let bare = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"annotations": {
        "seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}});
    refuses(
        &bare,
        "metadata.annotations[seccomp.security.alpha.kubernetes.io/pod]",
        "Seccomp",
    );
}

/// What Spark's Volcano and YuniKorn feature steps and a Kueue queue put on an executor
/// pod: each passes with its scheduler in `scheduler_names`, and only then.
#[test]
fn gang_scheduler_pods_pass_when_their_scheduler_is_allowed() {
    let volcano = with_metadata(
        pod(json!({"schedulerName": "volcano"})),
        json!({"annotations": {"scheduling.k8s.io/group-name": "{{APP_ID}}-podgroup",
            "volcano.sh/queue-name": "spark"}}),
    );
    let yunikorn = with_metadata(
        pod(json!({"schedulerName": "yunikorn"})),
        json!({
            "labels": {"applicationId": "{{APP_ID}}", "queue": "root.spark"},
            "annotations": {"yunikorn.apache.org/app-id": "{{APP_ID}}",
                "yunikorn.apache.org/task-group-name": "spark-executor",
                "yunikorn.apache.org/task-groups":
                    r#"[{"name":"spark-executor","minMember":4,"minResource":{"cpu":"1"}}]"#},
        }),
    );
    let kueue = with_metadata(
        pod(json!({})),
        json!({"labels": {"kueue.x-k8s.io/queue-name": "team-a-queue"}}),
    );
    for template in [
        &volcano,
        &yunikorn,
        &kueue,
        &pod(json!({"schedulerName": ""})),
    ] {
        accepts(template);
    }
    let only_volcano = PodPolicy {
        scheduler_names: vec!["volcano".into()],
        ..PodPolicy::default()
    };
    check_with(&only_volcano, &volcano).expect("volcano is allowed");
    // Unset is the cluster's default scheduler, whatever the list says.
    check_with(&only_volcano, &kueue).expect("the default scheduler");
    let err = check_with(&only_volcano, &yunikorn).unwrap_err();
    assert_eq!(err.path, "spec.schedulerName");
    assert!(
        err.reason.contains("\"yunikorn\"") && err.reason.contains("pod_policy.scheduler_names"),
        "{}",
        err.reason
    );
    let explicit_default = pod(json!({"schedulerName": "default-scheduler"}));
    accepts(&explicit_default);
    let err = check_with(&only_volcano, &explicit_default).unwrap_err();
    assert_eq!(err.path, "spec.schedulerName");
}

#[test]
fn configured_allowances_accept_what_they_name() {
    let policy = PodPolicy {
        allowed_service_accounts: vec!["default".into(), "spark".into()],
        allowed_capabilities: vec!["sys_ptrace".into()],
        allow_host_namespaces: true,
        allow_privileged: true,
        allow_host_path: true,
        allowed_finalizers: vec!["example.com/keep".into()],
        ..PodPolicy::default()
    };
    let template = with_metadata(
        pod(json!({
            "hostNetwork": true, "serviceAccountName": "spark",
            "volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}],
            "containers": [{"name": "c", "image": "i", "securityContext": {
                "privileged": true, "capabilities": {"add": ["CAP_SYS_PTRACE"]}}}],
        })),
        json!({"finalizers": ["example.com/keep"]}),
    );
    let without_driver = TemplateUse {
        namespace: Some(NS),
        driver_pod_name: None,
    };
    policy
        .check(&parse(&template), without_driver)
        .expect("allowed");
    // The controls without a key stay on.
    let host_port = pod(json!({"hostNetwork": true, "containers": [
        {"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 80}]}]}));
    let err = policy
        .check(&parse(&host_port), without_driver)
        .unwrap_err();
    assert_eq!(err.path, "spec.containers[0].ports[0].hostPort");
    let off = PodPolicy {
        enforce: false,
        ..restricted()
    };
    let hostile = with_metadata(
        pod(
            json!({"nodeName": "n", "hostPID": true, "securityContext": {
            "sysctls": [{"name": "kernel.core_pattern", "value": "|/x"}]}}),
        ),
        json!({"namespace": "kube-system"}),
    );
    off.check(&parse(&hostile), without_driver)
        .expect("not enforced");
}

#[test]
fn an_owner_needs_a_driver_and_a_default_template_no_namespace() {
    let owned = with_metadata(
        pod(json!({})),
        json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": DRIVER, "uid": "u"}]}),
    );
    let without_driver = TemplateUse {
        namespace: Some(NS),
        driver_pod_name: None,
    };
    let err = PodPolicy::default()
        .check(&parse(&owned), without_driver)
        .unwrap_err();
    assert_eq!(err.path, "metadata.ownerReferences[0]");
    let namespaced = with_metadata(pod(json!({})), json!({"namespace": NS}));
    let default_template = TemplateUse {
        namespace: None,
        driver_pod_name: None,
    };
    let err = PodPolicy::default()
        .check(&parse(&namespaced), default_template)
        .unwrap_err();
    assert_eq!(err.path, "metadata.namespace");
}

fn claim(value: Value) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    serde_json::from_value(value).expect("test claim")
}

#[test]
fn claims_are_held_to_the_allowed_storage_classes_and_the_size_cap() {
    let sized = |class: &str, size: &str| {
        claim(json!({"metadata": {"name": "c"},
            "spec": {"storageClassName": class, "resources": {"requests": {"storage": size}}}}))
    };
    let default = PodPolicy::default();
    assert_eq!(default.check_claim(&sized("gp3", "1Ti")), Ok(()));
    let too_big = default.check_claim(&sized("gp3", "1025Gi")).unwrap_err();
    assert_eq!(too_big.path, "spec.resources.requests.storage");
    assert!(
        too_big.reason.contains("pod_policy.max_claim_size"),
        "{too_big}"
    );
    let unset = default
        .check_claim(&claim(json!({"metadata": {"name": "c"}, "spec": {}})))
        .unwrap_err();
    assert_eq!(unset.path, "spec.resources.requests.storage");
    let owned = claim(json!({"metadata": {"name": "c", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "u"}]}}));
    assert_eq!(
        default.check_claim(&owned).unwrap_err().path,
        "metadata.ownerReferences"
    );

    let policy: PodPolicy = serde_json::from_value(json!({
        "allowed_storage_classes": ["gp3"], "max_claim_size": "100Gi"
    }))
    .unwrap();
    assert_eq!(policy.check_claim(&sized("gp3", "100Gi")), Ok(()));
    let class = policy.check_claim(&sized("io2", "10Gi")).unwrap_err();
    assert_eq!(class.path, "spec.storageClassName");
    assert!(
        class.reason.contains("pod_policy.allowed_storage_classes"),
        "{class}"
    );
    // No class: the cluster's default class, always accepted.
    let no_class = claim(json!({"metadata": {"name": "c"},
        "spec": {"resources": {"requests": {"storage": "1Gi"}}}}));
    assert_eq!(policy.check_claim(&no_class), Ok(()));
    assert!(serde_json::from_value::<PodPolicy>(json!({"max_claim_size": "lots"})).is_err());
    // Not enforced: anything goes.
    let off = PodPolicy {
        enforce: false,
        ..policy
    };
    assert_eq!(off.check_claim(&sized("io2", "100Ti")), Ok(()));
}

/// A claim spec of 10Gi with `extra` merged in (and `annotations` on its metadata).
fn claim_with(extra: Value, annotations: Value) -> Value {
    let mut spec = json!({"resources": {"requests": {"storage": "10Gi"}}});
    for (key, value) in extra.as_object().cloned().unwrap_or_default() {
        spec[key] = value;
    }
    json!({"metadata": {"name": "c", "annotations": annotations}, "spec": spec})
}

#[test]
fn claims_may_not_reach_volumes_or_namespaces_beyond_their_own_unless_allowed() {
    let default = PodPolicy::default();
    let rows = [
        (
            json!({"volumeName": "pv-released"}),
            "spec.volumeName",
            "allow_claim_volume_name",
        ),
        (
            json!({"selector": {"matchLabels": {"tenant": "b"}}}),
            "spec.selector",
            "allow_claim_selector",
        ),
        (
            json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "x", "namespace": "team-b"}}),
            "spec.dataSourceRef.namespace",
            "allow_claim_data_source_namespace",
        ),
    ];
    for (extra, path, key) in rows {
        let refused = default
            .check_claim(&claim(claim_with(extra.clone(), json!({}))))
            .unwrap_err();
        assert_eq!(refused.path, path);
        assert!(
            refused.reason.contains(&format!("pod_policy.{key}")),
            "{refused}"
        );
        let allowed: PodPolicy = serde_json::from_value(json!({key: true})).unwrap();
        assert_eq!(
            allowed.check_claim(&claim(claim_with(extra, json!({})))),
            Ok(())
        );
    }
    // A same-namespace data source is the caller's own.
    let own_source = json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"},
        "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "x"}});
    assert_eq!(
        default.check_claim(&claim(claim_with(own_source, json!({})))),
        Ok(())
    );

    // The beta annotation names a class as well (and wins over the field).
    let gp3_only: PodPolicy =
        serde_json::from_value(json!({"allowed_storage_classes": ["gp3"]})).unwrap();
    let annotated = |class: &str| {
        claim(claim_with(
            json!({"storageClassName": "gp3"}),
            json!({"volume.beta.kubernetes.io/storage-class": class}),
        ))
    };
    let refused = gp3_only.check_claim(&annotated("fast-local")).unwrap_err();
    assert_eq!(
        refused.path,
        "metadata.annotations[volume.beta.kubernetes.io/storage-class]"
    );
    assert!(
        refused.reason.contains("allowed_storage_classes"),
        "{refused}"
    );
    assert_eq!(gp3_only.check_claim(&annotated("gp3")), Ok(()));
}

#[test]
fn ephemeral_volumes_meet_the_claim_policy() {
    let ephemeral = |spec: Value| {
        pod(json!({"volumes": [
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}
        ]}))
    };
    let default = PodPolicy::default();
    let fine =
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}});
    assert_eq!(check_with(&default, &ephemeral(fine)), Ok(()));
    let prefix = "spec.volumes[1].ephemeral.volumeClaimTemplate.spec";
    let rows = [
        (
            json!({"volumeName": "pv-x", "resources": {"requests": {"storage": "1Gi"}}}),
            "volumeName",
        ),
        (
            json!({"selector": {"matchLabels": {"a": "b"}}, "resources": {"requests": {"storage": "1Gi"}}}),
            "selector",
        ),
        (
            json!({"resources": {"requests": {"storage": "2Ti"}}}),
            "resources.requests.storage",
        ),
        (json!({}), "resources.requests.storage"),
    ];
    for (spec, field) in rows {
        let refused = check_with(&default, &ephemeral(spec)).unwrap_err();
        assert_eq!(refused.path, format!("{prefix}.{field}"));
    }
    let gp3_only: PodPolicy =
        serde_json::from_value(json!({"allowed_storage_classes": ["gp3"]})).unwrap();
    let io2 = json!({"storageClassName": "io2", "resources": {"requests": {"storage": "1Gi"}}});
    let refused = check_with(&gp3_only, &ephemeral(io2)).unwrap_err();
    assert_eq!(refused.path, format!("{prefix}.storageClassName"));
}

/// What a caller may set within its own rights (the namespace's admission and quota judge
/// it, as they would the caller's own pods) passes both levels: a priority class,
/// tolerations, the service account token's mount, scheduling gates.
#[test]
fn fields_within_the_callers_own_rights_pass_the_policy() {
    let template = pod(json!({
        "priorityClassName": "high-priority",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "spark",
            "effect": "NoSchedule"}],
        "automountServiceAccountToken": true,
        "schedulingGates": [{"name": "example.com/quota-check"}],
    }));
    assert_eq!(check_with(&PodPolicy::default(), &template), Ok(()));
    let restricted_template = pod(json!({
        "priorityClassName": "high-priority",
        "tolerations": [{"operator": "Exists"}],
        "automountServiceAccountToken": true,
        "schedulingGates": [{"name": "example.com/quota-check"}],
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "spark-kubernetes-executor", "image": "spark:4",
            "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}}}],
    }));
    assert_eq!(check_with(&restricted(), &restricted_template), Ok(()));
}
