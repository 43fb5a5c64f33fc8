//! Test certificates, made by the `openssl` command.

/// A certificate authority and a certificate it signed for `localhost` and 127.0.0.1 (by
/// the `openssl` command), as (CA, certificate, key) files `dir/NAME-*.pem`.
pub fn certificate(
    dir: &std::path::Path,
    name: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let file = |suffix: &str| dir.join(format!("{name}-{suffix}"));
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("the openssl command runs (it makes the test certificates)");
        assert!(status.success(), "openssl {args:?} failed");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca_subject = format!("/CN={name}-ca");
    let (ca, ca_key) = (format!("{name}-ca.pem"), format!("{name}-ca-key.pem"));
    let (csr, cert, key) = (
        format!("{name}-csr.pem"),
        format!("{name}-cert.pem"),
        format!("{name}-key.pem"),
    );
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend([
        "-days",
        "1",
        "-subj",
        &ca_subject,
        "-keyout",
        &ca_key,
        "-out",
        &ca,
    ]);
    openssl(&args);
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend(["-subj", "/CN=localhost", "-keyout", &key, "-out", &csr]);
    openssl(&args);
    let ext = format!("{name}-ext.cnf");
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("extension file");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &ext,
        "-out",
        &cert,
    ]);
    (file("ca.pem"), file("cert.pem"), file("key.pem"))
}

/// A TLS channel to `address` trusting only `ca` (a PEM file).
pub async fn tls_channel(
    address: std::net::SocketAddr,
    ca: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let pem = std::fs::read(ca).expect("CA file");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        .domain_name("localhost");
    tonic::transport::Endpoint::from_shared(format!("https://localhost:{}", address.port()))
        .expect("endpoint")
        .tls_config(tls)?
        .connect()
        .await
}
