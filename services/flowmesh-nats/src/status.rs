//! Each service as a NATS micro-service: `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` answer for
//! it, and a status endpoint (`flowmesh.router.status`, `flowmesh.validator.status`,
//! `flowmesh.worker.<id>.status`) returns its current status as JSON.

use async_nats::service::ServiceExt;
use futures_util::StreamExt;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// The status a service publishes; it replaces the value whenever something worth seeing changes.
#[derive(Clone, Default)]
pub struct Status(Arc<Mutex<Value>>);

impl Status {
    pub fn set(&self, value: Value) {
        *self.0.lock().expect("status lock") = value;
    }

    pub fn get(&self) -> Value {
        self.0.lock().expect("status lock").clone()
    }
}

/// Keeps the micro-service registered; dropping it unregisters.
pub struct Registration(tokio::task::JoinHandle<()>);

impl Drop for Registration {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Registers `flowmesh-<service>` as a micro-service whose status endpoint is
/// `flowmesh.<scope>.status`, answered until the returned registration is dropped.
pub async fn serve(
    client: &async_nats::Client,
    service: &str,
    scope: &str,
    description: &str,
    status: Status,
) -> anyhow::Result<Registration> {
    let micro = client
        .service_builder()
        .description(description)
        .start(crate::subjects::service_name(service), env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| anyhow::anyhow!("starting the {service} micro-service: {e}"))?;
    let mut endpoint = micro
        .endpoint(crate::subjects::status(scope))
        .await
        .map_err(|e| anyhow::anyhow!("adding the status endpoint: {e}"))?;
    Ok(Registration(tokio::spawn(async move {
        // Owning `micro` here keeps the service registered for as long as the task lives.
        let _micro = micro;
        while let Some(request) = endpoint.next().await {
            let body = serde_json::to_vec(&status.get()).unwrap_or_default();
            let _ = request.respond(Ok(body.into())).await;
        }
    })))
}
