//! The Helm chart installed for real into the control plane (the test API server with
//! `--control-plane`) by the real `helm` binary: the API server's admission (Pod Security at
//! `restricted`, validation of every field) and RBAC (escalation checks on the Roles and
//! bindings the chart creates, made as an installer that is not a cluster admin) check what
//! the chart renders; the deployment and replicaset controllers, the scheduler and kwok make
//! its Deployment's pods run on kwok nodes; `helm test` runs the chart's test pod (completed
//! by kwok's `helm.sh/hook: test` stage: no container runs); `helm upgrade` keeps the
//! generated Secrets; `helm uninstall` and the garbage collector leave nothing of the
//! release behind. Once with the chart's defaults, once with every value set
//! (`ci/full-values.yaml`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, ApiResource, Scope};
use serde_json::{Value, json};
use test_kit::apiserver::{create_service_account, service_account_token};
use test_kit::cluster::{Cluster, RealBackend, chart, helm};
use test_kit::wait::{eventually, until};

use crate::control_plane::{GARBAGE_COLLECTOR, SCHEDULER};

/// The service account helm runs as.
const INSTALLER: &str = "chart-installer";

/// Guards a helm command against a hang; its own `--timeout` is shorter.
const HELM_GUARD: Duration = Duration::from_secs(120);

/// The helm binary with a kubeconfig and nothing of the test's environment: its cache,
/// configuration and data directories are empty ones of its own (no repository, no plugin,
/// nothing fetched).
pub(crate) struct Helm {
    home: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Helm {
    pub(crate) fn new(kubeconfig: PathBuf) -> Self {
        Self {
            home: tempfile::tempdir().expect("helm's home"),
            kubeconfig,
        }
    }

    /// Runs helm with `args`; panics with its output when it fails or prints anything on
    /// stderr: the API server's warnings (an unknown or duplicated field, a Pod Security
    /// `warn` violation, a deprecated API) reach helm's stderr. Returns stdout.
    pub(crate) async fn run(&self, args: &[&str]) -> String {
        let home = self.home.path();
        let mut command = tokio::process::Command::new(helm());
        command
            .args(args)
            .env_clear()
            .env("HOME", home)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env("KUBECONFIG", &self.kubeconfig)
            .kill_on_drop(true);
        let output = tokio::time::timeout(HELM_GUARD, command.output())
            .await
            .unwrap_or_else(|_| panic!("helm {args:?} hung"))
            .expect("helm runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        // Only the command and its stderr: stdout has the release's NOTES and Secrets.
        eprintln!("$ helm {}\n{stderr}", args.join(" "));
        assert!(
            output.status.success(),
            "helm {args:?} failed:\n{stdout}{stderr}"
        );
        assert!(
            stderr.trim().is_empty(),
            "helm {args:?} printed warnings:\n{stderr}"
        );
        stdout
    }

    /// The release's objects (`helm get manifest`) or its hooks (`helm get hooks`), as helm
    /// stored them.
    async fn get(&self, what: &str, release: &str, namespace: &str) -> Vec<Value> {
        let stdout = self.run(&["get", what, release, "-n", namespace]).await;
        documents(&stdout)
    }
}

/// The documents of a YAML stream (empty ones left out).
pub(crate) fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("helm prints YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// A kind of object, as the API server serves it.
#[derive(Clone)]
struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

impl Kind {
    async fn of(admin: &Client, api_version: &str, kind: &str) -> Self {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = discovery::pinned_kind(admin, &gvk)
            .await
            .unwrap_or_else(|e| panic!("the API server serves {api_version} {kind}: {e}"));
        Self {
            resource,
            namespaced: matches!(capabilities.scope, Scope::Namespaced),
        }
    }

    /// Every object of this kind with the release's label, in every namespace.
    async fn labelled(&self, admin: &Client, selector: &str) -> Vec<String> {
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &self.resource);
        let list = api
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap_or_else(|e| panic!("list {}: {e}", self.resource.plural));
        list.items
            .iter()
            .map(|o| {
                let namespace = o.metadata.namespace.as_deref().unwrap_or("");
                let name = o.metadata.name.as_deref().unwrap_or("");
                format!("{} {namespace}/{name}", self.resource.kind)
            })
            .collect()
    }
}

/// One object the release rendered, where the API server keeps it.
struct Rendered {
    kind: Kind,
    namespace: Option<String>,
    name: String,
}

impl Rendered {
    async fn of(admin: &Client, document: &Value, release_namespace: &str) -> Self {
        let api_version = document["apiVersion"].as_str().expect("apiVersion");
        let kind = Kind::of(admin, api_version, document["kind"].as_str().expect("kind")).await;
        let namespace = kind.namespaced.then(|| {
            document["metadata"]["namespace"]
                .as_str()
                .unwrap_or(release_namespace)
                .to_string()
        });
        let name = document["metadata"]["name"].as_str().expect("name").into();
        Self {
            kind,
            namespace,
            name,
        }
    }

    fn api(&self, admin: &Client) -> Api<DynamicObject> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &self.kind.resource),
            None => Api::all_with(admin.clone(), &self.kind.resource),
        }
    }

    /// The object as the API server has it now (its JSON), or `None` once it is gone.
    async fn get(&self, admin: &Client) -> Option<Value> {
        let object = self
            .api(admin)
            .get_opt(&self.name)
            .await
            .unwrap_or_else(|e| panic!("get {self}: {e}"))?;
        Some(serde_json::to_value(object).expect("JSON"))
    }
}

impl std::fmt::Display for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let namespace = self.namespace.as_deref().unwrap_or("");
        write!(f, "{} {namespace}/{}", self.kind.resource.kind, self.name)
    }
}

async fn resolve_all(admin: &Client, documents: &[Value], namespace: &str) -> Vec<Rendered> {
    let mut rendered = Vec::new();
    for document in documents {
        rendered.push(Rendered::of(admin, document, namespace).await);
    }
    rendered
}

/// Creates `value` (a manifest of `K`) as the admin.
async fn create<K>(api: Api<K>, value: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).expect("manifest");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {object:?}: {e}"));
}

/// The identity helm installs as: a service account that is no cluster admin, so that the API
/// server's RBAC escalation checks apply to the Roles, ClusterRoles and bindings the chart
/// creates (system:masters would skip them). It holds what a namespace admin holds in the
/// release's and the drivers' namespaces (the aggregated `admin` ClusterRole), the Leases the
/// chart's Role grants (not in `admin`), the rights to create ClusterRoles and their bindings,
/// and `system:auth-delegator` (TokenReview and SubjectAccessReview, which the chart's
/// ClusterRole grants: RBAC lets one grant only what one holds). Returns a kubeconfig with its
/// token.
async fn installer_kubeconfig(c: &RealBackend, dir: &Path) -> PathBuf {
    let admin = c.admin_client();
    let release_namespace = c.namespace();
    create_service_account(&admin, release_namespace, INSTALLER).await;
    let subject =
        json!([{"kind": "ServiceAccount", "name": INSTALLER, "namespace": release_namespace}]);
    for namespace in [c.namespace(), c.other_namespace()] {
        create(
            Api::<RoleBinding>::namespaced(admin.clone(), namespace),
            json!({
                "metadata": {"name": "chart-installer-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
                "subjects": subject,
            }),
        )
        .await;
    }
    create(
        Api::<Role>::namespaced(admin.clone(), release_namespace),
        json!({
            "metadata": {"name": "chart-installer-leases"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
        }),
    )
    .await;
    create(
        Api::<RoleBinding>::namespaced(admin.clone(), release_namespace),
        json!({
            "metadata": {"name": "chart-installer-leases"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "chart-installer-leases"},
            "subjects": subject,
        }),
    )
    .await;
    let cluster_role = format!("chart-installer-{release_namespace}");
    create(
        Api::<ClusterRole>::all(admin.clone()),
        json!({
            "metadata": {"name": cluster_role},
            "rules": [{"apiGroups": ["rbac.authorization.k8s.io"],
                       "resources": ["clusterroles", "clusterrolebindings"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                      // The FlowSchema of the service's Lease requests (ha.leaseFlowSchema).
                      {"apiGroups": ["flowcontrol.apiserver.k8s.io"],
                       "resources": ["flowschemas"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
        }),
    )
    .await;
    for (binding, role) in [
        (cluster_role.clone(), cluster_role.as_str()),
        (
            format!("{cluster_role}-auth-delegator"),
            "system:auth-delegator",
        ),
    ] {
        create(
            Api::<ClusterRoleBinding>::all(admin.clone()),
            json!({
                "metadata": {"name": binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subject,
            }),
        )
        .await;
    }
    // The `admin` ClusterRole gets its rules from the aggregation controller, and the
    // authorizer sees new bindings through its informers: wait until the installer holds
    // what it was given.
    let user = format!("system:serviceaccount:{release_namespace}:{INSTALLER}");
    for (group, resource, namespace) in [
        ("apps", "deployments", Some(c.other_namespace())),
        ("apps", "deployments", Some(release_namespace)),
        ("coordination.k8s.io", "leases", Some(release_namespace)),
        ("rbac.authorization.k8s.io", "clusterroles", None),
        ("flowcontrol.apiserver.k8s.io", "flowschemas", None),
        ("authentication.k8s.io", "tokenreviews", None),
    ] {
        until(&format!("{user} may create {resource}"), async || {
            allowed(&admin, &user, group, resource, namespace).await
        })
        .await;
    }
    let token = service_account_token(&admin, release_namespace, INSTALLER).await;
    let path = dir.join("kubeconfig");
    c.server().write_kubeconfig_with_token(&token, &path);
    // helm warns about a kubeconfig others may read.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod kubeconfig");
    path
}

/// Whether `user` may create `resource` (a SubjectAccessReview).
async fn allowed(
    admin: &Client,
    user: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "resourceAttributes": {
            "group": group, "resource": resource, "verb": "create", "namespace": namespace,
        }}
    }))
    .expect("review");
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status)
        .is_some_and(|s| s.allowed)
}

/// The audit events of `user`'s `verb` on `resource` (`pods`, or `pods/binding`) named `name`.
fn audited<'a>(
    events: &'a [Value],
    user: &str,
    verb: &str,
    resource: &str,
    name: &str,
) -> Vec<&'a Value> {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (resource, None),
    };
    events
        .iter()
        .filter(|e| {
            let r = &e["objectRef"];
            e["user"]["username"] == user
                && e["verb"] == verb
                && r["resource"] == resource
                && r["subresource"].as_str() == subresource
                && r["name"] == name
        })
        .collect()
}

/// The Secrets' data, by name.
async fn secret_data(admin: &Client, namespace: &str, names: &[String]) -> BTreeMap<String, Value> {
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    let mut data = BTreeMap::new();
    for name in names {
        let secret = secrets.get(name).await.expect("the release's Secret");
        data.insert(
            name.clone(),
            serde_json::to_value(secret.data).expect("JSON"),
        );
    }
    data
}

/// The pods a Deployment's selector picks: name → (uid, node, phase, IP).
async fn deployment_pods(
    admin: &Client,
    namespace: &str,
    deployment: &Deployment,
) -> BTreeMap<String, (String, String, String, String)> {
    let labels = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list the Deployment's pods");
    list.items
        .into_iter()
        .map(|p| {
            let name = p.metadata.name.unwrap_or_default();
            let uid = p.metadata.uid.unwrap_or_default();
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            let status = p.status.unwrap_or_default();
            let phase = status.phase.unwrap_or_default();
            let ip = status.pod_ip.unwrap_or_default();
            (name, (uid, node, phase, ip))
        })
        .collect()
}

/// The pods of a Deployment: name → (uid, node, phase, IP).
type Pods = BTreeMap<String, (String, String, String, String)>;

/// A release of the chart, installed by the installer ([`installer_kubeconfig`]) into a
/// scenario's first namespace (which enforces Pod Security `restricted`), its drivers'
/// namespace the second.
struct Release<'a> {
    c: &'a RealBackend,
    admin: Client,
    helm: Helm,
    name: &'static str,
    namespace: String,
    drivers: String,
    installer: String,
    /// helm's value flags, the same for the install and the upgrade.
    values: Vec<String>,
    /// What `helm get manifest` and `helm get hooks` list, once installed.
    objects: Vec<Rendered>,
    hooks: Vec<Rendered>,
    _dir: tempfile::TempDir,
}

impl<'a> Release<'a> {
    /// Prepares the namespaces and the installer; `values` maps the drivers' namespace to
    /// helm's value flags.
    async fn prepare(
        c: &'a RealBackend,
        name: &'static str,
        values: impl FnOnce(&str) -> Vec<String>,
    ) -> Self {
        let admin = c.admin_client();
        let namespace = c.namespace().to_string();
        let drivers = c.other_namespace().to_string();
        // The release's namespace enforces the `restricted` Pod Security level the chart
        // claims (pods refused otherwise) and audits and warns at it (the Deployment's pod
        // template is checked too: a violation is an audit annotation and a warning helm
        // prints).
        let levels = json!({"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/audit": "restricted",
            "pod-security.kubernetes.io/warn": "restricted",
        }}});
        Api::<Namespace>::all(admin.clone())
            .patch(&namespace, &PatchParams::default(), &Patch::Merge(&levels))
            .await
            .expect("label the release's namespace");
        let dir = tempfile::tempdir().expect("tempdir");
        let helm = Helm::new(installer_kubeconfig(c, dir.path()).await);
        Self {
            c,
            admin,
            helm,
            name,
            installer: format!("system:serviceaccount:{namespace}:{INSTALLER}"),
            values: values(&drivers),
            namespace,
            drivers,
            objects: Vec::new(),
            hooks: Vec::new(),
            _dir: dir,
        }
    }

    /// The label every object of the release carries (the chart's labels and selector
    /// labels).
    fn selector(&self) -> String {
        format!("app.kubernetes.io/instance={}", self.name)
    }

    /// `helm install` or `helm upgrade` with the release's values, waiting for it to be
    /// ready; helm must print no warning.
    async fn deploy(&self, verb: &str) {
        let chart = chart();
        let chart = chart.to_str().expect("a UTF-8 path");
        let mut args = vec![
            verb,
            self.name,
            chart,
            "-n",
            &self.namespace,
            "--wait",
            "--timeout",
            "60s",
        ];
        args.extend(self.values.iter().map(String::as_str));
        self.helm.run(&args).await;
    }

    /// Installs the release and reads back what it rendered.
    async fn install(&mut self) {
        self.deploy("install").await;
        let manifest = self.helm.get("manifest", self.name, &self.namespace).await;
        let hooks = self.helm.get("hooks", self.name, &self.namespace).await;
        self.objects = resolve_all(&self.admin, &manifest, &self.namespace).await;
        self.hooks = resolve_all(&self.admin, &hooks, &self.namespace).await;
        eprintln!(
            "{}'s objects: {}; hooks: {}",
            self.name,
            self.objects
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            self.hooks
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        );
    }

    fn of_kind<'r>(&'r self, kind: &'r str) -> impl Iterator<Item = &'r Rendered> + 'r {
        self.objects
            .iter()
            .filter(move |o| o.kind.resource.kind == kind)
    }

    /// Every rendered object was admitted and is there; helm was refused nothing, the
    /// Roles, ClusterRoles and bindings passed RBAC's escalation checks (the installer is no
    /// cluster admin), and no Pod Security violation was audited.
    async fn assert_admitted(&self) {
        for object in &self.objects {
            assert!(
                object.get(&self.admin).await.is_some(),
                "{object} is missing"
            );
        }
        let events = self.c.server().audit_events();
        let refused: Vec<&Value> = events
            .iter()
            .filter(|e| e["user"]["username"] == self.installer.as_str())
            .filter(|e| e["responseStatus"]["code"] == 403)
            .collect();
        assert!(refused.is_empty(), "the installer was refused: {refused:?}");
        for object in self
            .objects
            .iter()
            .filter(|o| o.kind.resource.group == "rbac.authorization.k8s.io")
        {
            let created = audited(
                &events,
                &self.installer,
                "create",
                &object.kind.resource.plural,
                &object.name,
            );
            assert!(
                created.iter().any(|e| e["responseStatus"]["code"] == 201),
                "{object} was created by the installer: {created:?}"
            );
        }
        // API Priority and Fairness took the Lease requests' FlowSchema: its priority
        // level exists (not Dangling).
        for flow_schema in self.of_kind("FlowSchema") {
            until(&format!("{flow_schema} is not dangling"), async || {
                flow_schema.get(&self.admin).await.is_some_and(|fs| {
                    fs["status"]["conditions"]
                        .as_array()
                        .is_some_and(|conditions| {
                            conditions
                                .iter()
                                .any(|c| c["type"] == "Dangling" && c["status"] == "False")
                        })
                })
            })
            .await;
        }
        let violations: Vec<&Value> = events
            .iter()
            .filter(|e| {
                let ns = &e["objectRef"]["namespace"];
                (ns == self.namespace.as_str() || ns == self.drivers.as_str())
                    && e["annotations"].as_object().is_some_and(|a| {
                        a.keys()
                            .any(|k| k.starts_with("pod-security.kubernetes.io/audit-violations"))
                    })
            })
            .collect();
        assert!(
            violations.is_empty(),
            "Pod Security violations: {violations:?}"
        );
    }

    /// The Deployment is Available, its pods scheduled by the real scheduler onto kwok
    /// nodes and Running; each Service's EndpointSlices list exactly those pods, ready, on
    /// the Service's named ports (its selector and target ports match the pods); a
    /// PodDisruptionBudget, if rendered, counts them. Returns the pods.
    async fn assert_running(&self) -> Pods {
        let name = &self
            .of_kind("Deployment")
            .next()
            .expect("a Deployment")
            .name;
        let deployments: Api<Deployment> = Api::namespaced(self.admin.clone(), &self.namespace);
        // Polled: helm's `--wait` may accept fewer ready pods than replicas (a rolling
        // update's maxUnavailable).
        let (deployment, replicas, pods) = eventually(
            &format!("Deployment {name} Available with all its pods Running"),
            async || {
                let deployment = deployments.get(name).await.ok()?;
                let replicas = deployment.spec.as_ref().and_then(|s| s.replicas)?;
                let status = deployment.status.clone().unwrap_or_default();
                let available = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Available" && c.status == "True");
                let pods = deployment_pods(&self.admin, &self.namespace, &deployment).await;
                let running = pods.values().all(|(_, _, phase, _)| phase == "Running");
                (available
                    && status.available_replicas == Some(replicas)
                    && pods.len() == replicas as usize
                    && running)
                    .then_some((deployment, replicas, pods))
            },
        )
        .await;
        assert!(replicas >= 1, "the service runs: {deployment:?}");
        let events = self.c.server().audit_events();
        for (name, (_, node, _, _)) in &pods {
            assert!(node.starts_with("kwok-node-"), "{name} is on {node:?}");
            assert!(
                !audited(&events, SCHEDULER, "create", "pods/binding", name).is_empty(),
                "the scheduler bound {name}"
            );
        }
        let slices: Api<EndpointSlice> = Api::namespaced(self.admin.clone(), &self.namespace);
        let pod_ips: BTreeSet<String> = pods.values().map(|(_, _, _, ip)| ip.clone()).collect();
        for service in self.of_kind("Service") {
            let spec = service.get(&self.admin).await.expect("Service")["spec"].clone();
            let port_names: BTreeSet<String> = spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str().map(str::to_string))
                .collect();
            let selector = format!("kubernetes.io/service-name={}", service.name);
            until(
                &format!("{service}'s EndpointSlices list its pods"),
                async || {
                    let Ok(list) = slices.list(&ListParams::default().labels(&selector)).await
                    else {
                        return false;
                    };
                    let ready: BTreeSet<String> = list
                        .items
                        .iter()
                        .flat_map(|s| s.endpoints.iter())
                        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                        .flat_map(|e| e.addresses.iter().cloned())
                        .collect();
                    let ports: BTreeSet<String> = list
                        .items
                        .iter()
                        .flat_map(|s| s.ports.iter().flatten())
                        .filter(|p| p.port.is_some())
                        .filter_map(|p| p.name.clone())
                        .collect();
                    ready == pod_ips && ports == port_names
                },
            )
            .await;
        }
        for budget in self.of_kind("PodDisruptionBudget") {
            until(
                &format!("{budget} counts the Deployment's pods"),
                async || {
                    budget.get(&self.admin).await.is_some_and(|b| {
                        b["status"]["expectedPods"].as_i64() == Some(i64::from(replicas))
                    })
                },
            )
            .await;
        }
        pods
    }

    /// `helm test`: the test pod is admitted, bound by the scheduler, completed by kwok
    /// (no container runs), and deleted by its hook-delete-policy.
    async fn assert_tested(&self) {
        let tested = self
            .helm
            .run(&["test", self.name, "-n", &self.namespace, "--timeout", "60s"])
            .await;
        eprintln!("{tested}");
        let phases: Vec<&str> = tested
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Phase:"))
            .map(str::trim)
            .collect();
        assert!(
            !phases.is_empty() && phases.iter().all(|p| *p == "Succeeded"),
            "helm test: {tested}"
        );
        let events = self.c.server().audit_events();
        let pods: Vec<&Rendered> = self
            .hooks
            .iter()
            .filter(|h| h.kind.resource.kind == "Pod")
            .collect();
        assert!(!pods.is_empty(), "the chart has a test pod");
        for hook in pods {
            assert!(
                !audited(&events, SCHEDULER, "create", "pods/binding", &hook.name).is_empty(),
                "the scheduler bound {hook}"
            );
            until(&format!("{hook} deleted after it succeeded"), async || {
                hook.get(&self.admin).await.is_none()
            })
            .await;
        }
    }

    /// `helm uninstall --wait`; the garbage collector deletes what the controllers made
    /// (the ReplicaSet and its `pods`: the audit log's deletes by `generic-garbage-collector`,
    /// and EndpointSlices). Then nothing of the release is left: no object of the manifest
    /// or of the hooks, no object with the release's label of any kind the chart renders or
    /// its controllers make (ReplicaSet, Pod, EndpointSlice), in any namespace or
    /// cluster-wide, no EndpointSlice of its Services, and none of helm's release records.
    async fn uninstall_leaving_nothing(&self, pods: &Pods) {
        let admin = &self.admin;
        let selector = self.selector();
        let mut kinds: BTreeMap<String, Kind> = BTreeMap::new();
        for object in self.objects.iter().chain(&self.hooks) {
            kinds.insert(object.kind.resource.plural.clone(), object.kind.clone());
        }
        for (api_version, kind) in [
            ("apps/v1", "ReplicaSet"),
            ("v1", "Pod"),
            ("discovery.k8s.io/v1", "EndpointSlice"),
        ] {
            let kind = Kind::of(admin, api_version, kind).await;
            kinds.insert(kind.resource.plural.clone(), kind);
        }
        // Each of those kinds has objects with the release's label now (the controllers copy
        // it from the Deployment's pod template and the Service), so that none left after
        // the uninstall means something.
        for (plural, kind) in &kinds {
            assert!(
                !kind.labelled(admin, &selector).await.is_empty(),
                "no {plural} with {selector} before the uninstall"
            );
        }
        let replica_sets = kinds["replicasets"].labelled(admin, &selector).await;
        self.helm
            .run(&[
                "uninstall",
                self.name,
                "-n",
                &self.namespace,
                "--wait",
                "--timeout",
                "60s",
            ])
            .await;
        let secrets = Kind::of(admin, "v1", "Secret").await;
        let slices = &kinds["endpointslices"];
        let records = format!("owner=helm,name={}", self.name);
        eventually("nothing of the release is left", async || {
            let mut left = Vec::new();
            for object in self.objects.iter().chain(&self.hooks) {
                if object.get(admin).await.is_some() {
                    left.push(object.to_string());
                }
            }
            for kind in kinds.values() {
                left.extend(kind.labelled(admin, &selector).await);
            }
            for service in self.of_kind("Service") {
                let by_service = format!("kubernetes.io/service-name={}", service.name);
                left.extend(slices.labelled(admin, &by_service).await);
            }
            // helm's own record of the release (a Secret per revision).
            left.extend(secrets.labelled(admin, &records).await);
            left.is_empty().then_some(())
        })
        .await;
        let events = self.c.server().audit_events();
        for pod in pods.keys() {
            assert!(
                !audited(&events, GARBAGE_COLLECTOR, "delete", "pods", pod).is_empty(),
                "the garbage collector deleted {pod}"
            );
        }
        for replica_set in &replica_sets {
            let name = replica_set.rsplit('/').next().unwrap_or("");
            assert!(
                !audited(&events, GARBAGE_COLLECTOR, "delete", "replicasets", name).is_empty(),
                "the garbage collector deleted {replica_set}"
            );
        }
    }
}

/// The chart's defaults, plus the one value without a default: the namespaces drivers run in
/// (a Role and the CA's ConfigMap go there). TLS stays on, with the generated certificate.
#[tokio::test]
async fn the_chart_installs_runs_tests_upgrades_and_uninstalls_without_leftovers() {
    let Some(c) = RealBackend::with_control_plane("chart").await else {
        return;
    };
    let began = Instant::now();
    let mut release = Release::prepare(&c, "installed", |drivers| {
        vec!["--set".into(), format!("allowedNamespaces={{{drivers}}}")]
    })
    .await;
    release.install().await;
    let installed_at = began.elapsed();
    release.assert_admitted().await;
    let kinds: BTreeSet<&str> = release
        .objects
        .iter()
        .map(|o| o.kind.resource.kind.as_str())
        .collect();
    for kind in [
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
        "NetworkPolicy",
    ] {
        assert!(
            kinds.contains(kind),
            "the defaults render no {kind}: {kinds:?}"
        );
    }
    assert!(
        release
            .of_kind("ConfigMap")
            .any(|o| o.namespace.as_deref() == Some(release.drivers.as_str())),
        "the CA's ConfigMap is published in the drivers' namespace"
    );
    let pods = release.assert_running().await;
    release.assert_tested().await;
    let tested_at = began.elapsed();

    // `helm upgrade` with the same values keeps the generated certificate and the
    // registrations' key (the chart's `lookup`s, against a real cluster), and replaces no
    // pod (the configuration's checksum is unchanged).
    let admin = c.admin_client();
    let secrets: Vec<String> = release.of_kind("Secret").map(|o| o.name.clone()).collect();
    let before = secret_data(&admin, &release.namespace, &secrets).await;
    release.deploy("upgrade").await;
    assert_eq!(
        secret_data(&admin, &release.namespace, &secrets).await,
        before,
        "an upgrade with the same values changed a Secret"
    );
    let uids =
        |pods: &Pods| -> BTreeSet<String> { pods.values().map(|(uid, ..)| uid.clone()).collect() };
    assert_eq!(
        uids(&release.assert_running().await),
        uids(&pods),
        "the upgrade replaced a pod"
    );
    let upgraded_at = began.elapsed();

    release.uninstall_leaving_nothing(&pods).await;
    eprintln!(
        "chart on the control plane: installed at {installed_at:?}, tested at {tested_at:?}, \
         upgraded at {upgraded_at:?}, uninstalled and gone at {:?}",
        began.elapsed()
    );
}

/// `ci/full-values.yaml` (every value set) through the same install, test and uninstall:
/// the API server validates every field the chart can render. Changed for this cluster: the
/// drivers' namespace is the scenario's (for `allowedNamespaces` and the dashboard's
/// ConfigMap), and the ServiceMonitor and PrometheusRule are off (no prometheus-operator
/// CRDs here; `helm/ci.sh` checks them against their schemas).
#[tokio::test]
async fn every_value_set_is_admitted_and_uninstalled_without_leftovers() {
    let Some(c) = RealBackend::with_control_plane("chart-values").await else {
        return;
    };
    let full_values = chart().join("ci/full-values.yaml");
    let full_values = full_values.to_str().expect("a UTF-8 path").to_string();
    let mut release = Release::prepare(&c, "every-value", |drivers| {
        let mut values = vec!["-f".to_string(), full_values];
        for set in [
            format!("allowedNamespaces={{{drivers}}}"),
            format!("metrics.dashboard.namespace={drivers}"),
            "metrics.serviceMonitor.enabled=false".into(),
            "metrics.prometheusRule.enabled=false".into(),
        ] {
            values.extend(["--set".to_string(), set]);
        }
        values
    })
    .await;
    release.install().await;
    release.assert_admitted().await;
    let pods = release.assert_running().await;
    release.assert_tested().await;
    release.uninstall_leaving_nothing(&pods).await;
}
