//! A network partition between one client and its server: a TCP relay the client is
//! pointed at, which the test can cut and heal. Cut, its connections are dropped and new
//! ones are accepted but never answered (a black hole, as a lost route looks: requests hang
//! until their own deadline), so a replica behind it loses the API server while it keeps
//! running and serving its own calls. It relays bytes, so TLS passes through it unchanged.
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A cuttable relay to one upstream address; it stops with its value.
pub struct Partition {
    address: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    /// Relays connections to `upstream` from a port of 127.0.0.1 of its own.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local address");
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(relay(client, upstream, cut_rx.clone()));
            }
        });
        Partition { address, cut, task }
    }

    /// Where the client connects instead of the upstream.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Cuts the link: open connections are dropped, new ones hang unanswered.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Heals the link: new connections are relayed again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// A relay in front of the API server of the kubeconfig at `from`, and a copy of that
    /// kubeconfig at `to` pointed at it (same scheme, certificate authority and user: the
    /// server's certificate names 127.0.0.1, which the relay listens on too).
    pub async fn in_front_of(from: &std::path::Path, to: &std::path::Path) -> Self {
        let text = std::fs::read_to_string(from).expect("kubeconfig");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig");
        let server = config["clusters"][0]["cluster"]["server"]
            .as_str()
            .expect("a server")
            .to_string();
        let (scheme, authority) = server.split_once("://").expect("a server URL");
        let authority = authority.trim_end_matches('/');
        let upstream = tokio::net::lookup_host(authority)
            .await
            .expect("the server's address")
            .next()
            .expect("an address");
        let partition = Self::start(upstream).await;
        config["clusters"][0]["cluster"]["server"] =
            serde_yaml::Value::String(format!("{scheme}://{}", partition.address));
        std::fs::write(to, serde_yaml::to_string(&config).expect("yaml")).expect("write");
        partition
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays `client` to `upstream` until either side closes or the link is cut; a
/// connection made while cut is held unanswered until the link heals, then dropped.
async fn relay(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        let _ = cut.wait_for(|cut| !*cut).await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}
