//! Who is calling, and may they: the caller's bearer token is checked with the Kubernetes
//! TokenReview API, and what it asks for with SubjectAccessReview, so the service never
//! does for a caller more than the caller could do itself. Both answers are cached briefly
//! in bounded caches; a review that does not answer in time fails the call (UNAVAILABLE),
//! never the actors or other callers, which do not wait on it.
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

/// Longest bearer token taken; service-account tokens are a few KiB at most.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// How callers are identified (`auth.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum AuthMode {
    /// Nobody is authenticated: for local use and the demo, on a loopback address only
    /// unless `auth.allow_unauthenticated_remote` says otherwise.
    #[default]
    None,
    /// `authorization: Bearer <service-account token>`, checked with TokenReview; every
    /// call is authorized with SubjectAccessReview and application ownership.
    Kubernetes,
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
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// Audiences a token must be meant for (TokenReview `spec.audiences`); empty = the API
    /// server's own audience.
    pub audiences: Vec<String>,
    /// Members of these groups may act on every application (still within what
    /// SubjectAccessReview allows them).
    pub admin_groups: Vec<String>,
    /// How long a TokenReview or SubjectAccessReview answer is reused.
    pub cache_ttl_ms: u64,
    /// Answers kept per cache (tokens; access decisions); the oldest go first.
    pub cache_capacity: usize,
    /// Deadline of one TokenReview or SubjectAccessReview, waiting for its turn included.
    pub review_timeout_ms: u64,
    /// Reviews in flight at once; more callers wait their turn (within the deadline), so a
    /// flood of forged tokens cannot crowd out the service's own work or the API server.
    pub max_concurrent_reviews: usize,
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
            allow_unauthenticated_remote: false,
        }
    }
}

impl AuthSettings {
    /// The rule a value may break, as (key, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.cache_capacity == 0 {
            return Err(("auth.cache_capacity".into(), "must be > 0".into()));
        }
        if self.max_concurrent_reviews == 0 {
            return Err(("auth.max_concurrent_reviews".into(), "must be > 0".into()));
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
    in_flight: tokio::sync::Semaphore,
    tokens: BoundedCache<String, Result<Caller, String>>,
    decisions: BoundedCache<DecisionKey, Decision>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DecisionKey {
    user: String,
    groups: Vec<String>,
    namespace: String,
    verb: &'static str,
}

#[derive(Debug, Clone)]
struct Decision {
    allowed: bool,
    reason: String,
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
        Self {
            reviews: Some(Arc::new(Reviews {
                client,
                audiences: settings.audiences.clone(),
                admin_groups: settings.admin_groups.clone(),
                timeout: Duration::from_millis(settings.review_timeout_ms),
                in_flight: tokio::sync::Semaphore::new(settings.max_concurrent_reviews.max(1)),
                tokens: BoundedCache::new(settings.cache_capacity, ttl),
                decisions: BoundedCache::new(settings.cache_capacity, ttl),
            })),
        }
    }

    /// Whether callers are authenticated at all.
    pub fn authenticates(&self) -> bool {
        self.reviews.is_some()
    }

    /// The caller of a request with `metadata`; UNAUTHENTICATED without a valid token.
    pub async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, AppError> {
        let Some(reviews) = &self.reviews else {
            return Ok(Caller::anonymous());
        };
        let token = bearer_token(metadata)?;
        if let Some(known) = reviews.tokens.get(token) {
            return known.map_err(AppError::Unauthenticated);
        }
        let answer = reviews.review_token(token).await?;
        reviews.tokens.insert(token.to_string(), answer.clone());
        answer.map_err(AppError::Unauthenticated)
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
        let Some(user) = &caller.user else {
            return Err(AppError::Unauthenticated(
                "the caller has no identity".into(),
            ));
        };
        for verb in access.verbs() {
            let key = DecisionKey {
                user: user.clone(),
                groups: caller.groups.clone(),
                namespace: namespace.to_string(),
                verb,
            };
            let decision = match reviews.decisions.get(&key) {
                Some(decision) => decision,
                None => {
                    let decision = reviews.review_access(caller, user, namespace, verb).await?;
                    reviews.decisions.insert(key, decision.clone());
                    decision
                }
            };
            if !decision.allowed {
                let why = if decision.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", decision.reason)
                };
                return Err(AppError::PermissionDenied(format!(
                    "{user} may not {verb} pods in namespace {namespace}{why}"
                )));
            }
        }
        Ok(())
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
    /// The caller a token stands for (`Err`: why it was not accepted); UNAVAILABLE when the
    /// API server does not answer.
    async fn review_token(&self, token: &str) -> Result<Result<Caller, String>, AppError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(self.timeout, async {
            let _turn = self.in_flight.acquire().await;
            api.create(&PostParams::default(), &review).await
        })
        .await
        .map_err(|_| {
            AppError::Unavailable(format!(
                "the TokenReview API did not answer within {} ms (auth.review_timeout_ms)",
                self.timeout.as_millis()
            ))
        })?
        .map_err(|err| {
            AppError::Unavailable(format!(
                "cannot review the caller's token: {}",
                crate::k8s::describe_error(&err)
            ))
        })?;
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

    /// Whether `caller` may `verb` pods in `namespace`.
    async fn review_access(
        &self,
        caller: &Caller,
        user: &str,
        namespace: &str,
        verb: &str,
    ) -> Result<Decision, AppError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_string()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some(verb.to_string()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some("pods".into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(self.timeout, async {
            let _turn = self.in_flight.acquire().await;
            api.create(&PostParams::default(), &review).await
        })
        .await
        .map_err(|_| {
            AppError::Unavailable(format!(
                "the SubjectAccessReview API did not answer within {} ms \
                     (auth.review_timeout_ms)",
                self.timeout.as_millis()
            ))
        })?
        .map_err(|err| {
            AppError::Unavailable(format!(
                "cannot review the caller's access: {}",
                crate::k8s::describe_error(&err)
            ))
        })?;
        let status = answer.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}

/// A map whose entries expire after `ttl` and which never holds more than `capacity`
/// (when full, expired entries go, then the oldest).
struct BoundedCache<K, V> {
    capacity: usize,
    ttl: Duration,
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> BoundedCache<K, V> {
    fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (Instant, V)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let mut entries = self.lock();
        match entries.get(key) {
            Some((at, value)) if at.elapsed() < self.ttl => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&self, key: K, value: V) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            let ttl = self.ttl;
            entries.retain(|_, (at, _)| at.elapsed() < ttl);
            if entries.len() >= self.capacity
                && let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(key, (Instant::now(), value));
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
        let cache = BoundedCache::new(3, Duration::from_secs(60));
        for i in 0..10 {
            cache.insert(i, i * 10);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&9), Some(90));
        assert_eq!(cache.get(&0), None);
    }

    #[test]
    fn cached_answers_expire() {
        let cache = BoundedCache::new(3, Duration::ZERO);
        cache.insert("a", 1);
        assert_eq!(cache.get("a"), None);
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
