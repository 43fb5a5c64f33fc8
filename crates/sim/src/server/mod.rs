//! The HTTP side of the simulated API server: authentication, routing of Kubernetes API
//! paths, injected faults and the admin endpoints. The verbs of each resource are in
//! [`verbs`], watches in [`watch`], discovery documents in [`discovery`], the state and
//! helpers every handler shares in [`shared`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use super::protobuf;
use super::settings::FaultSettings;
use super::status::ApiError;
use super::store::Kind;
use super::table::{IncludeObject, printed, table as printed_table, wants_table};

mod discovery;
mod reviews;
mod shared;
mod verbs;
mod watch;

pub use shared::SimWrite;
pub(crate) use shared::{Hold, Shared};
use shared::{Query, flag, parse_u64, value_response};

use verbs::{bind, create, delete, delete_collection, get, list, parse_object, patch, replace};
pub(crate) use verbs::{bind_pod, delete_object, set_condition};

/// The router serving the whole API (everything goes through one dispatcher).
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

async fn handle(State(sh): State<Arc<Shared>>, req: Request) -> Response {
    match dispatch(&sh, req).await {
        Ok(resp) => resp,
        Err(err) => err.into_response(),
    }
}

fn query_of(req: &Request) -> Query {
    req.uri()
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

fn authorized(sh: &Shared, req: &Request) -> bool {
    if sh.settings.auth_tokens.is_empty() {
        return true;
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    token.is_some_and(|t| sh.settings.auth_tokens.iter().any(|known| known == t))
}

async fn read_body(req: Request) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(req.into_body(), 64 * 1024 * 1024)
        .await
        .map_err(|e| ApiError::bad_request(format!("unable to read request body: {e}")))
}

/// Where an API path points.
enum Target {
    Collection {
        kind: Kind,
        ns: Option<String>,
    },
    Object {
        kind: Kind,
        ns: String,
        name: String,
    },
    Sub {
        kind: Kind,
        ns: String,
        name: String,
        sub: String,
    },
}

impl Target {
    fn kind(&self) -> Kind {
        match self {
            Target::Collection { kind, .. }
            | Target::Object { kind, .. }
            | Target::Sub { kind, .. } => *kind,
        }
    }
}

fn resolve(segs: &[&str]) -> Option<Target> {
    let (group, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return None,
    };
    let kind = |plural: &str| Kind::from_plural(group, plural);
    match rest {
        [plural] => Some(Target::Collection {
            kind: kind(plural)?,
            ns: None,
        }),
        ["namespaces", name] if group.is_empty() => Some(Target::Object {
            kind: Kind::Namespace,
            ns: String::new(),
            name: name.to_string(),
        }),
        [plural, name] => Some(Target::Object {
            kind: kind(plural).filter(|k| !k.namespaced())?,
            ns: String::new(),
            name: name.to_string(),
        }),
        ["namespaces", ns, plural] => {
            let kind = kind(plural).filter(|k| k.namespaced())?;
            Some(Target::Collection {
                kind,
                ns: Some(ns.to_string()),
            })
        }
        ["namespaces", ns, plural, name] => {
            let kind = kind(plural).filter(|k| k.namespaced())?;
            Some(Target::Object {
                kind,
                ns: ns.to_string(),
                name: name.to_string(),
            })
        }
        ["namespaces", ns, plural, name, sub] => {
            let kind = kind(plural).filter(|k| k.namespaced())?;
            Some(Target::Sub {
                kind,
                ns: ns.to_string(),
                name: name.to_string(),
                sub: sub.to_string(),
            })
        }
        _ => None,
    }
}

async fn dispatch(sh: &Arc<Shared>, req: Request) -> Result<Response, ApiError> {
    // As with the default RBAC of a real cluster, anonymous requests may read the version
    // and health endpoints; a wrong token is refused everywhere.
    let public = matches!(
        req.uri().path(),
        "/version" | "/healthz" | "/livez" | "/readyz"
    ) && !req.headers().contains_key(header::AUTHORIZATION);
    if !public && !authorized(sh, &req) {
        return Err(ApiError::unauthorized());
    }
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    if method == Method::GET
        && let Some(document) = discovery::document(&segs, &sh.address)
    {
        count(sh, &req, "get", &path);
        if sh.faults().discovery_faults {
            inject_request_faults(sh, "discovery").await?;
        }
        return Ok(value_response(StatusCode::OK, &document));
    }
    match (method.clone(), segs.as_slice()) {
        (Method::GET, ["healthz" | "livez" | "readyz"]) => {
            count(sh, &req, "get", &path);
            return Ok((StatusCode::OK, "ok").into_response());
        }
        (_, ["sim", rest @ ..]) => {
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            return admin(sh, method, &rest, req).await;
        }
        (method, ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            count(sh, &req, "create", "tokenreviews");
            inject_request_faults(sh, "tokenreviews").await?;
            return reviews::token_review(sh, &read_body(req).await?);
        }
        (method, ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]) => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            count(sh, &req, "create", "subjectaccessreviews");
            inject_request_faults(sh, "subjectaccessreviews").await?;
            return reviews::subject_access_review(sh, &read_body(req).await?);
        }
        _ => {}
    }
    // The deprecated `/watch/` path form: `/api/v1/watch/namespaces/NS/pods[/NAME]`.
    let watch_path = match segs.as_slice() {
        ["api", "v1", "watch", ..] => Some(2),
        ["apis", _, "v1", "watch", ..] => Some(3),
        _ => None,
    };
    let mut segs = segs;
    if let Some(i) = watch_path {
        segs.remove(i);
    }
    let Some(target) = resolve(&segs) else {
        return Err(ApiError::no_route());
    };
    let mut q = query_of(&req);
    // Counted when received, as an audit log's RequestReceived stage: a request then delayed
    // by injected latency counts even when its client gives up on it.
    count_request(
        sh,
        &req,
        &method,
        &target,
        watch_path.is_some() || flag(&q, "watch"),
    );
    inject_request_faults(sh, target.kind().plural()).await?;
    if method != Method::GET {
        shed_writes_above_rate(sh)?;
    }
    let target = match (watch_path, target) {
        (None, target) => target,
        (Some(_), Target::Object { kind, ns, name }) if method == Method::GET => {
            let by_name = format!("metadata.name={name}");
            let fields = match q.get("fieldSelector").filter(|f| !f.is_empty()) {
                Some(f) => format!("{f},{by_name}"),
                None => by_name,
            };
            q.insert("fieldSelector".into(), fields);
            q.insert("watch".into(), "true".into());
            Target::Collection {
                kind,
                ns: (!ns.is_empty()).then_some(ns),
            }
        }
        (Some(_), target @ Target::Collection { .. }) if method == Method::GET => {
            q.insert("watch".into(), "true".into());
            target
        }
        (Some(_), _) => return Err(ApiError::no_route()),
    };
    if q.get("dryRun").is_some_and(|v| !v.is_empty()) {
        // Refused rather than ignored: ignoring it would store what the client meant to try.
        return Err(ApiError::bad_request(
            "dryRun is not supported by the simulated cluster",
        ));
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let table = (matches!(&target, Target::Collection { kind, .. } | Target::Object { kind, .. } if printed(*kind))
        && wants_table(accept))
    .then(|| IncludeObject::parse(q.get("includeObject").map(String::as_str)));
    // kubectl's `create namespace` and `create configmap` send protobuf; those two kinds
    // are decoded on create, every other protobuf body is refused as before.
    let protobuf_create = method == Method::POST
        && matches!(&target, Target::Collection { kind, .. } if protobuf::understands(*kind))
        && protobuf::is_protobuf(&content_type(&req));
    if req.method() != Method::PATCH && content_type(&req).contains("protobuf") && !protobuf_create
    {
        return Err(ApiError::unsupported_media_type(
            &content_type(&req),
            "application/json, application/yaml",
        ));
    }
    if (method == Method::POST || method == Method::PUT)
        && !protobuf_create
        && !is_object_body_type(&content_type(&req))
    {
        return Err(ApiError::unsupported_media_type(
            &content_type(&req),
            "application/json, application/yaml",
        ));
    }
    match (method, target) {
        (Method::GET, Target::Collection { kind, ns }) => {
            if flag(&q, "watch") {
                if watch::is_websocket_request(req.headers()) {
                    let (mut parts, _) = req.into_parts();
                    return watch::websocket_response(&mut parts, || {
                        watch::events(sh, kind, ns, &q, table)
                    })
                    .await;
                }
                watch::events(sh, kind, ns, &q, table).map(watch::http_response)
            } else {
                let response = list(sh, kind, ns.as_deref(), &q, table);
                sh.lists.pass().await;
                response
            }
        }
        (Method::POST, Target::Collection { kind, ns }) => {
            let ns = namespace_for_write(kind, ns)?;
            if kind == Kind::Pod {
                sh.pod_creates.pass().await;
            }
            let body = read_body(req).await?;
            let obj = if protobuf_create {
                crate::protobuf::decode(kind, &body)?
            } else {
                parse_object(&body)?
            };
            create(sh, kind, &ns, obj, true)
        }
        (Method::DELETE, Target::Collection { kind, ns }) => {
            let body = read_body(req).await?;
            delete_collection(sh, kind, ns.as_deref(), &q, &body)
        }
        (Method::GET, Target::Object { kind, ns, name }) => match table {
            Some(include) => {
                let stored = sh
                    .store
                    .get(kind, &ns, &name)
                    .ok_or_else(|| ApiError::not_found(kind.plural(), kind.group(), &name))?;
                let meta = json!({"resourceVersion": sh.store.resource_version().to_string()});
                Ok(value_response(
                    StatusCode::OK,
                    &printed_table(kind, &[&*stored.value], include, meta),
                ))
            }
            None => get(sh, kind, &ns, &name),
        },
        (Method::PUT, Target::Object { kind, ns, name }) => {
            let body = read_body(req).await?;
            replace(sh, kind, &ns, &name, None, &body)
        }
        (Method::PATCH, Target::Object { kind, ns, name }) => {
            let ct = content_type(&req);
            let body = read_body(req).await?;
            patch(sh, kind, &ns, &name, None, &ct, &body)
        }
        (Method::DELETE, Target::Object { kind, ns, name }) => {
            let body = read_body(req).await?;
            delete(sh, kind, &ns, &name, &q, &body)
        }
        (
            Method::GET,
            Target::Sub {
                kind: Kind::Pod,
                ns,
                name,
                sub,
            },
        ) if sub == "status" => get(sh, Kind::Pod, &ns, &name),
        (
            Method::PUT,
            Target::Sub {
                kind: Kind::Pod,
                ns,
                name,
                sub,
            },
        ) if sub == "status" => {
            let body = read_body(req).await?;
            replace(sh, Kind::Pod, &ns, &name, Some("status"), &body)
        }
        (
            Method::PATCH,
            Target::Sub {
                kind: Kind::Pod,
                ns,
                name,
                sub,
            },
        ) if sub == "status" => {
            let ct = content_type(&req);
            let body = read_body(req).await?;
            patch(sh, Kind::Pod, &ns, &name, Some("status"), &ct, &body)
        }
        (
            Method::POST,
            Target::Sub {
                kind: Kind::Pod,
                ns,
                name,
                sub,
            },
        ) if sub == "binding" => {
            let body = read_body(req).await?;
            bind(sh, &ns, &name, &body)
        }
        (
            Method::GET,
            Target::Sub {
                kind: Kind::Pod,
                ns,
                name,
                sub,
            },
        ) if sub == "log" && sh.process_dir.is_some() => pod_log(sh, &ns, &name, &q),
        (_, Target::Sub { sub, .. }) if sub != "status" && sub != "binding" => {
            Err(ApiError::no_route())
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// `pods/NAME/log` under the process runtime: the container's log file as text
/// (`container`, `tailLines`; `follow` answers what is there now).
fn pod_log(sh: &Shared, ns: &str, name: &str, q: &Query) -> Result<Response, ApiError> {
    let pod = sh
        .store
        .get(Kind::Pod, ns, name)
        .ok_or_else(|| ApiError::not_found("pods", "", name))?;
    let containers: Vec<String> = pod
        .value
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let container = match q.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(c) => c.clone(),
        Some(c) => {
            return Err(ApiError::bad_request(format!(
                "container {c} is not valid for pod {name}"
            )));
        }
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            )));
        }
    };
    if flag(q, "previous") {
        return Err(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{name}\" not found"
        )));
    }
    let dir = sh
        .process_dir
        .as_ref()
        .ok_or_else(ApiError::no_route)?
        .join(ns)
        .join(crate::process::pod_dir_name(name, pod.uid()));
    let text = std::fs::read_to_string(dir.join(format!("{container}.log"))).map_err(|_| {
        ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"
        ))
    })?;
    let text = match parse_u64(q, "tailLines")? {
        Some(n) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n as usize);
            lines[from..].iter().map(|l| format!("{l}\n")).collect()
        }
        None => text,
    };
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(resp)
}

fn content_type(req: &Request) -> String {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn namespace_for_write(kind: Kind, ns: Option<String>) -> Result<String, ApiError> {
    match (kind.namespaced(), ns) {
        (false, _) => Ok(String::new()),
        (true, Some(ns)) => Ok(ns),
        (true, None) => Err(ApiError::method_not_allowed()),
    }
}

/// The latency and errors of `faults` for a request for `resource` (a plural name).
async fn inject_request_faults(sh: &Shared, resource: &str) -> Result<(), ApiError> {
    let faults = sh.faults();
    if !faults.only_resources.is_empty() && !faults.only_resources.iter().any(|r| r == resource) {
        return Ok(());
    }
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    if faults.error_500_fraction > 0.0 || faults.error_429_fraction > 0.0 {
        let roll = sh.roll();
        if roll < faults.error_500_fraction {
            return Err(ApiError::internal("injected fault"));
        }
        if roll < faults.error_500_fraction + faults.error_429_fraction {
            return Err(ApiError::too_many_requests(
                faults.retry_after_seconds.max(1),
            ));
        }
    }
    Ok(())
}

/// Answers 429 a write above `faults.max_writes_per_second`, as API Priority and Fairness
/// does (plain text, `Retry-After`): a token bucket holding a second's worth, refilled
/// continuously.
fn shed_writes_above_rate(sh: &Shared) -> Result<(), ApiError> {
    let faults = sh.faults();
    if faults.max_writes_per_second == 0 {
        return Ok(());
    }
    let rate = f64::from(faults.max_writes_per_second);
    let now = std::time::Instant::now();
    let mut bucket = sh.write_tokens.lock().unwrap_or_else(|p| p.into_inner());
    let (tokens, counted) = *bucket;
    let tokens = match counted {
        Some(at) => (tokens + now.duration_since(at).as_secs_f64() * rate).min(rate),
        None => rate,
    };
    if tokens >= 1.0 {
        *bucket = (tokens - 1.0, Some(now));
        return Ok(());
    }
    *bucket = (tokens, Some(now));
    sh.writes_shed
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Err(ApiError::flow_control_rejected(
        faults.retry_after_seconds.max(1),
    ))
}

/// Counts a request to a resource under its User-Agent, verb (as Kubernetes' audit log
/// names it) and resource.
fn count_request(sh: &Shared, req: &Request, method: &Method, target: &Target, watch: bool) {
    let (verb, kind) = match (target, method.clone()) {
        (Target::Collection { kind, .. }, Method::GET) if watch => ("watch", kind),
        (Target::Collection { kind, .. }, Method::GET) => ("list", kind),
        (Target::Collection { kind, .. }, Method::POST) => ("create", kind),
        (Target::Collection { kind, .. }, Method::DELETE) => ("deletecollection", kind),
        (Target::Object { kind, .. }, Method::GET) => ("get", kind),
        (Target::Object { kind, .. }, Method::PUT) => ("update", kind),
        (Target::Object { kind, .. }, Method::PATCH) => ("patch", kind),
        (Target::Object { kind, .. }, Method::DELETE) => ("delete", kind),
        (Target::Sub { kind, .. }, _) => ("subresource", kind),
        (Target::Collection { kind, .. } | Target::Object { kind, .. }, _) => ("other", kind),
    };
    count(sh, req, verb, kind.plural());
    if !matches!(verb, "get" | "list" | "watch") {
        let (namespace, name, resource) = match target {
            Target::Collection { ns, .. } => (
                ns.clone().unwrap_or_default(),
                String::new(),
                kind.plural().to_string(),
            ),
            Target::Object { ns, name, .. } => {
                (ns.clone(), name.clone(), kind.plural().to_string())
            }
            Target::Sub { ns, name, sub, .. } => {
                (ns.clone(), name.clone(), format!("{}/{sub}", kind.plural()))
            }
        };
        let write = SimWrite {
            agent: user_agent(req),
            verb: verb.to_string(),
            resource,
            namespace,
            name,
            received_at: sh.store.resource_version(),
        };
        sh.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(write);
    }
}

fn user_agent(req: &Request) -> String {
    req.headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Counts a request under its User-Agent, `verb` and `resource` (a resource's plural, or
/// the path of a non-resource request such as `/version`, as the audit log's
/// `requestURI`).
fn count(sh: &Shared, req: &Request, verb: &str, resource: &str) {
    let agent = user_agent(req);
    let mut requests = sh.requests.lock().unwrap_or_else(|p| p.into_inner());
    *requests
        .entry((agent, verb.to_string(), resource.to_string()))
        .or_default() += 1;
}

async fn admin(
    sh: &Shared,
    method: Method,
    rest: &[String],
    req: Request,
) -> Result<Response, ApiError> {
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method, rest.as_slice()) {
        (Method::GET, ["faults"]) => Ok(value_response(StatusCode::OK, &json!(sh.faults()))),
        (Method::PUT, ["faults"]) => {
            let body = read_body(req).await?;
            let faults: FaultSettings = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad_request(format!("invalid fault settings: {e}")))?;
            faults.validate().map_err(ApiError::bad_request)?;
            *sh.faults.write().unwrap_or_else(|p| p.into_inner()) = faults.clone();
            Ok(value_response(StatusCode::OK, &json!(faults)))
        }
        (Method::POST, ["compact"]) => {
            sh.store.compact();
            Ok(value_response(
                StatusCode::OK,
                &json!({"compactedTo": sh.store.compacted().to_string()}),
            ))
        }
        (Method::GET, ["stats"]) => Ok(value_response(
            StatusCode::OK,
            &json!({
                "resourceVersion": sh.store.resource_version().to_string(),
                "pods": sh.store.count(Kind::Pod, None),
                "configmaps": sh.store.count(Kind::ConfigMap, None),
                "services": sh.store.count(Kind::Service, None),
                "persistentvolumeclaims": sh.store.count(Kind::PersistentVolumeClaim, None),
                "leases": sh.store.count(Kind::Lease, None),
                "secrets": sh.store.count(Kind::Secret, None),
                "resourcequotas": sh.store.count(Kind::ResourceQuota, None),
                "namespaces": sh.store.count(Kind::Namespace, None),
                "nodes": sh.store.count(Kind::Node, None),
            }),
        )),
        (Method::GET, ["requests"]) => {
            let requests = sh.requests.lock().unwrap_or_else(|p| p.into_inner());
            let rows: Vec<Value> = requests
                .iter()
                .map(|((agent, verb, resource), count)| {
                    json!({"userAgent": agent, "verb": verb, "resource": resource, "count": count})
                })
                .collect();
            Ok(value_response(StatusCode::OK, &json!({ "requests": rows })))
        }
        (_, ["faults" | "compact" | "stats" | "requests"]) => Err(ApiError::method_not_allowed()),
        _ => Err(ApiError::no_route()),
    }
}

/// Creates an object from inside the server (initial namespaces), without injected faults.
pub(crate) fn create_internal(sh: &Shared, kind: Kind, obj: Value) -> Result<(), ApiError> {
    create(sh, kind, "", obj, false).map(|_| ())
}

/// Whether a create or update body of this media type is decoded (as a real API server does,
/// JSON and YAML; no Content-Type counts as JSON). Anything else is a 415.
fn is_object_body_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(media.as_str(), "" | "application/json" | "application/yaml")
}
