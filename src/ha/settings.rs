//! The `ha` section of the configuration: who this replica is, where the shards' Leases
//! are kept, how many shards there are and how long a Lease lasts.
use std::time::Duration;

use serde::Deserialize;

use super::claim::LeaseTiming;
use super::shards::ShardMap;

/// The `ha` section. Every replica of one installation must have the same `shards` and
/// `lease_namespace`; each its own `identity`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HaSettings {
    /// The holder name this replica writes into the Leases. Unset: `POD_NAME` (the chart
    /// sets it from the downward API), else the host name. A restarted replica with the
    /// same identity takes its shards back at once.
    pub identity: Option<String>,
    /// Namespace of the shards' Leases. Unset: the registrations' namespace (the service's
    /// own, `POD_NAMESPACE`, else `default`).
    pub lease_namespace: Option<String>,
    /// How many shards the namespaces are spread over (1: plain leader election).
    pub shards: u32,
    /// `leaseDurationSeconds` of the Leases, in ms (a whole number of seconds).
    pub lease_duration_ms: u64,
    /// How long an owner acts without a successful renewal; shorter than the lease.
    pub renew_deadline_ms: u64,
    /// How often a replica renews or tries to acquire.
    pub retry_period_ms: u64,
    /// Where the other replicas reach this one's gRPC port (`host:port`), written into the
    /// Leases it holds so that a call arriving elsewhere is forwarded here. Unset:
    /// `POD_IP` (the chart sets it from the downward API) and the listen port, else the
    /// listen address when it is not a wildcard; with none, calls for this replica's
    /// applications that reach another replica are answered UNAVAILABLE naming it.
    pub advertise_address: Option<String>,
    /// PEM CA the peers' certificates are verified with when `tls` is on (forwards then go
    /// over TLS). Required with TLS and an advertise address.
    pub peer_ca_file: Option<std::path::PathBuf>,
    /// The name the peers' certificates are verified for (they are reached by pod IP, and
    /// a certificate names the Service). Unset: the host of the peer's address.
    pub peer_server_name: Option<String>,
    /// Whether shards move between replicas when replicas join or leave (a drain
    /// handshake through the Leases, `ha::rebalance`). Off: a replica keeps what it took
    /// until it stops.
    pub rebalance: bool,
}

impl Default for HaSettings {
    fn default() -> Self {
        let timing = LeaseTiming::default();
        Self {
            identity: None,
            lease_namespace: None,
            shards: 1,
            lease_duration_ms: millis(timing.lease),
            renew_deadline_ms: millis(timing.renew_deadline),
            retry_period_ms: millis(timing.retry),
            advertise_address: None,
            peer_ca_file: None,
            peer_server_name: None,
            rebalance: true,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl HaSettings {
    /// The three durations.
    pub fn timing(&self) -> LeaseTiming {
        LeaseTiming {
            lease: Duration::from_millis(self.lease_duration_ms),
            renew_deadline: Duration::from_millis(self.renew_deadline_ms),
            retry: Duration::from_millis(self.retry_period_ms),
        }
    }

    /// The identity in use: `identity`, else `pod_name`, else `host_name`, else a fixed
    /// name (one replica alone still owns every shard).
    pub fn resolve_identity(&mut self, pod_name: Option<String>, host_name: Option<String>) {
        let given = |value: Option<String>| {
            value
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        self.identity = given(self.identity.take())
            .or_else(|| given(pod_name))
            .or_else(|| given(host_name))
            .or_else(|| Some("spark-pod-allocator".to_string()));
    }

    /// The advertise address in use: `advertise_address`, else `pod_ip` with the port of
    /// `listen`, else `listen` unless it is a wildcard (`0.0.0.0`, `::`).
    pub fn resolve_advertise_address(
        &mut self,
        pod_ip: Option<String>,
        listen: std::net::SocketAddr,
    ) {
        let given = |value: Option<String>| {
            value
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        self.advertise_address = given(self.advertise_address.take())
            .or_else(|| {
                given(pod_ip).map(|ip| match ip.parse::<std::net::IpAddr>() {
                    Ok(ip) => std::net::SocketAddr::new(ip, listen.port()).to_string(),
                    Err(_) => format!("{ip}:{}", listen.port()),
                })
            })
            .or_else(|| (!listen.ip().is_unspecified()).then(|| listen.to_string()));
    }

    /// The identity written into the Leases.
    pub fn identity(&self) -> &str {
        self.identity.as_deref().unwrap_or("spark-pod-allocator")
    }

    /// The rule a value breaks, as (key under `ha.`, reason).
    pub fn check(&self) -> Result<(), (String, String)> {
        if let Some(namespace) = &self.lease_namespace {
            crate::naming::dns1123_label(namespace)
                .map_err(|reason| ("lease_namespace".to_string(), reason))?;
        }
        if let Some(identity) = &self.identity
            && (identity.is_empty() || identity.len() > 253)
        {
            return Err((
                "identity".into(),
                "must be 1 to 253 characters (a Lease's holderIdentity)".into(),
            ));
        }
        if let Some(address) = &self.advertise_address {
            check_host_port(address).map_err(|reason| ("advertise_address".to_string(), reason))?;
        }
        if let Some(name) = &self.peer_server_name
            && (name.is_empty() || name.len() > 253)
        {
            return Err((
                "peer_server_name".into(),
                "must be 1 to 253 characters (a DNS name)".into(),
            ));
        }
        ShardMap::new(self.shards).map_err(|(_, reason)| ("shards".to_string(), reason))?;
        if !self.lease_duration_ms.is_multiple_of(1000) {
            return Err((
                "lease_duration_ms".into(),
                "must be a whole number of seconds (the Lease's leaseDurationSeconds)".into(),
            ));
        }
        self.timing()
            .check()
            .map_err(|(key, reason)| (key.trim_start_matches("ha.").to_string(), reason))
    }
}

/// `host:port` (`[v6]:port` for IPv6), as the peers dial it.
fn check_host_port(address: &str) -> Result<(), String> {
    let form = "must be host:port (e.g. 10.0.0.7:50051)";
    let (host, port) = address.rsplit_once(':').ok_or_else(|| form.to_string())?;
    let host_ok = !host.is_empty()
        && !host.contains('/')
        && !host.contains(char::is_whitespace)
        && (host.parse::<std::net::Ipv4Addr>().is_ok()
            || host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
            || crate::naming::dns1123_subdomain(host).is_ok());
    match port.parse::<u16>() {
        Ok(port) if port > 0 && host_ok => Ok(()),
        _ => Err(form.to_string()),
    }
}

/// The host name, for [`HaSettings::resolve_identity`] (`HOSTNAME`, else the kernel's).
pub fn host_name() -> Option<String> {
    std::env::var("HOSTNAME").ok().or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|name| name.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_the_one_set_else_the_pod_name_else_the_host_name() {
        let mut set = HaSettings {
            identity: Some("r-1".into()),
            ..HaSettings::default()
        };
        set.resolve_identity(Some("pod".into()), Some("host".into()));
        assert_eq!(set.identity(), "r-1");
        let mut pod = HaSettings::default();
        pod.resolve_identity(Some("pod".into()), Some("host".into()));
        assert_eq!(pod.identity(), "pod");
        let mut host = HaSettings::default();
        host.resolve_identity(Some(" ".into()), Some("host".into()));
        assert_eq!(host.identity(), "host");
    }

    #[test]
    fn the_advertise_address_is_the_one_set_else_the_pod_ip_else_a_specific_listen_address() {
        let listen: std::net::SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let resolved = |set: Option<&str>, pod_ip: Option<&str>, listen| {
            let mut ha = HaSettings {
                advertise_address: set.map(str::to_string),
                ..HaSettings::default()
            };
            ha.resolve_advertise_address(pod_ip.map(str::to_string), listen);
            ha.advertise_address
        };
        assert_eq!(
            resolved(Some("spa-0.peers:50051"), Some("10.0.0.7"), listen).as_deref(),
            Some("spa-0.peers:50051")
        );
        assert_eq!(
            resolved(None, Some("10.0.0.7"), listen).as_deref(),
            Some("10.0.0.7:50051")
        );
        assert_eq!(
            resolved(None, Some("fd00::7"), listen).as_deref(),
            Some("[fd00::7]:50051")
        );
        assert_eq!(
            resolved(None, Some(" "), listen),
            None,
            "a wildcard is no address"
        );
        assert_eq!(
            resolved(None, None, "127.0.0.1:4000".parse().unwrap()).as_deref(),
            Some("127.0.0.1:4000")
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(HaSettings::default().check(), Ok(()));
        let key = |s: HaSettings| s.check().unwrap_err().0;
        let base = HaSettings::default();
        assert_eq!(
            key(HaSettings {
                shards: 0,
                ..base.clone()
            }),
            "shards"
        );
        assert_eq!(
            key(HaSettings {
                lease_duration_ms: 1500,
                ..base.clone()
            }),
            "lease_duration_ms"
        );
        assert_eq!(
            key(HaSettings {
                renew_deadline_ms: 15_000,
                ..base.clone()
            }),
            "renew_deadline_ms"
        );
        assert_eq!(
            key(HaSettings {
                lease_namespace: Some("Bad_NS".into()),
                ..base.clone()
            }),
            "lease_namespace"
        );
        for address in [
            "10.0.0.7",
            "10.0.0.7:0",
            "http://10.0.0.7:50051",
            "a b:1",
            ":50051",
        ] {
            assert_eq!(
                key(HaSettings {
                    advertise_address: Some(address.into()),
                    ..base.clone()
                }),
                "advertise_address",
                "{address}"
            );
        }
        for address in [
            "10.0.0.7:50051",
            "[fd00::7]:50051",
            "spa-0.spa.ns.svc:50051",
        ] {
            let ok = HaSettings {
                advertise_address: Some(address.into()),
                ..base.clone()
            };
            assert_eq!(ok.check(), Ok(()), "{address}");
        }
    }
}
