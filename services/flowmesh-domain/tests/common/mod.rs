//! Fixtures shared by the domain's test binaries.
#![allow(dead_code)]

use flowmesh_domain::fleet::{Gpu, Hardware, SlotCount, Slots, WorkerSnapshot, WorkerStatus};

pub const GIB: u64 = 1 << 30;

/// One inference request; two of them with the same input share one execution.
pub const ASK: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: ask}
spec:
  taskType: inference
  model: {source: {type: huggingface, identifier: Qwen/Qwen3-0.6B}}
  inference: {max_tokens: 32, temperature: 0}
  graph:
    nodes:
      - {name: a, spec: {data: {type: list, items: [hello]}}}
"#;

/// An idle, simulated worker serving `types`, with `gpus` as (name, GiB) and two batch slots.
pub fn worker(id: &str, types: &[&str], cores: u32, mem_gib: u64, gpus: &[(&str, u64)]) -> WorkerSnapshot {
    WorkerSnapshot {
        id: id.to_owned(),
        hostname: id.to_owned(),
        version: "test".to_owned(),
        started_at: "2026-01-01T00:00:00.000Z".to_owned(),
        status: WorkerStatus::Idle,
        hardware: Hardware {
            cpu_cores: cores,
            memory_bytes: mem_gib * GIB,
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, (name, gib))| Gpu {
                    index: i as u32,
                    uuid: format!("GPU-{id}-{i}"),
                    name: (*name).to_owned(),
                    memory_bytes: gib * GIB,
                })
                .collect(),
            unified_memory: false,
            shared_memory_bytes: 0,
        },
        supported_task_types: types.iter().map(|t| (*t).to_owned()).collect(),
        executors: Vec::new(),
        slots: Slots { batch: SlotCount { total: 2, in_use: 0 }, service: SlotCount { total: 1, in_use: 0 } },
        prefetch: 0,
        queued: 0,
        ssh_limits: None,
        tags: Vec::new(),
        cost_per_hour: 1.0,
        load: 0.0,
        active_tasks: Vec::new(),
        warm_models: Vec::new(),
        simulated: true,
        heartbeat_interval_sec: 30,
        ttl_sec: 120,
        idle_since_ms: None,
    }
}
