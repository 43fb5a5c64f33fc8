//! TLS on the gRPC port (rustls): the certificate and key are read from PEM files and read
//! again when either file changes, so a rotated certificate (a cert-manager Secret update)
//! is served without a restart. Handshakes run in tasks of their own, each with a deadline,
//! so a client that stalls half-way through one delays nobody else.
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use serde::Deserialize;
use tonic::transport::server::Connected;

use super::connections::GuardedConnection;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;

/// The `tls` section of the configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain of the gRPC port; with `key_file`, turns TLS on.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// How often the files are checked for a change.
    pub reload_interval_ms: u64,
    /// Deadline of one TLS handshake.
    pub handshake_timeout_ms: u64,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            reload_interval_ms: 10_000,
            handshake_timeout_ms: 10_000,
        }
    }
}

impl TlsSettings {
    /// Whether TLS is configured (both files given).
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }

    /// The rule a value may break, as (key, reason); the files are read once to check them.
    pub fn validate(&self) -> Result<(), (String, String)> {
        match (&self.cert_file, &self.key_file) {
            (None, None) => Ok(()),
            (Some(_), None) => Err(("tls.key_file".into(), "required with tls.cert_file".into())),
            (None, Some(_)) => Err(("tls.cert_file".into(), "required with tls.key_file".into())),
            (Some(cert), Some(key)) => {
                if self.reload_interval_ms < 100 {
                    return Err(("tls.reload_interval_ms".into(), "must be ≥ 100".into()));
                }
                if self.handshake_timeout_ms < 100 {
                    return Err(("tls.handshake_timeout_ms".into(), "must be ≥ 100".into()));
                }
                load(cert, key)
                    .map(|_| ())
                    .map_err(|(key, reason)| (key.into(), reason))
            }
        }
    }
}

/// The certificate served now, replaced when its files change.
#[derive(Debug)]
struct CurrentCertificate(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.0.read().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

/// Reads the certificate chain and key; the error names the key of the file at fault.
fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, (&'static str, String)> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| ("tls.cert_file", format!("{}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err((
            "tls.cert_file",
            format!("{}: no certificate", cert.display()),
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ("tls.key_file", format!("{}: {e}", key.display())))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| ("tls.key_file", format!("{}: {e}", key.display())))?;
    Ok(CertifiedKey::new(chain, signing))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// A TLS acceptor whose certificate follows its files.
pub struct ReloadingTls {
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    reloader: tokio::task::JoinHandle<()>,
}

impl Drop for ReloadingTls {
    fn drop(&mut self) {
        self.reloader.abort();
    }
}

impl ReloadingTls {
    /// Reads the files now (an error names the key) and checks them again every
    /// `reload_interval_ms`; a change that does not load is logged and the old one kept.
    pub fn start(settings: &TlsSettings) -> Result<Self, String> {
        let (Some(cert), Some(key)) = (settings.cert_file.clone(), settings.key_file.clone())
        else {
            return Err("tls.cert_file and tls.key_file are both required".into());
        };
        let first = load(&cert, &key).map_err(|(key, reason)| format!("{key}: {reason}"))?;
        let current = Arc::new(CurrentCertificate(RwLock::new(Arc::new(first))));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&current) as Arc<dyn ResolvesServerCert>);
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        let interval = Duration::from_millis(settings.reload_interval_ms);
        let reloader = tokio::spawn(async move {
            let mut seen = (modified(&cert), modified(&key));
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = (modified(&cert), modified(&key));
                if now == seen {
                    continue;
                }
                match load(&cert, &key) {
                    Ok(fresh) => {
                        *current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
                        seen = now;
                        tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
                    }
                    // Half-written files (cert written, key not yet): try again next tick.
                    Err((key, reason)) => {
                        tracing::warn!(key, %reason, "TLS files changed but do not load; serving the previous certificate")
                    }
                }
            }
        });
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshake_timeout: Duration::from_millis(settings.handshake_timeout_ms),
            reloader,
        })
    }

    /// The TLS connections over `connections` (the listener's, already bounded in number
    /// and handshake time), each handshake in a task of its own.
    pub fn incoming(
        self,
        connections: impl futures::Stream<Item = std::io::Result<GuardedConnection>> + Send + 'static,
    ) -> impl futures::Stream<Item = Result<TlsStream<GuardedConnection>, std::io::Error>> + Send + 'static
    {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<TlsStream<GuardedConnection>, std::io::Error>>(64);
        tokio::spawn(async move {
            // Owns the acceptor (and its reloader) as long as connections are accepted.
            let tls = self;
            let mut connections = Box::pin(connections);
            loop {
                let stream = tokio::select! {
                    accepted = connections.next() => match accepted {
                        Some(Ok(stream)) => stream,
                        Some(Err(err)) => {
                            tracing::warn!(error = %err, "cannot accept a connection");
                            continue;
                        }
                        None => return,
                    },
                    () = tx.closed() => return,
                };
                let peer = stream.connect_info().remote_addr();
                let acceptor = tls.acceptor.clone();
                let timeout = tls.handshake_timeout;
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send(Ok(tls)).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(?peer, error = %err, "TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(?peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}
