//! The HTTP side of the simulated API server: routing of Kubernetes API paths, discovery,
//! the verbs of each resource, watches, authentication and injected faults.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method, StatusCode, header};
use rand::Rng;
use rand::rngs::SmallRng;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::objects::{self, PatchType, now_rfc3339};
use super::selector::{FieldSelector, LabelSelector, Selector};
use super::settings::{FaultSettings, SimSettings};
use super::status::ApiError;
use super::store::{Deletion, Event, EventType, Kind, Store, Stored};
use super::table::{IncludeObject, pod_table, wants_table};

/// State shared by every request, the kubelet and the garbage collector.
pub(crate) struct Shared {
    pub store: Store,
    pub settings: SimSettings,
    pub faults: RwLock<FaultSettings>,
    pub rng: Mutex<SmallRng>,
    pub cancel: CancellationToken,
    /// `host:port` the server listens on (for discovery's serverAddressByClientCIDRs).
    pub address: String,
    /// While true, LIST answers are computed and then held back (see
    /// `SimCluster::hold_list_responses`): reproduces a slow LIST racing watch events.
    pub hold_lists: tokio::sync::watch::Sender<bool>,
    /// LIST answers held back right now.
    pub held_lists: std::sync::atomic::AtomicUsize,
}

impl Shared {
    pub(crate) fn faults(&self) -> FaultSettings {
        self.faults
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A uniform random number in `0..1` from the seeded generator.
    pub(crate) fn roll(&self) -> f64 {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .r#gen::<f64>()
    }

    fn uid(&self) -> String {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let b: [u8; 16] = rng.r#gen();
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[0..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..32]
        )
    }

    fn name_suffix(&self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        (0..5)
            .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
            .collect()
    }
}

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

fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut resp = (code, body.into()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn value_response(code: StatusCode, v: &Value) -> Response {
    json_response(code, v.to_string())
}

type Query = HashMap<String, String>;

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

fn flag(q: &Query, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true" || v == "1")
}

fn parse_u64(q: &Query, key: &str) -> Result<Option<u64>, ApiError> {
    match q.get(key).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "invalid value {v:?} for {key}: must be a non-negative integer"
            ))
        }),
    }
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
    match (method.clone(), segs.as_slice()) {
        (Method::GET, ["version"]) => return Ok(value_response(StatusCode::OK, &version())),
        (Method::GET, ["healthz" | "livez" | "readyz"]) => {
            return Ok((StatusCode::OK, "ok").into_response());
        }
        (Method::GET, ["api"]) => {
            return Ok(value_response(StatusCode::OK, &api_versions(&sh.address)));
        }
        (Method::GET, ["apis"]) => return Ok(value_response(StatusCode::OK, &api_groups())),
        (Method::GET, ["apis", "coordination.k8s.io"]) => {
            return Ok(value_response(StatusCode::OK, &coordination_group()));
        }
        (Method::GET, ["api", "v1"]) => {
            return Ok(value_response(StatusCode::OK, &resource_list("")));
        }
        (Method::GET, ["apis", "coordination.k8s.io", "v1"]) => {
            return Ok(value_response(
                StatusCode::OK,
                &resource_list("coordination.k8s.io"),
            ));
        }
        (Method::GET, ["openapi", "v3"]) => {
            return Ok(value_response(StatusCode::OK, &openapi_v3_index()));
        }
        (Method::GET, ["openapi", "v3", "api", "v1"]) => {
            return Ok(value_response(StatusCode::OK, &openapi_v3_group("")));
        }
        (Method::GET, ["openapi", "v3", "apis", "coordination.k8s.io", "v1"]) => {
            return Ok(value_response(
                StatusCode::OK,
                &openapi_v3_group("coordination.k8s.io"),
            ));
        }
        (_, ["sim", rest @ ..]) => {
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            return admin(sh, method, &rest, req).await;
        }
        _ => {}
    }
    let Some(target) = resolve(&segs) else {
        return Err(ApiError::no_route());
    };
    inject_request_faults(sh).await?;
    let q = query_of(&req);
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
    let table = (matches!(
        &target,
        Target::Collection {
            kind: Kind::Pod,
            ..
        } | Target::Object {
            kind: Kind::Pod,
            ..
        }
    ) && wants_table(accept))
    .then(|| IncludeObject::parse(q.get("includeObject").map(String::as_str)));
    if req.method() != Method::PATCH && content_type(&req).contains("protobuf") {
        return Err(ApiError::unsupported_media_type(
            &content_type(&req),
            "application/json, application/yaml",
        ));
    }
    match (method, target) {
        (Method::GET, Target::Collection { kind, ns }) => {
            if flag(&q, "watch") {
                watch(sh, kind, ns, &q, table)
            } else {
                let response = list(sh, kind, ns.as_deref(), &q, table);
                hold_list_response(sh).await;
                response
            }
        }
        (Method::POST, Target::Collection { kind, ns }) => {
            let ns = namespace_for_write(kind, ns)?;
            let body = read_body(req).await?;
            let obj = parse_object(&body)?;
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
                    &pod_table(&[&*stored.value], include, meta),
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
        (_, Target::Sub { sub, .. }) if sub != "status" && sub != "binding" => {
            Err(ApiError::no_route())
        }
        _ => Err(ApiError::method_not_allowed()),
    }
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

/// Waits while LIST answers are held (the answer is already computed: the state it shows
/// is the one at the time of the request, as with a slow response on a real server).
async fn hold_list_response(sh: &Shared) {
    use std::sync::atomic::Ordering;
    let mut hold = sh.hold_lists.subscribe();
    if !*hold.borrow_and_update() {
        return;
    }
    sh.held_lists.fetch_add(1, Ordering::SeqCst);
    // Ends when the hold is released or the sender (the cluster) is gone.
    let _ = hold.wait_for(|held| !*held).await;
    sh.held_lists.fetch_sub(1, Ordering::SeqCst);
}

async fn inject_request_faults(sh: &Shared) -> Result<(), ApiError> {
    let faults = sh.faults();
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

fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).or_else(|json_err| {
        // kubectl and most clients send JSON; YAML is accepted as a convenience.
        serde_yaml::from_slice::<Value>(body).map_err(|_| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be JSON): {json_err}"
            ))
        })
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be a JSON object)",
        ));
    }
    Ok(v)
}

fn check_type(kind: Kind, obj: &Value) -> Result<(), ApiError> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != kind.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            kind.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && k != kind.kind()
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            kind.kind()
        )));
    }
    if obj.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn create(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    mut obj: Value,
    faults_apply: bool,
) -> Result<Response, ApiError> {
    check_type(kind, &obj)?;
    if kind.namespaced()
        && let Some(body_ns) = meta_str(&obj, "namespace")
        && body_ns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let fixed = meta_str(&obj, "name").map(str::to_string);
    let generate = meta_str(&obj, "generateName").map(str::to_string);
    let (mut name_for, generated): (Box<dyn FnMut() -> String + '_>, bool) = match (fixed, generate)
    {
        (Some(name), _) => (Box::new(move || name.clone()), false),
        (None, Some(prefix)) => (
            Box::new(move || format!("{prefix}{}", sh.name_suffix())),
            true,
        ),
        (None, None) => {
            return Err(objects::invalid_error(
                kind,
                "",
                vec![super::status::Cause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "Required value: name or generateName is required".into(),
                }],
            ));
        }
    };
    let probe = name_for();
    objects::check_schema(kind, &obj)?;
    let causes = objects::validate(kind, &obj, &probe);
    if !causes.is_empty() {
        return Err(objects::invalid_error(kind, &probe, causes));
    }
    if kind.namespaced() && !sh.store.namespace_exists(ns) {
        return Err(ApiError::not_found("namespaces", "", ns));
    }
    let uid = sh.uid();
    let now = now_rfc3339();
    if faults_apply && kind == Kind::Pod {
        let faults = sh.faults();
        if faults.quota_fraction > 0.0 || faults.lost_create_fraction > 0.0 {
            let roll = sh.roll();
            if roll < faults.quota_fraction {
                return Err(ApiError::exceeded_quota(
                    &probe,
                    sh.store.count(Kind::Pod, Some(ns)),
                ));
            }
            if roll < faults.quota_fraction + faults.lost_create_fraction {
                let rv = sh.store.burn_resource_version();
                objects::prepare_create(kind, &mut obj, ns, &probe, &uid, &now);
                obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                return Ok(value_response(StatusCode::CREATED, &obj));
            }
        }
    }
    let mut first = Some(probe);
    let stored = sh.store.create(
        kind,
        ns,
        || first.take().unwrap_or_else(&mut name_for),
        generated,
        |name| {
            objects::prepare_create(kind, &mut obj, ns, name, &uid, &now);
            obj
        },
    )?;
    Ok(json_response(StatusCode::CREATED, stored.json))
}

fn get(sh: &Shared, kind: Kind, ns: &str, name: &str) -> Result<Response, ApiError> {
    sh.store
        .get(kind, ns, name)
        .map(|s| json_response(StatusCode::OK, s.json))
        .ok_or_else(|| ApiError::not_found(kind.plural(), kind.group(), name))
}

fn selector_of(kind: Kind, q: &Query) -> Result<Selector, ApiError> {
    Ok(Selector {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
            kind.field_labels(),
        )?,
    })
}

fn list_kind(kind: Kind) -> String {
    format!("{}List", kind.kind())
}

/// A `continue` token: the list's version and the last key returned, hex-encoded.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}/{ns}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '/');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, parts.next()?.to_string(), parts.next()?.to_string()))
}

fn list(
    sh: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &Query,
    table: Option<IncludeObject>,
) -> Result<Response, ApiError> {
    let sel = selector_of(kind, q)?;
    let limit = parse_u64(q, "limit")?.unwrap_or(0) as usize;
    let rv_param = parse_u64(q, "resourceVersion")?;
    if q.get("resourceVersionMatch").is_some_and(|m| m == "Exact")
        && let Some(rv) = rv_param
        && rv < sh.store.compacted()
    {
        return Err(ApiError::expired(format!(
            "too old resource version: {rv} ({})",
            sh.store.compacted() + 1
        )));
    }
    let cont = match q.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(token) => {
            let (rv, cns, cname) = decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
            if rv < sh.store.compacted() {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
                ));
            }
            Some((rv, (cns, cname)))
        }
    };
    let (items, store_rv, more) =
        sh.store
            .list(kind, ns, cont.as_ref().map(|(_, k)| k), limit, |v| {
                sel.is_empty() || sel.matches(v)
            });
    let list_rv = cont.as_ref().map(|(rv, _)| *rv).unwrap_or(store_rv);
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if more && let Some(last) = items.last() {
        let lns = last
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        let lname = last
            .value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        meta["continue"] = Value::String(encode_continue(list_rv, lns, lname));
    }
    if let Some(include) = table {
        let values: Vec<&Value> = items.iter().map(|s| &*s.value).collect();
        return Ok(value_response(
            StatusCode::OK,
            &pod_table(&values, include, meta),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        list_body(kind, &meta, items.iter().map(|s| &s.json)),
    ))
}

fn list_body<'a>(kind: Kind, meta: &Value, items: impl Iterator<Item = &'a Bytes>) -> Bytes {
    let mut out = BytesMut::with_capacity(256);
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{meta},\"items\":[",
            list_kind(kind),
            kind.api_version()
        )
        .as_bytes(),
    );
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.extend_from_slice(b",");
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    out.freeze()
}

/// Applies the API server's rules to a proposed new state of an object: immutable system
/// metadata, resourceVersion precondition, status only through `/status`, validation.
fn finish_update(
    kind: Kind,
    sub: Option<&str>,
    current: &Value,
    mut proposed: Value,
) -> Result<Value, ApiError> {
    let name = current
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !proposed.is_object() || proposed.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be a JSON object)",
        ));
    }
    check_type(kind, &proposed)?;
    if let Some(n) = meta_str(&proposed, "name")
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    let current_rv = current
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(rv) = meta_str(&proposed, "resourceVersion")
        && rv != current_rv
    {
        return Err(ApiError::conflict(kind.plural(), kind.group(), &name));
    }
    if sub == Some("status") {
        let mut next = current.clone();
        next["status"] = proposed.get("status").cloned().unwrap_or_else(|| json!({}));
        if !next["status"].is_object() {
            return Err(ApiError::bad_request("status must be an object"));
        }
        objects::check_schema(kind, &next)?;
        return Ok(next);
    }
    proposed["kind"] = Value::String(kind.kind().to_string());
    proposed["apiVersion"] = Value::String(kind.api_version().to_string());
    if proposed.get("metadata").is_none() {
        proposed["metadata"] = json!({});
    }
    for system in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match current.pointer(&format!("/metadata/{system}")) {
            Some(v) => proposed["metadata"][system] = v.clone(),
            None => {
                if let Some(m) = proposed["metadata"].as_object_mut() {
                    m.remove(system);
                }
            }
        }
    }
    if kind == Kind::Pod {
        proposed["status"] = current.get("status").cloned().unwrap_or_else(|| json!({}));
        check_pod_spec_update(current, &proposed, &name)?;
    }
    if kind == Kind::Namespace {
        proposed["status"] = current.get("status").cloned().unwrap_or(Value::Null);
    }
    if kind == Kind::ConfigMap {
        check_config_map_update(current, &proposed, &name)?;
    }
    if proposed.get("spec") != current.get("spec")
        && let Some(g) = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
    {
        proposed["metadata"]["generation"] = json!(g + 1);
    }
    let causes = objects::validate(kind, &proposed, &name);
    if !causes.is_empty() {
        return Err(objects::invalid_error(kind, &name, causes));
    }
    objects::check_schema(kind, &proposed)?;
    Ok(proposed)
}

/// A pod's spec is immutable except container images (and scheduling gates, not modelled).
fn check_pod_spec_update(current: &Value, proposed: &Value, name: &str) -> Result<(), ApiError> {
    let strip = |v: &Value| {
        let mut spec = v.get("spec").cloned().unwrap_or(Value::Null);
        if let Some(cs) = spec.get_mut("containers").and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(c) = c.as_object_mut() {
                    c.remove("image");
                }
            }
        }
        spec
    };
    if strip(current) != strip(proposed) {
        return Err(objects::invalid_error(
            Kind::Pod,
            name,
            vec![super::status::Cause {
                reason: "FieldValueForbidden",
                field: "spec".into(),
                message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`".into(),
            }],
        ));
    }
    Ok(())
}

/// A ConfigMap marked `immutable: true` keeps its data, binaryData and the mark itself.
fn check_config_map_update(current: &Value, proposed: &Value, name: &str) -> Result<(), ApiError> {
    if current.get("immutable") != Some(&Value::Bool(true)) {
        return Ok(());
    }
    let causes: Vec<super::status::Cause> = ["immutable", "data", "binaryData"]
        .into_iter()
        .filter(|field| current.get(*field) != proposed.get(*field))
        .map(|field| super::status::Cause {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: "Forbidden: field is immutable when `immutable` is set".into(),
        })
        .collect();
    if causes.is_empty() {
        Ok(())
    } else {
        Err(objects::invalid_error(Kind::ConfigMap, name, causes))
    }
}

fn replace(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let proposed = parse_object(body)?;
    let stored = sh.store.update(
        kind,
        ns,
        name,
        Box::new(|cur| finish_update(kind, sub, cur, proposed).map(Some)),
    )?;
    Ok(json_response(StatusCode::OK, stored.json))
}

fn patch(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    ct: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let patch_type = PatchType::from_content_type(ct)?;
    let patch = patch_type.parse(body)?;
    if patch_type == PatchType::Apply && sub.is_none() && sh.store.get(kind, ns, name).is_none() {
        let mut obj = patch;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the object provided is unrecognized (must be an object)",
            ));
        }
        if obj.get("metadata").is_none_or(|m| !m.is_object()) {
            obj["metadata"] = json!({});
        }
        obj["metadata"]["name"] = Value::String(name.to_string());
        return create(sh, kind, if kind.namespaced() { ns } else { "" }, obj, true)
            .map(|r| (StatusCode::CREATED, r).into_response());
    }
    let stored = sh.store.update(
        kind,
        ns,
        name,
        Box::new(|cur| {
            let proposed = patch_type.apply(cur, &patch)?;
            finish_update(kind, sub, cur, proposed).map(Some)
        }),
    )?;
    Ok(json_response(StatusCode::OK, stored.json))
}

/// `DeleteOptions` as sent in a DELETE body or query.
struct DeleteOptions {
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
}

fn delete_options(q: &Query, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        grace: None,
        uid: None,
        resource_version: None,
    };
    if let Some(g) = q.get("gracePeriodSeconds") {
        opts.grace = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        );
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("unable to decode DeleteOptions: {e}")))?;
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            opts.grace = Some(g);
        }
        opts.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    Ok(opts)
}

fn check_preconditions(
    kind: Kind,
    name: &str,
    obj: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let uid = obj
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(want) = &opts.uid
        && want != uid
    {
        return Err(ApiError::conflict_message(
            kind.plural(),
            kind.group(),
            name,
            format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
        ));
    }
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(want) = &opts.resource_version
        && want != rv
    {
        return Err(ApiError::conflict_message(
            kind.plural(),
            kind.group(),
            name,
            format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
            ),
        ));
    }
    Ok(())
}

/// Deletes one object with the real server's rules; returns its last state.
pub(crate) fn delete_object(
    store: &Store,
    kind: Kind,
    ns: &str,
    name: &str,
    opts_grace: Option<i64>,
    check: impl FnOnce(&Value) -> Result<(), ApiError>,
) -> Result<(Stored, bool), ApiError> {
    if kind == Kind::Namespace {
        if ["default", "kube-system", "kube-public"].contains(&name) {
            return Err(ApiError::forbidden(
                "namespaces",
                "",
                name,
                "this namespace may not be deleted".into(),
            ));
        }
        return store.delete_namespace(name).map(|s| (s, true));
    }
    store.delete(kind, ns, name, |cur| {
        check(cur)?;
        if kind == Kind::Pod {
            Ok(objects::pod_deletion(cur, opts_grace, &now_rfc3339()))
        } else {
            Ok(Deletion::Now(None))
        }
    })
}

fn delete(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    q: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let opts = delete_options(q, body)?;
    let (stored, _) = delete_object(&sh.store, kind, ns, name, opts.grace, |cur| {
        check_preconditions(kind, name, cur, &opts)
    })?;
    if matches!(kind, Kind::Pod | Kind::Namespace) {
        return Ok(json_response(StatusCode::OK, stored.json));
    }
    let mut details = json!({"name": name, "kind": kind.plural(), "uid": stored.uid()});
    if !kind.group().is_empty() {
        details["group"] = Value::String(kind.group().to_string());
    }
    Ok(value_response(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
    ))
}

fn delete_collection(
    sh: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let sel = selector_of(kind, q)?;
    let opts = delete_options(q, body)?;
    let (items, _, _) = sh.store.list(kind, ns, None, 0, |v| sel.matches(v));
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        let ins = item
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let iname = item
            .value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // The object may have changed since the list: re-check the selector under the lock.
        match delete_object(&sh.store, kind, &ins, &iname, opts.grace, |cur| {
            if sel.matches(cur) {
                Ok(())
            } else {
                Err(ApiError::no_route())
            }
        }) {
            Ok((stored, _)) => deleted.push(stored.json),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let meta = json!({"resourceVersion": sh.store.resource_version().to_string()});
    Ok(json_response(
        StatusCode::OK,
        list_body(kind, &meta, deleted.iter()),
    ))
}

fn bind(sh: &Shared, ns: &str, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let binding = parse_object(body)?;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if node.is_empty() {
        return Err(objects::invalid_error(
            Kind::Pod,
            name,
            vec![super::status::Cause {
                reason: "FieldValueRequired",
                field: "target.name".into(),
                message: "Required value".into(),
            }],
        ));
    }
    bind_pod(&sh.store, ns, name, &node)?;
    Ok(value_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// Binds a pod to a node as `pods/binding` does (also used by the simulated scheduler).
pub(crate) fn bind_pod(
    store: &Store,
    ns: &str,
    name: &str,
    node: &str,
) -> Result<Stored, ApiError> {
    store.update(
        Kind::Pod,
        ns,
        name,
        Box::new(|cur| {
            if cur.pointer("/metadata/deletionTimestamp").is_some() {
                return Err(ApiError::conflict_message(
                    "pods",
                    "",
                    name,
                    "pod is being deleted, cannot be assigned to a host".into(),
                ));
            }
            if let Some(existing) = cur
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict_message(
                    "pods",
                    "",
                    name,
                    format!("pod {name} is already assigned to node \"{existing}\""),
                ));
            }
            let mut next = cur.clone();
            next["spec"]["nodeName"] = Value::String(node.to_string());
            set_condition(&mut next, "PodScheduled", "True", None, None);
            Ok(Some(next))
        }),
    )
}

/// Sets (or replaces) one pod condition.
pub(crate) fn set_condition(
    pod: &mut Value,
    kind: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    let mut cond = json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": now_rfc3339()});
    if let Some(r) = reason {
        cond["reason"] = Value::String(r.to_string());
    }
    if let Some(m) = message {
        cond["message"] = Value::String(m.to_string());
    }
    if !pod.get("status").is_some_and(Value::is_object) {
        pod["status"] = json!({});
    }
    let conditions = pod["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(list)) = conditions {
        match list
            .iter_mut()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        {
            Some(existing) => {
                if existing.get("status") == cond.get("status") {
                    cond["lastTransitionTime"] = existing
                        .get("lastTransitionTime")
                        .cloned()
                        .unwrap_or(Value::Null);
                }
                *existing = cond;
            }
            None => list.push(cond),
        }
    }
}

/// Renders one event for one watcher, or nothing when the watcher does not see it. An
/// object leaving the selector is a DELETED event carrying its previous state, as the
/// real watch cache sends.
fn render(
    ev: &Event,
    ns: Option<&str>,
    sel: &Selector,
    table: Option<IncludeObject>,
) -> Option<Bytes> {
    if ns.is_some_and(|n| n != ev.namespace) {
        return None;
    }
    if let Some(include) = table {
        let line = render(ev, None, sel, None)?;
        // Re-shape the chosen event's object as a one-row Table.
        let parsed: Value = serde_json::from_slice(&line).ok()?;
        let event_type = parsed
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("MODIFIED")
            .to_string();
        let object = parsed.get("object")?;
        let meta = json!({"resourceVersion": ev.rv.to_string()});
        return Some(event_line(
            &event_type,
            &Bytes::from(pod_table(&[object], include, meta).to_string()),
        ));
    }
    if sel.is_empty() {
        return Some(event_line(ev.event_type.as_str(), &ev.object.json));
    }
    let now = sel.matches(&ev.object.value);
    let before = ev.previous.as_ref().map(|p| sel.matches(&p.value));
    match (ev.event_type, before, now) {
        (EventType::Added, _, true) | (EventType::Deleted, _, true) => {
            Some(event_line(ev.event_type.as_str(), &ev.object.json))
        }
        (EventType::Modified, Some(true) | None, true) => {
            Some(event_line("MODIFIED", &ev.object.json))
        }
        (EventType::Modified, Some(false), true) => Some(event_line("ADDED", &ev.object.json)),
        (EventType::Modified, Some(true), false) => {
            let mut old = ev.previous.as_ref().map(|p| (*p.value).clone())?;
            old["metadata"]["resourceVersion"] = Value::String(ev.rv.to_string());
            Some(event_line("DELETED", &Bytes::from(old.to_string())))
        }
        _ => None,
    }
}

fn event_line(event_type: &str, object: &Bytes) -> Bytes {
    let mut out = BytesMut::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    out.freeze()
}

fn bookmark(kind: Kind, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": kind.kind(), "apiVersion": kind.api_version(), "metadata": meta});
    event_line("BOOKMARK", &Bytes::from(obj.to_string()))
}

fn watch(
    sh: &Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    q: &Query,
    table: Option<IncludeObject>,
) -> Result<Response, ApiError> {
    let sel = selector_of(kind, q)?;
    let from = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v}")))?,
        ),
    };
    let bookmarks = flag(q, "allowWatchBookmarks");
    let initial_events = flag(q, "sendInitialEvents");
    let faults = sh.faults();
    let timeout = parse_u64(q, "timeoutSeconds")?.map(Duration::from_secs);
    let forced_close = faults.watch_close_after_seconds.map(Duration::from_secs);
    let (deadline, end_bookmark) = match (timeout, forced_close) {
        (Some(t), Some(f)) if f < t => (Some(f), false),
        (Some(t), _) => (Some(t), true),
        (None, Some(f)) => (Some(f), false),
        (None, None) => (None, false),
    };
    let from = if initial_events { None } else { from };
    let start = sh.store.watch(kind, ns.as_deref(), from);
    let sh = sh.clone();
    let bookmark_every = Duration::from_millis(sh.settings.bookmark_interval_ms);
    let stream = async_stream::stream! {
        let ws = match start {
            Ok(ws) => ws,
            Err(oldest) => {
                let err = ApiError::expired(format!("too old resource version: {} ({oldest})", from.unwrap_or(0)));
                yield Ok::<Bytes, Infallible>(event_line("ERROR", &Bytes::from(err.to_status().to_string())));
                return;
            }
        };
        let drop_fraction = faults.watch_drop_fraction;
        let dropped = |sh: &Shared| drop_fraction > 0.0 && sh.roll() < drop_fraction;
        for ev in &ws.backlog {
            if let Some(line) = render(ev, ns.as_deref(), &sel, table)
                && !dropped(&sh)
            {
                yield Ok(line);
            }
        }
        let mut last_rv = ws.rv;
        if initial_events {
            yield Ok(bookmark(kind, last_rv, true));
        }
        let mut live = ws.live;
        let sleep = async move {
            match deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::pin!(sleep);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + bookmark_every, bookmark_every);
        loop {
            tokio::select! {
                received = live.recv() => match received {
                    Ok(ev) => {
                        if ev.rv <= last_rv {
                            continue;
                        }
                        last_rv = ev.rv;
                        if ev.kind != kind {
                            continue;
                        }
                        if let Some(line) = render(&ev, ns.as_deref(), &sel, table)
                            && !dropped(&sh)
                        {
                            yield Ok(line);
                        }
                    }
                    // A watcher too slow for the broadcast is closed, as the real watch cache
                    // does; the client resumes from its last version.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => break,
                },
                _ = &mut sleep => {
                    if bookmarks && end_bookmark {
                        yield Ok(bookmark(kind, last_rv, false));
                    }
                    break;
                }
                _ = ticker.tick(), if bookmarks => {
                    yield Ok(bookmark(kind, last_rv, false));
                }
                _ = sh.cancel.cancelled() => break,
            }
        }
    };
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
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
                "leases": sh.store.count(Kind::Lease, None),
                "namespaces": sh.store.count(Kind::Namespace, None),
            }),
        )),
        (_, ["faults" | "compact" | "stats"]) => Err(ApiError::method_not_allowed()),
        _ => Err(ApiError::no_route()),
    }
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-sim", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn api_versions(address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]})
}

fn coordination_group() -> Value {
    json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": "coordination.k8s.io",
        "versions": [{"groupVersion": "coordination.k8s.io/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
    })
}

fn api_groups() -> Value {
    let mut group = coordination_group();
    if let Some(g) = group.as_object_mut() {
        g.remove("kind");
        g.remove("apiVersion");
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})
}

/// The OpenAPI v3 index kubectl reads to learn which group versions are described.
fn openapi_v3_index() -> Value {
    json!({"paths": {
        "api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"},
        "apis/coordination.k8s.io/v1": {"serverRelativeURL": "/openapi/v3/apis/coordination.k8s.io/v1?hash=sim"}
    }})
}

/// A minimal OpenAPI v3 document for one group version: only the PATCH operations with
/// their group-version-kind and the `fieldValidation` parameter, which is what kubectl
/// checks to choose server-side validation. No schemas are published.
fn openapi_v3_group(group: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
        let prefix = if group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group}/v1")
        };
        let path = if kind.namespaced() {
            format!(
                "{prefix}/namespaces/{{namespace}}/{}/{{name}}",
                kind.plural()
            )
        } else {
            format!("{prefix}/{}/{{name}}", kind.plural())
        };
        let op = json!({
            "operationId": format!("patch{}", kind.kind()),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": "v1", "kind": kind.kind()},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
            ],
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(path, json!({"patch": op}));
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": paths, "components": {}})
}

fn resource_list(group: &str) -> Value {
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut resources = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
        let mut r = json!({
            "name": kind.plural(), "singularName": kind.kind().to_lowercase(), "namespaced": kind.namespaced(),
            "kind": kind.kind(), "verbs": verbs, "shortNames": kind.short_names(),
            "storageVersionHash": ""
        });
        if kind == Kind::Pod {
            r["categories"] = json!(["all"]);
            resources.push(r);
            resources.push(json!({"name": "pods/status", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get", "patch", "update"]}));
            resources.push(json!({"name": "pods/binding", "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]}));
        } else {
            if kind == Kind::Namespace {
                r["verbs"] = json!([
                    "create", "delete", "get", "list", "patch", "update", "watch"
                ]);
            }
            resources.push(r);
        }
    }
    let group_version = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/v1")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// Creates an object from inside the server (initial namespaces), without injected faults.
pub(crate) fn create_internal(sh: &Shared, kind: Kind, obj: Value) -> Result<(), ApiError> {
    create(sh, kind, "", obj, false).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "default", "exec-1");
        assert_eq!(
            decode_continue(&t),
            Some((42, "default".into(), "exec-1".into()))
        );
        assert_eq!(decode_continue("zz"), None);
    }
}
