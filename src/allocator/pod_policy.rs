//! What an executor pod template may ask for. The service creates pods with its own
//! identity, so a template must not get more than a driver's own pods would: the policy
//! refuses, before any pod is built, what would let a caller escape the pod (privileged
//! containers, host namespaces and paths, added capabilities), run elsewhere or as
//! someone else (`nodeName`, another service account, another namespace) or hold objects
//! it does not own (foreign owner references, finalizers, `blockOwnerDeletion`). The
//! namespace's Pod Security admission still applies on a real cluster; this refuses early,
//! naming the template path at fault.
use k8s_openapi::api::core::v1::{Capabilities, Pod, SecurityContext};
use serde::Deserialize;

/// Rules every template is checked against; strict unless configured otherwise
/// (`pod_policy` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PodPolicy {
    /// `false` accepts every template as given (a cluster whose admission control does the
    /// same job); default `true`.
    pub enforce: bool,
    /// Containers with `securityContext.privileged: true`.
    pub allow_privileged: bool,
    /// Containers with an explicit `securityContext.allowPrivilegeEscalation: true` (unset is
    /// accepted: it is Kubernetes' default and Spark's pods leave it unset).
    pub allow_privilege_escalation: bool,
    /// Capabilities a container may add (`CAP_` prefix and case ignored); default Pod
    /// Security's `baseline` list.
    pub allowed_capabilities: Vec<String>,
    /// `hostPath` volumes.
    pub allow_host_path: bool,
    /// `hostNetwork`, `hostPID` and `hostIPC`.
    pub allow_host_namespaces: bool,
    /// `spec.nodeName` (bypasses the scheduler and its quotas of placement).
    pub allow_node_name: bool,
    /// Service accounts executor pods may run as (`spec.serviceAccountName`, unset = the
    /// namespace's `default`); default `["default"]`.
    pub allowed_service_accounts: Vec<String>,
    /// Finalizers a template may carry; default none.
    pub allowed_finalizers: Vec<String>,
}

/// Pod Security Standards, `baseline` profile: the capabilities it lets a container add.
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

impl Default for PodPolicy {
    fn default() -> Self {
        Self {
            enforce: true,
            allow_privileged: false,
            allow_privilege_escalation: false,
            allowed_capabilities: BASELINE_CAPABILITIES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            allow_host_path: false,
            allow_host_namespaces: false,
            allow_node_name: false,
            allowed_service_accounts: vec!["default".to_string()],
            allowed_finalizers: Vec::new(),
        }
    }
}

/// Where a template is used: the application's namespace and driver pod.
#[derive(Debug, Clone, Copy)]
pub struct TemplateUse<'a> {
    /// The namespace its pods are created in; `None` when checking a configured default
    /// template, which no namespace is known for yet (a namespace in it is then refused).
    pub namespace: Option<&'a str>,
    /// The driver pod, the one owner a template may name (Spark's own executor pods are
    /// owned by it).
    pub driver_pod_name: Option<&'a str>,
}

/// A rule a template breaks: the path in the template (`spec.hostNetwork`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct PolicyViolation {
    pub path: String,
    pub reason: String,
}

fn violation(path: impl Into<String>, reason: impl Into<String>) -> Result<(), PolicyViolation> {
    Err(PolicyViolation {
        path: path.into(),
        reason: reason.into(),
    })
}

/// `CAP_SYS_ADMIN` and `sys_admin` are the same capability.
fn capability_name(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    upper
        .strip_prefix("CAP_")
        .map_or(upper.clone(), str::to_string)
}

impl PodPolicy {
    /// The first rule `pod` breaks, in the order metadata, pod spec, volumes, then each
    /// container (init, regular, ephemeral) in order.
    pub fn check(&self, pod: &Pod, use_: TemplateUse<'_>) -> Result<(), PolicyViolation> {
        if !self.enforce {
            return Ok(());
        }
        self.check_metadata(pod, use_)?;
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let host = [
            ("spec.hostNetwork", spec.host_network),
            ("spec.hostPID", spec.host_pid),
            ("spec.hostIPC", spec.host_ipc),
        ];
        for (path, value) in host {
            if value == Some(true) && !self.allow_host_namespaces {
                violation(
                    path,
                    "host namespaces are not allowed (pod_policy.allow_host_namespaces)",
                )?;
            }
        }
        if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) && !self.allow_node_name {
            violation(
                "spec.nodeName",
                "pinning executors to a node is not allowed (pod_policy.allow_node_name); \
                 use nodeSelector or affinity",
            )?;
        }
        let accounts = [
            ("spec.serviceAccountName", &spec.service_account_name),
            ("spec.serviceAccount", &spec.service_account),
        ];
        for (path, account) in accounts {
            if let Some(account) = account.as_deref().filter(|a| !a.is_empty())
                && !self.allowed_service_accounts.iter().any(|a| a == account)
            {
                violation(
                    path,
                    format!(
                        "service account {account:?} is not allowed (pod_policy.allowed_service_accounts: {:?})",
                        self.allowed_service_accounts
                    ),
                )?;
            }
        }
        for (i, volume) in spec.volumes.iter().flatten().enumerate() {
            if volume.host_path.is_some() && !self.allow_host_path {
                violation(
                    format!("spec.volumes[{i}].hostPath"),
                    "hostPath volumes are not allowed (pod_policy.allow_host_path)",
                )?;
            }
        }
        let containers = (spec.init_containers.iter().flatten().enumerate())
            .map(|(i, c)| (format!("spec.initContainers[{i}]"), &c.security_context))
            .chain(
                (spec.containers.iter().enumerate())
                    .map(|(i, c)| (format!("spec.containers[{i}]"), &c.security_context)),
            )
            .chain(
                (spec.ephemeral_containers.iter().flatten().enumerate()).map(|(i, c)| {
                    (
                        format!("spec.ephemeralContainers[{i}]"),
                        &c.security_context,
                    )
                }),
            );
        for (path, context) in containers {
            if let Some(context) = context {
                self.check_container(&path, context)?;
            }
        }
        Ok(())
    }

    fn check_metadata(&self, pod: &Pod, use_: TemplateUse<'_>) -> Result<(), PolicyViolation> {
        let meta = &pod.metadata;
        if let Some(namespace) = meta.namespace.as_deref().filter(|n| !n.is_empty()) {
            match use_.namespace {
                Some(expected) if expected == namespace => {}
                Some(expected) => violation(
                    "metadata.namespace",
                    format!(
                        "{namespace:?} is not the application's namespace {expected:?} \
                         (leave it out)"
                    ),
                )?,
                None => violation(
                    "metadata.namespace",
                    "a default template must not name a namespace (each application's applies)",
                )?,
            }
        }
        for (i, owner) in meta.owner_references.iter().flatten().enumerate() {
            let is_driver = owner.kind == "Pod"
                && owner.api_version == "v1"
                && use_.driver_pod_name == Some(owner.name.as_str());
            if !is_driver {
                violation(
                    format!("metadata.ownerReferences[{i}]"),
                    format!(
                        "{} {:?} is not the application's driver pod: executor pods are owned \
                         by their driver only",
                        owner.kind, owner.name
                    ),
                )?;
            }
            if owner.block_owner_deletion == Some(true) {
                violation(
                    format!("metadata.ownerReferences[{i}].blockOwnerDeletion"),
                    "blockOwnerDeletion is not allowed",
                )?;
            }
        }
        for (i, finalizer) in meta.finalizers.iter().flatten().enumerate() {
            if !self.allowed_finalizers.iter().any(|f| f == finalizer) {
                violation(
                    format!("metadata.finalizers[{i}]"),
                    format!(
                        "finalizer {finalizer:?} is not allowed (pod_policy.allowed_finalizers)"
                    ),
                )?;
            }
        }
        Ok(())
    }

    fn check_container(
        &self,
        path: &str,
        context: &SecurityContext,
    ) -> Result<(), PolicyViolation> {
        if context.privileged == Some(true) && !self.allow_privileged {
            violation(
                format!("{path}.securityContext.privileged"),
                "privileged containers are not allowed (pod_policy.allow_privileged)",
            )?;
        }
        if context.allow_privilege_escalation == Some(true) && !self.allow_privilege_escalation {
            violation(
                format!("{path}.securityContext.allowPrivilegeEscalation"),
                "privilege escalation is not allowed (pod_policy.allow_privilege_escalation)",
            )?;
        }
        if let Some(Capabilities { add: Some(add), .. }) = &context.capabilities {
            let allowed: Vec<String> = self
                .allowed_capabilities
                .iter()
                .map(|c| capability_name(c))
                .collect();
            for (i, capability) in add.iter().enumerate() {
                if !allowed.contains(&capability_name(capability)) {
                    violation(
                        format!("{path}.securityContext.capabilities.add[{i}]"),
                        format!(
                            "capability {capability:?} is not allowed (pod_policy.allowed_capabilities)"
                        ),
                    )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "team-a";
    const DRIVER: &str = "driver-0";

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("test template")
    }

    fn base() -> &'static str {
        "apiVersion: v1\nkind: Pod\n"
    }

    fn check(yaml: &str) -> Result<(), PolicyViolation> {
        PodPolicy::default().check(
            &pod(&format!("{}{yaml}", base())),
            TemplateUse {
                namespace: Some(NS),
                driver_pod_name: Some(DRIVER),
            },
        )
    }

    const CONTAINER: &str = "spec:\n  containers:\n  - name: c\n    image: i\n";

    /// One row per rule: the template (after `apiVersion`/`kind`) and the path refused.
    #[test]
    fn each_rule_refuses_its_path() {
        let rows: &[(&str, &str)] = &[
            (
                "spec:\n  containers:\n  - name: c\n    image: i\n    securityContext:\n      privileged: true\n",
                "spec.containers[0].securityContext.privileged",
            ),
            (
                "spec:\n  containers:\n  - name: c\n    image: i\n  initContainers:\n  - name: init\n    image: i\n    securityContext:\n      privileged: true\n",
                "spec.initContainers[0].securityContext.privileged",
            ),
            (
                "spec:\n  containers:\n  - name: c\n    image: i\n  ephemeralContainers:\n  - name: debug\n    image: i\n    securityContext:\n      privileged: true\n",
                "spec.ephemeralContainers[0].securityContext.privileged",
            ),
            (
                "spec:\n  containers:\n  - name: a\n    image: i\n  - name: c\n    image: i\n    securityContext:\n      allowPrivilegeEscalation: true\n",
                "spec.containers[1].securityContext.allowPrivilegeEscalation",
            ),
            (
                "spec:\n  containers:\n  - name: c\n    image: i\n    securityContext:\n      capabilities:\n        add: [CHOWN, SYS_ADMIN]\n",
                "spec.containers[0].securityContext.capabilities.add[1]",
            ),
            (
                "spec:\n  containers:\n  - name: c\n    image: i\n    securityContext:\n      capabilities:\n        add: [CAP_NET_ADMIN]\n",
                "spec.containers[0].securityContext.capabilities.add[0]",
            ),
            (
                "spec:\n  containers:\n  - name: c\n    image: i\n  volumes:\n  - name: tmp\n    emptyDir: {}\n  - name: root\n    hostPath:\n      path: /\n",
                "spec.volumes[1].hostPath",
            ),
            (
                "spec:\n  hostNetwork: true\n  containers: []\n",
                "spec.hostNetwork",
            ),
            ("spec:\n  hostPID: true\n  containers: []\n", "spec.hostPID"),
            ("spec:\n  hostIPC: true\n  containers: []\n", "spec.hostIPC"),
            (
                "spec:\n  nodeName: node-1\n  containers: []\n",
                "spec.nodeName",
            ),
            (
                "spec:\n  serviceAccountName: cluster-admin\n  containers: []\n",
                "spec.serviceAccountName",
            ),
            (
                "spec:\n  serviceAccount: cluster-admin\n  containers: []\n",
                "spec.serviceAccount",
            ),
            (
                "metadata:\n  ownerReferences:\n  - apiVersion: apps/v1\n    kind: Deployment\n    name: victim\n    uid: u\n",
                "metadata.ownerReferences[0]",
            ),
            (
                "metadata:\n  ownerReferences:\n  - apiVersion: v1\n    kind: Pod\n    name: other-driver\n    uid: u\n",
                "metadata.ownerReferences[0]",
            ),
            (
                "metadata:\n  ownerReferences:\n  - apiVersion: v1\n    kind: Pod\n    name: driver-0\n    uid: u\n    blockOwnerDeletion: true\n",
                "metadata.ownerReferences[0].blockOwnerDeletion",
            ),
            (
                "metadata:\n  finalizers: [example.com/keep]\n",
                "metadata.finalizers[0]",
            ),
            (
                "metadata:\n  namespace: kube-system\n",
                "metadata.namespace",
            ),
        ];
        for (yaml, path) in rows {
            let err = check(yaml).expect_err(path);
            assert_eq!(err.path, *path, "{yaml}");
            assert!(!err.reason.is_empty());
        }
    }

    #[test]
    fn what_spark_puts_in_an_executor_pod_is_accepted() {
        let spark = "metadata:\n  namespace: team-a\n  labels:\n    spark-role: executor\n  \
             ownerReferences:\n  - apiVersion: v1\n    kind: Pod\n    name: driver-0\n    uid: u-1\n    controller: true\n\
             spec:\n  serviceAccountName: default\n  restartPolicy: Never\n  \
             containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n    \
             securityContext:\n      privileged: false\n      allowPrivilegeEscalation: false\n      \
             capabilities:\n        add: [NET_BIND_SERVICE]\n        drop: [ALL]\n  \
             volumes:\n  - name: spark-local-dir-1\n    emptyDir: {}\n";
        check(spark).expect("Spark's pod");
        check(CONTAINER).expect("a bare template");
        check("metadata:\n  namespace: team-a\n").expect("its own namespace");
    }

    #[test]
    fn configured_allowances_accept_what_they_name() {
        let policy = PodPolicy {
            allowed_service_accounts: vec!["default".into(), "spark".into()],
            allowed_capabilities: vec!["sys_ptrace".into()],
            allow_host_namespaces: true,
            allowed_finalizers: vec!["example.com/keep".into()],
            ..PodPolicy::default()
        };
        let template = pod(&format!(
            "{}metadata:\n  finalizers: [example.com/keep]\nspec:\n  hostNetwork: true\n  \
             serviceAccountName: spark\n  containers:\n  - name: c\n    image: i\n    \
             securityContext:\n      capabilities:\n        add: [CAP_SYS_PTRACE]\n",
            base()
        ));
        let at = TemplateUse {
            namespace: Some(NS),
            driver_pod_name: None,
        };
        policy.check(&template, at).expect("allowed");
        let off = PodPolicy {
            enforce: false,
            ..PodPolicy::default()
        };
        let hostile = pod(&format!(
            "{}metadata:\n  namespace: kube-system\nspec:\n  nodeName: n\n  containers: []\n",
            base()
        ));
        off.check(&hostile, at).expect("not enforced");
    }

    #[test]
    fn an_owner_needs_a_driver_and_a_default_template_no_namespace() {
        let owned = pod(&format!(
            "{}metadata:\n  ownerReferences:\n  - apiVersion: v1\n    kind: Pod\n    name: driver-0\n    uid: u\n",
            base()
        ));
        let without_driver = TemplateUse {
            namespace: Some(NS),
            driver_pod_name: None,
        };
        let err = PodPolicy::default()
            .check(&owned, without_driver)
            .unwrap_err();
        assert_eq!(err.path, "metadata.ownerReferences[0]");
        let namespaced = pod(&format!("{}metadata:\n  namespace: team-a\n", base()));
        let default_template = TemplateUse {
            namespace: None,
            driver_pod_name: None,
        };
        let err = PodPolicy::default()
            .check(&namespaced, default_template)
            .unwrap_err();
        assert_eq!(err.path, "metadata.namespace");
    }
}
