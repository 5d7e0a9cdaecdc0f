//! The models this worker holds warm, for its snapshot: the Hugging Face hub cache on local disk
//! (`models--<org>--<name>` folders, sized by their blobs), rescanned at most once per interval
//! so a busy worker's snapshots cost no directory walks. Prewarm hints ask an idle worker to
//! load a model ahead of the tasks that need it, through its executors' `prewarm` commands.

use flowmesh_domain::fleet::{WarmModel, WarmState};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct WarmCache {
    dir: Option<PathBuf>,
    every: Duration,
    last: Mutex<Option<(Instant, Vec<WarmModel>)>>,
}

impl WarmCache {
    pub fn new(dir: Option<PathBuf>, every: Duration) -> WarmCache {
        WarmCache { dir, every, last: Mutex::new(None) }
    }

    /// Forgets the last scan: the next snapshot looks at the disk again.
    pub fn invalidate(&self) {
        *self.last.lock().expect("warm lock") = None;
    }

    /// The cached models, from a scan no older than the interval.
    pub fn models(&self) -> Vec<WarmModel> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let mut last = self.last.lock().expect("warm lock");
        if let Some((at, models)) = last.as_ref()
            && at.elapsed() < self.every
        {
            return models.clone();
        }
        let models = scan(dir);
        *last = Some((Instant::now(), models.clone()));
        models
    }
}

/// How long one executor's prewarm command may run.
const PREWARM_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Serves prewarm hints (a model id per message) until the subscription ends. A busy worker
/// ignores a hint (it is only a hint); an idle one runs every executor's `prewarm` command in
/// turn, then publishes a fresh snapshot so placement sees the model at once.
pub(crate) async fn listen(shared: std::sync::Arc<crate::Shared>, mut hints: async_nats::Subscriber) {
    use futures_util::StreamExt;
    while let Some(message) = hints.next().await {
        let model = String::from_utf8_lossy(&message.payload).trim().to_owned();
        if model.is_empty() {
            continue;
        }
        if !shared.active.lock().expect("active lock").is_empty() {
            tracing::info!(%model, "prewarm hint ignored: the worker is busy");
            continue;
        }
        let commands: Vec<(&str, &[String])> = shared
            .executors
            .iter()
            .filter_map(|e| match e {
                crate::executor::Executor::Plugin(p) if !p.prewarm.is_empty() => {
                    Some((p.name.as_str(), p.prewarm.as_slice()))
                }
                _ => None,
            })
            .collect();
        if commands.is_empty() {
            tracing::info!(%model, "prewarm hint ignored: no executor here declares a prewarm command");
            continue;
        }
        for (executor, argv) in commands {
            let mut command = tokio::process::Command::new(&argv[0]);
            command.args(&argv[1..]).env("FLOWMESH_PREWARM_MODEL", &model).stdin(std::process::Stdio::null());
            if let Some(dir) = &shared.config.model_cache {
                command.env("FLOWMESH_MODEL_CACHE", dir);
            }
            match tokio::time::timeout(PREWARM_LIMIT, command.kill_on_drop(true).status()).await {
                Ok(Ok(status)) if status.success() => tracing::info!(%model, executor, "prewarmed"),
                Ok(Ok(status)) => tracing::warn!(%model, executor, %status, "prewarm command failed"),
                Ok(Err(e)) => tracing::warn!(%model, executor, error = %e, "prewarm command could not start"),
                Err(_) => tracing::warn!(%model, executor, "prewarm command ran out of time"),
            }
        }
        shared.warm.invalidate();
        shared.heartbeat().await;
    }
}

/// Every `models--<org>--<name>` folder of a hub cache as `<org>/<name>`, sized by its blobs.
pub fn scan(dir: &Path) -> Vec<WarmModel> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<WarmModel> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let id = name.strip_prefix("models--")?.split("--").collect::<Vec<_>>().join("/");
            let size_bytes = std::fs::read_dir(entry.path().join("blobs"))
                .map(|blobs| blobs.flatten().filter_map(|b| b.metadata().ok()).map(|m| m.len()).sum())
                .unwrap_or(0);
            (!id.is_empty() && size_bytes > 0).then_some(WarmModel { id, size_bytes, state: WarmState::Cached })
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// The hub cache a Hugging Face library on this machine uses: `HF_HUB_CACHE`, `HF_HOME/hub`, or
/// `~/.cache/huggingface/hub` when it exists.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| var("HOME").map(|home| home.join(".cache/huggingface/hub")).filter(|d| d.is_dir()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_cache_lists_its_models_with_their_blob_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("models--Qwen--Qwen3-0.6B");
        std::fs::create_dir_all(model.join("blobs")).unwrap();
        std::fs::create_dir_all(model.join("snapshots/abc")).unwrap();
        std::fs::write(model.join("blobs/one"), vec![0u8; 1000]).unwrap();
        std::fs::write(model.join("blobs/two"), vec![0u8; 24]).unwrap();
        std::fs::create_dir_all(dir.path().join("models--empty--download/blobs")).unwrap();
        std::fs::create_dir_all(dir.path().join("datasets--openai--gsm8k/blobs")).unwrap();
        let found = scan(dir.path());
        assert_eq!(found, vec![WarmModel { id: "Qwen/Qwen3-0.6B".into(), size_bytes: 1024, state: WarmState::Cached }]);
        let cache = WarmCache::new(Some(dir.path().to_path_buf()), Duration::from_secs(3600));
        assert_eq!(cache.models(), found);
        std::fs::remove_dir_all(&model).unwrap();
        assert_eq!(cache.models(), found, "rescanned only once per interval");
        assert!(WarmCache::new(None, Duration::ZERO).models().is_empty());
    }
}
