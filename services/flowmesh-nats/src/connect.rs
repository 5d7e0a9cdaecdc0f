//! Connecting to NATS with the options every service and the CLI share.

use crate::error::EdgeError;
use crate::subjects;
use sha2::Digest;
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
    /// Where this client receives replies; `_INBOX_<user>` when unset and a user is given (the
    /// shipped roles grant each user only its own prefix), the shared `_INBOX` otherwise.
    pub inbox_prefix: Option<String>,
}

impl NatsOptions {
    /// The prefix of this client's reply subjects, when it is not the shared `_INBOX`.
    pub fn inbox_prefix(&self) -> Option<String> {
        self.inbox_prefix.clone().or_else(|| self.user.as_deref().map(subjects::inbox_prefix))
    }

    /// A submission's `Nats-Msg-Id` for the id `given` by this user (`flowmesh submit --msg-id`).
    /// The stream deduplicates ids across every user, so the id stored is the user's name, the
    /// given id and a tag only the holder of this user's secret (its password or creds file) can
    /// compute: another user's `--msg-id run-7` can neither return this user's submission nor
    /// take its id ahead of time. Without credentials (a dev stack) the id is stored as given.
    pub fn scoped_msg_id(&self, given: &str) -> Result<String, EdgeError> {
        let (user, secret) = match (&self.user, &self.password, &self.creds) {
            (Some(user), Some(password), _) => (user.clone(), password.as_bytes().to_vec()),
            (_, _, Some(creds)) => {
                let secret = std::fs::read(creds)
                    .map_err(|e| EdgeError::transient(format!("reading credentials {}", creds.display()), e))?;
                ("creds".to_owned(), secret)
            }
            _ => return Ok(given.to_owned()),
        };
        let mut hasher = sha2::Sha256::new();
        for part in [b"flowmesh submission id".as_slice(), user.as_bytes(), &secret, given.as_bytes()] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let tag: String = hasher.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("{user}:{given}:{tag}"))
    }
}

pub async fn connect(options: &NatsOptions) -> Result<async_nats::Client, EdgeError> {
    let mut opts = async_nats::ConnectOptions::new().name(&options.name).retry_on_initial_connect();
    let inbox_prefix = options.inbox_prefix();
    if let Some(creds) = &options.creds {
        opts = async_nats::ConnectOptions::with_credentials_file(creds.clone())
            .await
            .map_err(|e| EdgeError::transient(format!("reading credentials {}", creds.display()), e))?
            .name(&options.name);
    }
    if let Some(prefix) = inbox_prefix {
        opts = opts.custom_inbox_prefix(prefix);
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
