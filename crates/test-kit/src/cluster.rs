//! The backends of the contract tests: the simulator and a real kube-apiserver, behind one
//! [`Cluster`] trait so that each scenario is written once and run against both.
//!
//! No kubelet or scheduler runs on either: the test plays them through `pods/binding`,
//! `pods/status` and a grace-0 delete (a kubelet's confirmation of a graceful deletion).
//! On the real server the service runs with a service-account token bound to exactly the
//! RBAC objects the Helm chart renders, and [`Cluster::finish`] checks in the audit log that
//! the service used nothing else.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use spark_pod_allocator_sim::SimCluster;
use tokio::sync::OnceCell;

use crate::apiserver::{self, RealApiServer};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::k8s::RegistrationSettings;

/// Where a scenario runs: an API server, a client for the service, one for the test (as
/// admin, scheduler and kubelet), and two namespaces of its own.
pub trait Cluster {
    /// "simulator" or "real API server", for messages.
    fn backend(&self) -> &'static str;
    /// The client the service runs with.
    fn service_client(&self) -> Client;
    /// The client the test inspects the cluster and plays scheduler and kubelet with.
    fn admin_client(&self) -> Client;
    /// The scenario's namespace.
    fn namespace(&self) -> &str;
    /// A second namespace of the scenario's.
    fn other_namespace(&self) -> &str;
    /// The service's own namespace, where it keeps registrations and their key.
    fn service_namespace(&self) -> &str;
    /// The service's configuration on this backend: defaults, with registrations in
    /// [`Cluster::service_namespace`] (on the real server, as the chart configures them, where
    /// its rights are).
    fn service_settings(&self) -> Settings {
        let mut settings = Settings::default();
        settings.registrations = RegistrationSettings {
            namespace: Some(self.service_namespace().to_string()),
            ..RegistrationSettings::default()
        };
        settings
    }
    /// Checks what only the backend can check after a scenario (the real server's audit log).
    fn finish(&self) -> impl std::future::Future<Output = ()>;
}

/// The simulator with a manual kubelet: nothing moves unless the test moves it.
pub struct SimBackend {
    pub sim: SimCluster,
}

impl SimBackend {
    pub async fn start() -> Self {
        let mut settings = crate::sim::manual_settings();
        settings.namespaces = vec!["default".into(), "other".into()];
        Self {
            sim: crate::sim::start(settings).await,
        }
    }
}

impl Cluster for SimBackend {
    fn backend(&self) -> &'static str {
        "simulator"
    }
    fn service_client(&self) -> Client {
        self.sim.try_client().expect("sim client")
    }
    fn admin_client(&self) -> Client {
        self.sim.try_client().expect("sim client")
    }
    fn namespace(&self) -> &str {
        "default"
    }
    fn other_namespace(&self) -> &str {
        "other"
    }
    fn service_namespace(&self) -> &str {
        "default"
    }
    async fn finish(&self) {}
}

/// The namespace and service account the chart is rendered for (its release namespace).
const RELEASE_NAMESPACE: &str = "spark-pod-allocator";

/// One real API server per test binary, shared by its scenarios (each in namespaces of its
/// own); it shuts down when the test process ends (its stdin closes).
struct Shared {
    server: RealApiServer,
    rbac: ChartRbac,
    /// `system:serviceaccount:<release namespace>:<name>`.
    service_user: String,
    service_token: String,
}

static SHARED: OnceCell<Arc<Shared>> = OnceCell::const_new();

/// The test binary's shared server with a scheduler, a controller-manager and kwok nodes.
static SHARED_CONTROL_PLANE: OnceCell<Arc<Shared>> = OnceCell::const_new();

/// The test binary's shared server with a scheduler and a controller-manager, no nodes.
static SHARED_CONTROLLERS: OnceCell<Arc<Shared>> = OnceCell::const_new();

/// A real API server's scenario: namespaces `<scenario>-a` and `<scenario>-b`.
pub struct RealBackend {
    shared: Arc<Shared>,
    admin: Client,
    service: Client,
    namespace: String,
    other_namespace: String,
}

impl RealBackend {
    /// The backend for `scenario` on the test binary's shared server, or `None` (reason
    /// printed) when the binary is not built.
    pub async fn start(scenario: &str) -> Option<Self> {
        let binary = apiserver::binary()?;
        let shared = SHARED
            .get_or_init(|| async move { Arc::new(Shared::start(&binary, &[], &[], true).await) })
            .await
            .clone();
        Some(Self::on(shared, scenario).await)
    }

    /// [`Self::start`] on the test binary's shared server that also runs a kube-scheduler, a
    /// kube-controller-manager and kwok ([`apiserver::CONTROL_PLANE`]): pods get scheduled
    /// onto kwok's nodes and go Running there, and the garbage collector follows
    /// ownerReferences. The scenarios there must not play scheduler or kubelet themselves.
    pub async fn with_control_plane(scenario: &str) -> Option<Self> {
        let binary = apiserver::binary()?;
        let shared = SHARED_CONTROL_PLANE
            .get_or_init(|| async move {
                Arc::new(Shared::start(&binary, &[apiserver::CONTROL_PLANE], &[], true).await)
            })
            .await
            .clone();
        Some(Self::on(shared, scenario).await)
    }

    /// [`Self::start`] on the test binary's shared server that runs a kube-scheduler and a
    /// kube-controller-manager ([`apiserver::CONTROL_PLANE`]) but no nodes: the scheduler
    /// finds nowhere to put a pod and marks it Unschedulable until the scenario binds it
    /// (playing kubelet, as on the bare server), and the garbage collector, namespace and
    /// service-account controllers act as in a cluster.
    pub async fn with_controllers(scenario: &str) -> Option<Self> {
        let binary = apiserver::binary()?;
        let shared = SHARED_CONTROLLERS
            .get_or_init(|| async move {
                Arc::new(
                    Shared::start(
                        &binary,
                        &[apiserver::CONTROL_PLANE, "--kwok-nodes", "0"],
                        &[],
                        true,
                    )
                    .await,
                )
            })
            .await
            .clone();
        Some(Self::on(shared, scenario).await)
    }

    /// The backend for `scenario` on a server of its own (which it may restart or fault),
    /// started with `extra_args` for kube-apiserver.
    pub async fn start_own(scenario: &str, extra_args: &[&str]) -> Option<Self> {
        let binary = apiserver::binary()?;
        let shared = Arc::new(Shared::start(&binary, &[], extra_args, false).await);
        Some(Self::on(shared, scenario).await)
    }

    async fn on(shared: Arc<Shared>, scenario: &str) -> Self {
        let admin = shared.server.admin_client().await;
        let service = shared.server.client_with_token(&shared.service_token).await;
        let namespace = dns_label(&format!("{scenario}-a"));
        let other_namespace = dns_label(&format!("{scenario}-b"));
        for ns in [&namespace, &other_namespace] {
            apiserver::create_namespace(&admin, ns).await;
        }
        Self {
            shared,
            admin,
            service,
            namespace,
            other_namespace,
        }
    }

    /// The API server process (to restart it or fault its etcd).
    pub fn server(&self) -> &RealApiServer {
        &self.shared.server
    }

    /// Writes a kubeconfig with the service account's token (for the service binary).
    pub fn write_service_kubeconfig(&self, path: &std::path::Path) {
        self.shared
            .server
            .write_kubeconfig_with_token(&self.shared.service_token, path);
    }

    /// The service account's user name, as the audit log has it.
    pub fn service_user(&self) -> &str {
        &self.shared.service_user
    }
}

impl Shared {
    async fn start(
        binary: &std::path::Path,
        server_args: &[&str],
        extra_args: &[&str],
        ephemeral: bool,
    ) -> Self {
        let binary = binary.to_path_buf();
        let owned = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
        let (server_args, extra_args) = (owned(server_args), owned(extra_args));
        let server = tokio::task::spawn_blocking(move || {
            let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
            let extra_args: Vec<&str> = extra_args.iter().map(String::as_str).collect();
            RealApiServer::start_configured(&binary, &server_args, &extra_args, ephemeral)
        })
        .await
        .expect("the test API server starts");
        let admin = server.admin_client().await;
        let rbac = ChartRbac::render();
        apiserver::create_namespace(&admin, RELEASE_NAMESPACE).await;
        apiserver::create_service_account(&admin, RELEASE_NAMESPACE, &rbac.service_account).await;
        rbac.apply(&admin).await;
        let service_token =
            apiserver::service_account_token(&admin, RELEASE_NAMESPACE, &rbac.service_account)
                .await;
        Self {
            service_user: format!(
                "system:serviceaccount:{RELEASE_NAMESPACE}:{}",
                rbac.service_account
            ),
            server,
            rbac,
            service_token,
        }
    }
}

impl Cluster for RealBackend {
    fn backend(&self) -> &'static str {
        "real API server"
    }
    fn service_client(&self) -> Client {
        self.service.clone()
    }
    fn admin_client(&self) -> Client {
        self.admin.clone()
    }
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn other_namespace(&self) -> &str {
        &self.other_namespace
    }
    fn service_namespace(&self) -> &str {
        RELEASE_NAMESPACE
    }
    fn service_settings(&self) -> Settings {
        let mut settings = Settings::default();
        settings.registrations = self.shared.rbac.registrations.clone();
        settings
    }
    /// Every request the service's account made (in the whole shared server's log) is allowed
    /// by the chart's rules and none was refused; this scenario's own are among them.
    async fn finish(&self) {
        let events = self.shared.server.audit_events();
        let service: Vec<&Value> = events
            .iter()
            .filter(|e| e["user"]["username"] == self.shared.service_user.as_str())
            .collect();
        let mut used = BTreeSet::new();
        for event in &service {
            let reference = &event["objectRef"];
            if reference.is_null() {
                // A non-resource URL: only the discovery and version paths every
                // authenticated user may read (the system:discovery and
                // system:public-info-viewer roles of every cluster).
                let uri = event["requestURI"].as_str().unwrap_or("");
                let path = uri.split('?').next().unwrap_or("");
                assert!(
                    ["/version", "/api", "/apis", "/healthz", "/livez", "/readyz"].contains(&path),
                    "the service used the non-resource URL {uri}: {event}"
                );
                assert_eq!(event["verb"], "get", "{event}");
                used.insert(format!("get {path}"));
                continue;
            }
            let group = reference["apiGroup"].as_str().unwrap_or("");
            let mut resource = reference["resource"].as_str().unwrap_or("").to_string();
            if let Some(sub) = reference["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            let verb = event["verb"].as_str().unwrap_or("");
            assert!(
                self.shared.rbac.allows(group, &resource, verb),
                "the service used {verb} {group}/{resource}, which the chart does not grant: {event}"
            );
            // A restarted server refuses everyone until its RBAC cache has synced; the
            // verb check above still holds then.
            if !self.shared.server.was_restarted() {
                assert_ne!(
                    event["responseStatus"]["code"], 403,
                    "the service was refused: {event}"
                );
            }
            used.insert(format!("{verb} {resource}"));
        }
        eprintln!("the service account used: {used:?}");
        let own = service.iter().any(|e| {
            e["objectRef"]["namespace"] == self.namespace.as_str()
                || e["objectRef"]["name"] == self.namespace.as_str()
        });
        assert!(
            own,
            "the audit log has no request of the service in {} (it used {used:?})",
            self.namespace
        );
    }
}

/// Kubernetes names: lower case, `-` for anything else, at most 63 characters.
fn dns_label(s: &str) -> String {
    let mut label: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if label.len() > 63 {
        label = label[label.len() - 63..].to_string();
    }
    label.trim_matches('-').to_string()
}

/// The workspace root, two levels above this crate.
fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The helm binary: `TEST_HELM`, or `.tools/bin/helm` (built by `helm/ci.sh`, which `.ci/run`
/// runs before the real-server tests).
pub fn helm() -> PathBuf {
    let helm = std::env::var_os("TEST_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools/bin/helm"));
    assert!(
        helm.is_file(),
        "{} is missing: bash helm/ci.sh builds it (or set TEST_HELM)",
        helm.display()
    );
    helm
}

/// The Helm chart's directory (`helm/spark-pod-allocator`).
pub fn chart() -> PathBuf {
    workspace_root().join("helm/spark-pod-allocator")
}

/// The Helm chart's RBAC objects and key Secret, rendered by helm for [`RELEASE_NAMESPACE`].
pub struct ChartRbac {
    documents: Vec<Value>,
    pub service_account: String,
    /// Where the chart's configuration has the service keep its registrations and key.
    pub registrations: RegistrationSettings,
    /// (apiGroups, resources, verbs) of every rule of every (Cluster)Role.
    rules: Vec<(Vec<String>, Vec<String>, Vec<String>)>,
}

impl ChartRbac {
    /// `helm template` of the chart with its default values, but for any namespace
    /// (`rbac.clusterWide`: each scenario makes a namespace of its own) and with two shards
    /// (the Role grants the shards' Leases by name; the rebalancing scenario moves one of
    /// two, the others use the first alone).
    pub fn render() -> Self {
        let output = std::process::Command::new(helm())
            .args(["template", "spa"])
            .arg(chart())
            .args(["--namespace", RELEASE_NAMESPACE])
            .args(["--set", "rbac.clusterWide=true"])
            .args(["--set", "config.ha.shards=2"])
            .output()
            .expect("helm runs");
        assert!(
            output.status.success(),
            "helm template: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).expect("helm output is UTF-8");
        let mut documents = Vec::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document).expect("rendered YAML");
            if !value.is_null() {
                documents.push(value);
            }
        }
        let service_account = documents
            .iter()
            .find(|d| d["kind"] == "ServiceAccount")
            .and_then(|d| d["metadata"]["name"].as_str())
            .expect("the chart renders a ServiceAccount")
            .to_string();
        let config = documents
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["data"]["config.yaml"].is_string())
            .and_then(|d| d["data"]["config.yaml"].as_str())
            .expect("the chart renders the service's configuration");
        let config: Value = serde_yaml::from_str(config).expect("the configuration is YAML");
        let registrations: RegistrationSettings =
            serde_json::from_value(config["registrations"].clone())
                .expect("the configuration's registrations");
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let rules = documents
            .iter()
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                (
                    strings(&r["apiGroups"]),
                    strings(&r["resources"]),
                    strings(&r["verbs"]),
                )
            })
            .collect::<Vec<_>>();
        assert!(!rules.is_empty(), "the chart renders RBAC rules");
        Self {
            documents,
            service_account,
            registrations,
            rules,
        }
    }

    /// Creates the rendered Roles, ClusterRoles and their bindings, and the Secrets the
    /// service reads but may not create (the registrations' signing key), as an install does.
    pub async fn apply(&self, admin: &Client) {
        let pp = PostParams::default();
        for document in &self.documents {
            let namespace = document["metadata"]["namespace"]
                .as_str()
                .unwrap_or(RELEASE_NAMESPACE)
                .to_string();
            let kind = document["kind"].as_str().unwrap_or("");
            let result = match kind {
                "ClusterRole" => Api::<ClusterRole>::all(admin.clone())
                    .create(
                        &pp,
                        &serde_json::from_value(document.clone()).expect("ClusterRole"),
                    )
                    .await
                    .map(|_| ()),
                "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(admin.clone())
                    .create(
                        &pp,
                        &serde_json::from_value(document.clone()).expect("ClusterRoleBinding"),
                    )
                    .await
                    .map(|_| ()),
                "Role" => Api::<Role>::namespaced(admin.clone(), &namespace)
                    .create(
                        &pp,
                        &serde_json::from_value(document.clone()).expect("Role"),
                    )
                    .await
                    .map(|_| ()),
                "RoleBinding" => Api::<RoleBinding>::namespaced(admin.clone(), &namespace)
                    .create(
                        &pp,
                        &serde_json::from_value(document.clone()).expect("RoleBinding"),
                    )
                    .await
                    .map(|_| ()),
                "Secret" => Api::<Secret>::namespaced(admin.clone(), &namespace)
                    .create(
                        &pp,
                        &serde_json::from_value(document.clone()).expect("Secret"),
                    )
                    .await
                    .map(|_| ()),
                _ => continue,
            };
            result.unwrap_or_else(|e| panic!("apply the chart's {kind}: {e}"));
        }
    }

    /// Whether a rule grants `verb` on `resource` (with its subresource) of API `group`.
    pub fn allows(&self, group: &str, resource: &str, verb: &str) -> bool {
        let has = |list: &[String], item: &str| list.iter().any(|x| x == item || x == "*");
        self.rules.iter().any(|(groups, resources, verbs)| {
            has(groups, group) && has(resources, resource) && has(verbs, verb)
        })
    }
}

/// The name of executor `exec`'s pod.
pub fn pod_name(app: &str, exec: u64) -> String {
    format!("{app}-exec-{exec}")
}

/// Plays the scheduler: binds the pod to a node (its deletion becomes graceful).
pub async fn bind(c: &impl Cluster, app: &str, exec: u64) {
    let name = pod_name(app, exec);
    crate::sim::bind(&c.admin_client(), c.namespace(), &name)
        .await
        .unwrap_or_else(|e| panic!("bind {name} on the {}: {e}", c.backend()));
}

/// Binds the pod unless a scheduler already did.
async fn ensure_bound(c: &impl Cluster, app: &str, exec: u64) {
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let pod = pods.get(&pod_name(app, exec)).await.expect("pod to bind");
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    if !bound {
        bind(c, app, exec).await;
    }
}

/// Plays the kubelet: executor `exec`'s pod runs (bound first, as a kubelet only runs its
/// node's pods).
pub async fn set_running(c: &impl Cluster, app: &str, exec: u64) {
    ensure_bound(c, app, exec).await;
    patch_status(
        c,
        app,
        exec,
        json!({"status": crate::sim::running_status()}),
    )
    .await;
}

/// Plays the kubelet: executor `exec`'s pod failed with exit code 1.
pub async fn set_failed(c: &impl Cluster, app: &str, exec: u64) {
    ensure_bound(c, app, exec).await;
    patch_status(
        c,
        app,
        exec,
        json!({"status": {"phase": "Failed", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": false, "restartCount": 0,
            "image": "spark:4", "imageID": "",
            "state": {"terminated": {"exitCode": 1, "reason": "Error",
                "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}}}]}}),
    )
    .await;
}

async fn patch_status(c: &impl Cluster, app: &str, exec: u64, patch: Value) {
    let name = pod_name(app, exec);
    crate::sim::set_pod_status(
        &c.admin_client(),
        c.namespace(),
        &name,
        patch["status"].clone(),
    )
    .await;
}

/// Plays the kubelet confirming a graceful deletion (or a user removing the pod at once).
pub async fn delete_now(c: &impl Cluster, app: &str, exec: u64) {
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    pods.delete(
        &pod_name(app, exec),
        &DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap_or_else(|e| panic!("delete {app} {exec} on the {}: {e}", c.backend()));
}

/// The executor ids of the application's pods in `namespace` (terminating ones included).
pub async fn cluster_ids_in(c: &impl Cluster, namespace: &str, app: &str) -> BTreeSet<u64> {
    crate::sim::executor_ids(&c.admin_client(), namespace, app).await
}

/// [`cluster_ids_in`] the scenario's namespace.
pub async fn cluster_ids(c: &impl Cluster, app: &str) -> BTreeSet<u64> {
    cluster_ids_in(c, c.namespace(), app).await
}
