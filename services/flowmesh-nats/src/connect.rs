//! Connecting to NATS with the options every service and the CLI share.

use crate::error::EdgeError;
use std::path::PathBuf;

/// How to reach NATS: URL plus optional credentials and TLS material.
#[derive(Debug, Clone, Default)]
pub struct NatsOptions {
    pub url: String,
    /// A `.creds` file (JWT + nkey seed).
    pub creds: Option<PathBuf>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// A CA bundle to verify the server; setting it requires TLS.
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// A name shown in the server's connection list (`flowmesh-router`, …).
    pub name: String,
}

pub async fn connect(options: &NatsOptions) -> Result<async_nats::Client, EdgeError> {
    let mut opts = async_nats::ConnectOptions::new().name(&options.name).retry_on_initial_connect();
    if let Some(creds) = &options.creds {
        opts = async_nats::ConnectOptions::with_credentials_file(creds.clone())
            .await
            .map_err(|e| EdgeError::transient(format!("reading credentials {}", creds.display()), e))?
            .name(&options.name);
    }
    if let (Some(user), Some(password)) = (&options.user, &options.password) {
        opts = opts.user_and_password(user.clone(), password.clone());
    }
    if let Some(ca) = &options.tls_ca {
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&options.tls_cert, &options.tls_key) {
        opts = opts.add_client_certificate(cert.clone(), key.clone());
    }
    // `nats://a:4222,nats://b:4222`: every server of a cluster, so the client can fail over.
    let servers: Vec<&str> = options.url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    opts.connect(servers).await.map_err(|e| EdgeError::transient(format!("connecting to {}", options.url), e))
}
