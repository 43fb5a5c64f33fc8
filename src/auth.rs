//! Who is calling, and may they: the caller's bearer token is checked with the Kubernetes
//! TokenReview API, and what it asks for with SubjectAccessReview, so the service never
//! does for a caller more than the caller could do itself. Both answers are cached briefly
//! in bounded caches; a review that does not answer in time fails the call (UNAVAILABLE),
//! never the actors or other callers, which do not wait on it.
//!
//! Known callers go first: tokens once accepted are cached apart from refused ones (a flood
//! of forged tokens evicts no identity), their answers are renewed in the background before
//! they expire (a call whose identity and access are cached never waits on the API server),
//! and their reviews have a queue of their own, so TokenReviews of unknown tokens never
//! starve them. A connection that fails authentication too often is refused at once.
use std::collections::HashMap;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde::Deserialize;

use crate::app::{AppError, AppId};

const PODS: &str = "pods";
const CLAIMS: &str = "persistentvolumeclaims";

/// Longest bearer token taken; service-account tokens are a few KiB at most.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// How long a token once accepted keeps its place in the queue of known callers after its
/// answer expired (it is still reviewed again before use): a projected service-account
/// token lives an hour by default.
const KNOWN_TOKEN_MEMORY: Duration = Duration::from_secs(3600);

/// How long a connection's failed authentications are remembered after the last one.
const FAILED_AUTHENTICATION_MEMORY: Duration = Duration::from_secs(60);

/// How callers are identified (`auth.mode`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum AuthMode {
    /// Nobody is authenticated: for local use and the demo, on a loopback address only
    /// unless `auth.allow_unauthenticated_remote` says otherwise.
    #[default]
    None,
    /// `authorization: Bearer <service-account token>`, checked with TokenReview; every
    /// call is authorized with SubjectAccessReview and application ownership.
    Kubernetes,
}

impl AuthMode {
    /// As the configuration spells it (`auth.mode`).
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::None => "none",
            AuthMode::Kubernetes => "kubernetes",
        }
    }
}

impl TryFrom<String> for AuthMode {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(AuthMode::None),
            "kubernetes" => Ok(AuthMode::Kubernetes),
            _ => Err(format!("expected `none` or `kubernetes`, got {value:?}")),
        }
    }
}

/// The `auth` section of the configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// Audiences a token must be meant for (TokenReview `spec.audiences`); empty = the API
    /// server's own audience.
    pub audiences: Vec<String>,
    /// Members of these groups may act on every application (still within what
    /// SubjectAccessReview allows them).
    pub admin_groups: Vec<String>,
    /// How long a TokenReview or SubjectAccessReview answer is reused; an answer in use is
    /// renewed in the background once half of it has passed.
    pub cache_ttl_ms: u64,
    /// Answers kept per cache (accepted tokens; refused tokens; access decisions; connections
    /// that failed authentication); the oldest go first.
    pub cache_capacity: usize,
    /// Deadline of one TokenReview or SubjectAccessReview, waiting for its turn included.
    pub review_timeout_ms: u64,
    /// TokenReviews of unknown tokens (never accepted: first calls, forged tokens) in flight
    /// at once; more callers wait their turn (within the deadline), so a flood of forged
    /// tokens cannot crowd out the service's own work or the API server.
    pub max_concurrent_reviews: usize,
    /// Reviews for callers already accepted (SubjectAccessReviews, renewals, a known token
    /// reviewed again) in flight at once: a queue of their own, which unknown tokens never
    /// enter.
    pub max_concurrent_known_reviews: usize,
    /// Failed authentications one connection may make; after them (for a minute after the
    /// last one) its calls are refused at once, without a review.
    pub max_failed_authentications_per_connection: u32,
    /// With `mode = none`, allow listening on a non-loopback address (anyone who reaches
    /// the port may then start and stop applications with the service's rights).
    pub allow_unauthenticated_remote: bool,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            mode: AuthMode::None,
            audiences: Vec::new(),
            admin_groups: Vec::new(),
            cache_ttl_ms: 10_000,
            cache_capacity: 4096,
            review_timeout_ms: 5_000,
            max_concurrent_reviews: 16,
            max_concurrent_known_reviews: 16,
            max_failed_authentications_per_connection: 10,
            allow_unauthenticated_remote: false,
        }
    }
}

impl AuthSettings {
    /// The rule a value may break, as (key, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let positive = [
            ("auth.cache_capacity", self.cache_capacity as u64),
            (
                "auth.max_concurrent_reviews",
                self.max_concurrent_reviews as u64,
            ),
            (
                "auth.max_concurrent_known_reviews",
                self.max_concurrent_known_reviews as u64,
            ),
            (
                "auth.max_failed_authentications_per_connection",
                u64::from(self.max_failed_authentications_per_connection),
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err((key.into(), "must be > 0".into()));
            }
        }
        if self.review_timeout_ms < 100 {
            return Err(("auth.review_timeout_ms".into(), "must be ≥ 100".into()));
        }
        Ok(())
    }

    /// Refuses to serve unauthenticated on an address others can reach, unless asked to.
    pub fn check_listen(&self, address: SocketAddr) -> Result<(), String> {
        if self.mode == AuthMode::None
            && !address.ip().is_loopback()
            && !self.allow_unauthenticated_remote
        {
            return Err(format!(
                "refusing to serve on {address} with auth.mode = none: anyone reaching it could \
                 create and delete pods with the service's rights. Set auth.mode = kubernetes, \
                 listen on a loopback address, or set auth.allow_unauthenticated_remote = true"
            ));
        }
        Ok(())
    }
}

/// The caller of one RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user name TokenReview gave (`system:serviceaccount:NS:NAME`); `None` when the
    /// service authenticates nobody.
    pub user: Option<String>,
    pub uid: Option<String>,
    pub groups: Vec<String>,
}

impl Caller {
    /// The caller of a service that authenticates nobody.
    pub fn anonymous() -> Self {
        Self {
            user: None,
            uid: None,
            groups: Vec::new(),
        }
    }
}

/// What a call does to the pods of its namespace, and so which verbs it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Creates or deletes executor pods (Start, SetTotalExpected, UpdateRegisteredExecutors,
    /// Stop): `create pods` and `delete pods`.
    Change,
    /// Reveals executor pods (GetStatus, WatchExecutors, IsDeleted): `list pods`.
    Read,
}

impl Access {
    /// The pod verbs SubjectAccessReview is asked about, in order.
    pub fn verbs(self) -> &'static [&'static str] {
        match self {
            Access::Change => &["create", "delete"],
            Access::Read => &["list"],
        }
    }
}

/// Authentication and authorization of every call.
#[derive(Clone)]
pub struct Gate {
    reviews: Option<Arc<Reviews>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("kubernetes", &self.reviews.is_some())
            .finish()
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::open()
    }
}

struct Reviews {
    client: kube::Client,
    audiences: Vec<String>,
    admin_groups: Vec<String>,
    timeout: Duration,
    /// Turns of TokenReviews of unknown tokens (`auth.max_concurrent_reviews`).
    unknown_turns: tokio::sync::Semaphore,
    /// Turns of reviews for accepted callers (`auth.max_concurrent_known_reviews`).
    known_turns: tokio::sync::Semaphore,
    /// Tokens TokenReview accepted, and who they stand for.
    identities: BoundedCache<String, Caller>,
    /// Tokens TokenReview refused, and why: apart from `identities`, so that a flood of
    /// forged tokens evicts no accepted one.
    refusals: BoundedCache<String, String>,
    decisions: BoundedCache<DecisionKey, Decision>,
    /// Failed authentications by connection (its peer address).
    failures: BoundedCache<SocketAddr, u32>,
    max_failures: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DecisionKey {
    user: String,
    groups: Vec<String>,
    namespace: String,
    verb: &'static str,
    /// `pods` or `persistentvolumeclaims`.
    resource: &'static str,
    /// One pod (`resourceAttributes.name`), or every pod of the namespace.
    pod: Option<String>,
}

#[derive(Debug, Clone)]
struct Decision {
    allowed: bool,
    reason: String,
}

/// Which queue a review waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Unknown,
    Known,
}

impl Gate {
    /// Everybody may do everything (`auth.mode = none`).
    pub fn open() -> Self {
        Self { reviews: None }
    }

    /// The gate of `settings`: open for `none`, reviews through `client` for `kubernetes`.
    pub fn from_settings(settings: &AuthSettings, client: kube::Client) -> Self {
        match settings.mode {
            AuthMode::None => Self::open(),
            AuthMode::Kubernetes => Self::kubernetes(settings, client),
        }
    }

    /// Reviews every caller through `client`.
    pub fn kubernetes(settings: &AuthSettings, client: kube::Client) -> Self {
        let ttl = Duration::from_millis(settings.cache_ttl_ms);
        let capacity = settings.cache_capacity;
        Self {
            reviews: Some(Arc::new(Reviews {
                client,
                audiences: settings.audiences.clone(),
                admin_groups: settings.admin_groups.clone(),
                timeout: Duration::from_millis(settings.review_timeout_ms),
                unknown_turns: tokio::sync::Semaphore::new(settings.max_concurrent_reviews.max(1)),
                known_turns: tokio::sync::Semaphore::new(
                    settings.max_concurrent_known_reviews.max(1),
                ),
                identities: BoundedCache::new(capacity, ttl, KNOWN_TOKEN_MEMORY.max(ttl)),
                refusals: BoundedCache::new(capacity, ttl, ttl),
                decisions: BoundedCache::new(capacity, ttl, ttl),
                failures: BoundedCache::new(
                    capacity,
                    FAILED_AUTHENTICATION_MEMORY,
                    FAILED_AUTHENTICATION_MEMORY,
                ),
                max_failures: settings.max_failed_authentications_per_connection.max(1),
            })),
        }
    }

    /// Whether callers are authenticated at all.
    pub fn authenticates(&self) -> bool {
        self.reviews.is_some()
    }

    /// The caller of a request with `metadata`, which came on the connection from `peer`;
    /// UNAUTHENTICATED without a valid token, or at once when that connection has failed
    /// authentication `auth.max_failed_authentications_per_connection` times.
    pub async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        peer: Option<SocketAddr>,
    ) -> Result<Caller, AppError> {
        let Some(reviews) = &self.reviews else {
            return Ok(Caller::anonymous());
        };
        reviews.check_budget(peer)?;
        match Arc::clone(reviews).caller(metadata).await {
            // The one place a call is known to be authenticated.
            Ok(caller) => Ok(caller),
            Err(err @ AppError::Unauthenticated(_)) => {
                reviews.failed(peer);
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// Whether `caller` may act on every application.
    pub fn is_admin(&self, caller: &Caller) -> bool {
        match &self.reviews {
            None => true,
            Some(reviews) => caller
                .groups
                .iter()
                .any(|group| reviews.admin_groups.contains(group)),
        }
    }

    /// PERMISSION_DENIED, naming the verb and namespace, unless SubjectAccessReview says
    /// `caller` may do every verb of `access` on pods in `namespace`.
    pub async fn authorize(
        &self,
        caller: &Caller,
        namespace: &str,
        access: Access,
    ) -> Result<(), AppError> {
        let Some(reviews) = &self.reviews else {
            return Ok(());
        };
        for &verb in access.verbs() {
            let decision = Arc::clone(reviews)
                .decision(caller, namespace, PODS, verb, None)
                .await?;
            if !decision.allowed {
                return Err(AppError::PermissionDenied(format!(
                    "{} may not {verb} pods in namespace {namespace}{}",
                    caller.user.as_deref().unwrap_or_default(),
                    decision.why()
                )));
            }
        }
        Ok(())
    }

    /// The driver pod a Start names is read (its phase reported, its end followed, its uid
    /// made the executors' owner) and patched (the id record) on the caller's behalf, so
    /// the caller must be allowed to `get` and `patch` that pod. A pod it may not `get`
    /// answers exactly as a missing one ([`AppError::no_driver_pod`]), so that the answer
    /// reveals no pod name the caller could not read itself; one it may see but not patch
    /// is PERMISSION_DENIED.
    pub async fn authorize_driver_pod(
        &self,
        caller: &Caller,
        namespace: &str,
        pod: &str,
    ) -> Result<(), AppError> {
        let Some(reviews) = &self.reviews else {
            return Ok(());
        };
        for verb in ["get", "patch"] {
            let decision = Arc::clone(reviews)
                .decision(caller, namespace, PODS, verb, Some(pod))
                .await?;
            match (decision.allowed, verb) {
                (true, _) => {}
                (false, "get") => return Err(AppError::no_driver_pod(pod, namespace)),
                (false, _) => {
                    return Err(AppError::PermissionDenied(format!(
                        "{} may not {verb} pod {pod} in namespace {namespace}{} \
                         (driver_pod_name: the service records executor ids on it)",
                        caller.user.as_deref().unwrap_or_default(),
                        decision.why()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Executor claim templates and generic ephemeral volumes have claims created for the
    /// caller's executors (by the service, or by the cluster for the pod), so the caller
    /// must be allowed to `create persistentvolumeclaims` in `namespace` itself;
    /// PERMISSION_DENIED naming the verb, resource and namespace otherwise.
    pub async fn authorize_claims(
        &self,
        caller: &Caller,
        namespace: &str,
        why: &str,
    ) -> Result<(), AppError> {
        let Some(reviews) = &self.reviews else {
            return Ok(());
        };
        let decision = Arc::clone(reviews)
            .decision(caller, namespace, CLAIMS, "create", None)
            .await?;
        if decision.allowed {
            return Ok(());
        }
        Err(AppError::PermissionDenied(format!(
            "{} may not create persistentvolumeclaims in namespace {namespace}{} ({why})",
            caller.user.as_deref().unwrap_or_default(),
            decision.why()
        )))
    }

    /// PERMISSION_DENIED unless `caller` started the application (or is an admin).
    pub fn check_owner(
        &self,
        caller: &Caller,
        app: &AppId,
        owner: Option<&str>,
    ) -> Result<(), AppError> {
        if self.is_admin(caller) || (owner.is_some() && owner == caller.user.as_deref()) {
            return Ok(());
        }
        Err(AppError::PermissionDenied(format!(
            "application {app} was started by another identity; only that identity \
             (or a member of auth.admin_groups) may call it"
        )))
    }
}

impl Decision {
    /// The review's reason, as ` (reason)`, or nothing.
    fn why(&self) -> String {
        if self.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.reason)
        }
    }
}

/// The token of `authorization: Bearer <token>`.
fn bearer_token(metadata: &tonic::metadata::MetadataMap) -> Result<&str, AppError> {
    let missing = || {
        AppError::Unauthenticated(
            "missing `authorization: Bearer <token>` metadata: this service (auth.mode = \
             kubernetes) needs the caller's Kubernetes service-account token"
                .into(),
        )
    };
    let value = metadata.get("authorization").ok_or_else(missing)?;
    let value = value.to_str().map_err(|_| {
        AppError::Unauthenticated("the authorization metadata is not visible ASCII".into())
    })?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            AppError::Unauthenticated("the authorization metadata must be `Bearer <token>`".into())
        })?;
    if token.is_empty() {
        return Err(missing());
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AppError::Unauthenticated(format!(
            "the bearer token is longer than {MAX_TOKEN_BYTES} bytes"
        )));
    }
    Ok(token)
}

impl Reviews {
    /// UNAUTHENTICATED, without a review, when the connection from `peer` has used up its
    /// failed authentications.
    fn check_budget(&self, peer: Option<SocketAddr>) -> Result<(), AppError> {
        let Some(peer) = peer else {
            return Ok(());
        };
        match self.failures.get(&peer) {
            Some(Lookup::Fresh(failures) | Lookup::Renew(failures))
                if failures >= self.max_failures =>
            {
                Err(AppError::Unauthenticated(format!(
                    "this connection failed authentication {failures} times \
                     (auth.max_failed_authentications_per_connection = {}); its calls are \
                     refused for a minute: open a new connection with a valid token",
                    self.max_failures
                )))
            }
            _ => Ok(()),
        }
    }

    /// Counts one failed authentication on the connection from `peer`.
    fn failed(&self, peer: Option<SocketAddr>) {
        let Some(peer) = peer else {
            return;
        };
        let before = match self.failures.get(&peer) {
            Some(Lookup::Fresh(n) | Lookup::Renew(n)) => n,
            _ => 0,
        };
        self.failures.insert(peer, before.saturating_add(1));
    }

    /// The caller a token stands for: a cached identity at once (renewed in the background
    /// once half its time has passed), a known token reviewed again in the known queue, an
    /// unknown one in the unknown queue; a cached refusal at once.
    async fn caller(
        self: Arc<Self>,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, AppError> {
        let token = bearer_token(metadata)?;
        let queue = match self.identities.get(token) {
            Some(Lookup::Fresh(caller)) => return Ok(caller),
            Some(Lookup::Renew(caller)) => {
                let reviews = Arc::clone(&self);
                let token = token.to_string();
                tokio::spawn(async move { reviews.renew_token(token).await });
                return Ok(caller);
            }
            Some(Lookup::Expired) => Queue::Known,
            None => {
                if let Some(Lookup::Fresh(why) | Lookup::Renew(why)) = self.refusals.get(token) {
                    return Err(AppError::Unauthenticated(why));
                }
                Queue::Unknown
            }
        };
        let answer = self.review_token(token, queue).await?;
        self.remember_token(token, &answer);
        answer.map_err(AppError::Unauthenticated)
    }

    /// Reviews a cached identity again, before its answer expires.
    async fn renew_token(&self, token: String) {
        match self.review_token(&token, Queue::Known).await {
            Ok(answer) => self.remember_token(&token, &answer),
            Err(err) => {
                self.identities.renewal_failed(&token);
                tracing::debug!(error = %err, "renewing a cached identity failed; retried at its next call");
            }
        }
    }

    fn remember_token(&self, token: &str, answer: &Result<Caller, String>) {
        match answer {
            Ok(caller) => {
                self.refusals.remove(token);
                self.identities.insert(token.to_string(), caller.clone());
            }
            Err(why) => {
                self.identities.remove(token);
                self.refusals.insert(token.to_string(), why.clone());
            }
        }
    }

    /// SubjectAccessReview's answer for `caller` doing `verb` on `resource` (or pod `pod`)
    /// in `namespace`: cached at once (renewed in the background once half its time has
    /// passed), else reviewed in the known queue.
    async fn decision(
        self: Arc<Self>,
        caller: &Caller,
        namespace: &str,
        resource: &'static str,
        verb: &'static str,
        pod: Option<&str>,
    ) -> Result<Decision, AppError> {
        let Some(user) = &caller.user else {
            return Err(AppError::Unauthenticated(
                "the caller has no identity".into(),
            ));
        };
        let key = DecisionKey {
            user: user.clone(),
            groups: caller.groups.clone(),
            namespace: namespace.to_string(),
            verb,
            resource,
            pod: pod.map(str::to_string),
        };
        match self.decisions.get(&key) {
            Some(Lookup::Fresh(decision)) => Ok(decision),
            Some(Lookup::Renew(decision)) => {
                let reviews = Arc::clone(&self);
                let caller = caller.clone();
                tokio::spawn(async move {
                    match reviews.review_access(&caller, &key).await {
                        Ok(decision) => reviews.decisions.insert(key, decision),
                        Err(err) => {
                            reviews.decisions.renewal_failed(&key);
                            tracing::debug!(error = %err, "renewing a cached access decision failed; retried at its next call");
                        }
                    }
                });
                Ok(decision)
            }
            Some(Lookup::Expired) | None => {
                let decision = self.review_access(caller, &key).await?;
                self.decisions.insert(key, decision.clone());
                Ok(decision)
            }
        }
    }

    /// Runs `review` after waiting for a turn in `queue`, both within the review deadline.
    async fn in_turn<T>(
        &self,
        queue: Queue,
        api: &str,
        review: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, AppError> {
        let turns = match queue {
            Queue::Unknown => &self.unknown_turns,
            Queue::Known => &self.known_turns,
        };
        tokio::time::timeout(self.timeout, async {
            let _turn = turns.acquire().await;
            review.await
        })
        .await
        .map_err(|_| {
            AppError::Unavailable(format!(
                "the {api} API did not answer within {} ms (auth.review_timeout_ms)",
                self.timeout.as_millis()
            ))
        })?
        .map_err(|err| {
            AppError::Unavailable(format!(
                "cannot ask the {api} API: {}",
                crate::k8s::describe_error(&err)
            ))
        })
    }

    /// The caller a token stands for (`Err`: why it was not accepted); UNAVAILABLE when the
    /// API server does not answer.
    async fn review_token(
        &self,
        token: &str,
        queue: Queue,
    ) -> Result<Result<Caller, String>, AppError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = self
            .in_turn(
                queue,
                "TokenReview",
                api.create(&PostParams::default(), &review),
            )
            .await?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        let username = user.username.filter(|name| !name.is_empty());
        match (status.authenticated, username) {
            (Some(true), Some(username)) => Ok(Ok(Caller {
                user: Some(username),
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
            })),
            _ => {
                let why = status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "not authenticated".into());
                Ok(Err(format!(
                    "the bearer token was not accepted by the Kubernetes TokenReview API: {why}"
                )))
            }
        }
    }

    /// Whether `caller` may do what `key` says.
    async fn review_access(
        &self,
        caller: &Caller,
        key: &DecisionKey,
    ) -> Result<Decision, AppError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(key.user.clone()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(key.namespace.clone()),
                    verb: Some(key.verb.to_string()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some(key.resource.into()),
                    name: key.pod.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = self
            .in_turn(
                Queue::Known,
                "SubjectAccessReview",
                api.create(&PostParams::default(), &review),
            )
            .await?;
        let status = answer.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}

/// What a cache holds for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lookup<V> {
    /// An answer younger than the ttl.
    Fresh(V),
    /// An answer past half the ttl: the caller that gets this renews it (it is handed out
    /// once per answer, until [`BoundedCache::renewal_failed`]).
    Renew(V),
    /// An answer past the ttl, kept (up to `keep`) only to say that the key was known.
    Expired,
}

/// A map whose entries expire after `ttl`, are remembered as expired up to `keep`, and
/// which never holds more than `capacity` (when full, forgotten entries go, then the
/// oldest).
struct BoundedCache<K, V> {
    capacity: usize,
    ttl: Duration,
    keep: Duration,
    entries: Mutex<HashMap<K, Entry<V>>>,
}

struct Entry<V> {
    at: Instant,
    value: V,
    renewing: bool,
}

impl<K: Eq + Hash + Clone, V: Clone> BoundedCache<K, V> {
    fn new(capacity: usize, ttl: Duration, keep: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            ttl,
            keep: keep.max(ttl),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Entry<V>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get<Q>(&self, key: &Q) -> Option<Lookup<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let mut entries = self.lock();
        let entry = entries.get_mut(key)?;
        let age = entry.at.elapsed();
        if age >= self.keep {
            entries.remove(key);
            None
        } else if age >= self.ttl {
            Some(Lookup::Expired)
        } else if age >= self.ttl / 2 && !entry.renewing {
            entry.renewing = true;
            Some(Lookup::Renew(entry.value.clone()))
        } else {
            Some(Lookup::Fresh(entry.value.clone()))
        }
    }

    /// Lets the next [`Self::get`] renew the entry again.
    fn renewal_failed<Q>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        if let Some(entry) = self.lock().get_mut(key) {
            entry.renewing = false;
        }
    }

    fn remove<Q>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.lock().remove(key);
    }

    fn insert(&self, key: K, value: V) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            let keep = self.keep;
            entries.retain(|_, entry| entry.at.elapsed() < keep);
            if entries.len() >= self.capacity
                && let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, entry)| entry.at)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(
            key,
            Entry {
                at: Instant::now(),
                value,
                renewing: false,
            },
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_never_grows_past_its_capacity_and_forgets_the_oldest() {
        let minute = Duration::from_secs(60);
        let cache = BoundedCache::new(3, minute, minute);
        for i in 0..10 {
            cache.insert(i, i * 10);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&9), Some(Lookup::Fresh(90)));
        assert_eq!(cache.get(&0), None);
    }

    #[test]
    fn cached_answers_are_renewed_once_past_half_their_ttl_then_expire() {
        let cache = BoundedCache::new(8, Duration::from_secs(60), Duration::from_secs(120));
        let aged = |key: &'static str, secs: u64| {
            cache.insert(key, 1);
            let mut entries = cache.lock();
            let entry = entries.get_mut(key).expect("inserted");
            entry.at = Instant::now()
                .checked_sub(Duration::from_secs(secs))
                .expect("an instant two minutes back");
        };
        aged("young", 10);
        assert_eq!(cache.get("young"), Some(Lookup::Fresh(1)));
        aged("half", 40);
        assert_eq!(cache.get("half"), Some(Lookup::Renew(1)));
        // One renewal at a time: the others use the answer meanwhile.
        assert_eq!(cache.get("half"), Some(Lookup::Fresh(1)));
        cache.renewal_failed("half");
        assert_eq!(cache.get("half"), Some(Lookup::Renew(1)));
        cache.insert("half", 2);
        assert_eq!(cache.get("half"), Some(Lookup::Fresh(2)));
        aged("old", 70);
        assert_eq!(cache.get("old"), Some(Lookup::Expired));
        aged("forgotten", 130);
        assert_eq!(cache.get("forgotten"), None);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn cached_answers_expire() {
        let cache = BoundedCache::new(3, Duration::ZERO, Duration::ZERO);
        cache.insert("a", 1);
        assert_eq!(cache.get("a"), None);
        let remembered = BoundedCache::new(3, Duration::ZERO, Duration::from_secs(60));
        remembered.insert("a", 1);
        assert_eq!(remembered.get("a"), Some(Lookup::Expired));
    }

    #[test]
    fn every_count_and_queue_must_be_positive_naming_its_key() {
        for (settings, key) in [
            (
                AuthSettings {
                    max_concurrent_known_reviews: 0,
                    ..AuthSettings::default()
                },
                "auth.max_concurrent_known_reviews",
            ),
            (
                AuthSettings {
                    max_failed_authentications_per_connection: 0,
                    ..AuthSettings::default()
                },
                "auth.max_failed_authentications_per_connection",
            ),
            (
                AuthSettings {
                    max_concurrent_reviews: 0,
                    ..AuthSettings::default()
                },
                "auth.max_concurrent_reviews",
            ),
        ] {
            assert_eq!(settings.validate().unwrap_err().0, key);
        }
        assert!(AuthSettings::default().validate().is_ok());
    }

    #[test]
    fn none_mode_refuses_a_non_loopback_address_naming_the_keys() {
        let settings = AuthSettings::default();
        assert!(
            settings
                .check_listen("127.0.0.1:50051".parse().unwrap())
                .is_ok()
        );
        assert!(
            settings
                .check_listen("[::1]:50051".parse().unwrap())
                .is_ok()
        );
        let err = settings
            .check_listen("0.0.0.0:50051".parse().unwrap())
            .unwrap_err();
        assert!(err.contains("auth.mode") && err.contains("auth.allow_unauthenticated_remote"));
        let allowed = AuthSettings {
            allow_unauthenticated_remote: true,
            ..AuthSettings::default()
        };
        assert!(
            allowed
                .check_listen("0.0.0.0:50051".parse().unwrap())
                .is_ok()
        );
        let kubernetes = AuthSettings {
            mode: AuthMode::Kubernetes,
            ..AuthSettings::default()
        };
        assert!(
            kubernetes
                .check_listen("0.0.0.0:50051".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn bearer_tokens_are_required_well_formed_and_bounded() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert!(
            matches!(bearer_token(&metadata), Err(AppError::Unauthenticated(m)) if m.contains("missing"))
        );
        metadata.insert("authorization", "Basic abc".parse().unwrap());
        assert!(
            matches!(bearer_token(&metadata), Err(AppError::Unauthenticated(m)) if m.contains("Bearer"))
        );
        metadata.insert("authorization", "Bearer tok-1".parse().unwrap());
        assert_eq!(bearer_token(&metadata).unwrap(), "tok-1");
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        metadata.insert("authorization", long.parse().unwrap());
        assert!(
            matches!(bearer_token(&metadata), Err(AppError::Unauthenticated(m)) if m.contains("longer"))
        );
    }
}
