//! The hardware probe: CPU and memory from the OS, GPUs through NVML, or a simulation profile.

use flowmesh_domain::fleet::{Gpu, Hardware};
use serde::Serialize;
use tracing::info;

/// What the probe found, with the facts only a person reading `--collect-hw` needs.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub hardware: Hardware,
    pub simulated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// Why no GPU was found, when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_note: Option<String>,
}

/// A GPU as NVML reports it, before `CUDA_VISIBLE_DEVICES` is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct RawGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `None` when the device has no dedicated memory (unified-memory parts).
    pub memory_bytes: Option<u64>,
}

/// Probes the machine, or takes `simulate` (the JSON of `FLOWMESH_SIMULATE_HW`) instead.
pub fn probe(simulate: Option<&Hardware>, cuda_visible_devices: Option<&str>) -> Probe {
    if let Some(hw) = simulate {
        return Probe {
            hardware: hw.clone(),
            simulated: true,
            driver_version: None,
            cuda_version: None,
            gpu_note: None,
        };
    }
    let cpu_cores = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let memory_bytes = system_memory().unwrap_or(0);
    let (raw, driver_version, cuda_version, gpu_note) = match nvml_gpus() {
        Ok((gpus, driver, cuda)) => (gpus, driver, cuda, None),
        Err(note) => {
            info!(reason = %note, "no GPUs: NVML is not available");
            (Vec::new(), None, None, Some(note))
        }
    };
    let visible = visible_gpus(&raw, cuda_visible_devices);
    let hardware = assemble(cpu_cores, memory_bytes, visible);
    Probe { hardware, simulated: false, driver_version, cuda_version, gpu_note }
}

/// Builds `Hardware` from the visible GPUs: devices without dedicated memory make the worker a
/// unified-memory one whose GPUs share the system memory.
pub fn assemble(cpu_cores: u32, memory_bytes: u64, visible: Vec<RawGpu>) -> Hardware {
    let unified = visible.iter().any(|g| g.memory_bytes.is_none());
    let gpus = visible
        .into_iter()
        .enumerate()
        .map(|(i, g)| Gpu { index: i as u32, uuid: g.uuid, name: g.name, memory_bytes: g.memory_bytes.unwrap_or(0) })
        .collect();
    Hardware {
        cpu_cores,
        memory_bytes,
        gpus,
        unified_memory: unified,
        shared_memory_bytes: if unified { memory_bytes } else { 0 },
    }
}

/// Applies `CUDA_VISIBLE_DEVICES` as CUDA does: a comma-separated list of indices or UUIDs
/// (`GPU-…`, prefixes allowed), in the order given; parsing stops at the first entry that matches
/// nothing; an empty value hides every GPU; unset shows all. The result is re-indexed from 0.
pub fn visible_gpus(all: &[RawGpu], cuda_visible_devices: Option<&str>) -> Vec<RawGpu> {
    let Some(spec) = cuda_visible_devices else {
        return all.to_vec();
    };
    let mut out: Vec<RawGpu> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if let Ok(index) = entry.parse::<u32>() {
            all.iter().find(|g| g.index == index)
        } else if entry.len() >= 4 {
            let wanted = entry.to_lowercase();
            all.iter().find(|g| g.uuid.to_lowercase().starts_with(&wanted))
        } else {
            None
        };
        match found {
            Some(g) if !out.iter().any(|o| o.uuid == g.uuid && o.index == g.index) => out.push(g.clone()),
            _ => break,
        }
    }
    out
}

fn system_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

type NvmlFound = (Vec<RawGpu>, Option<String>, Option<String>);

/// Reads every GPU NVML can see. Any failure (no library, no driver, no device) is a note, never a crash.
fn nvml_gpus() -> Result<NvmlFound, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML did not initialise ({e})"))?;
    let count = nvml.device_count().map_err(|e| format!("NVML could not count devices ({e})"))?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let device = nvml.device_by_index(index).map_err(|e| format!("NVML could not open GPU {index} ({e})"))?;
        let name = device.name().unwrap_or_else(|_| format!("GPU {index}"));
        let uuid = device.uuid().unwrap_or_default();
        // Unified-memory parts (GB10, Tegra, Thor) report no framebuffer of their own.
        let memory_bytes = device.memory_info().ok().map(|m| m.total).filter(|&total| total > 0);
        gpus.push(RawGpu { index, uuid, name, memory_bytes });
    }
    let driver = nvml.sys_driver_version().ok();
    let cuda = nvml.sys_cuda_driver_version().ok().map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
    Ok((gpus, driver, cuda))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str, memory: Option<u64>) -> RawGpu {
        RawGpu { index, uuid: uuid.to_owned(), name: format!("NVIDIA H100 {index}"), memory_bytes: memory }
    }

    #[test]
    fn cuda_visible_devices_filters_and_reindexes() {
        let all = vec![gpu(0, "GPU-aaaa-0", Some(80)), gpu(1, "GPU-bbbb-1", Some(80)), gpu(2, "GPU-cccc-2", Some(80))];
        let uuids = |v: Vec<RawGpu>| v.into_iter().map(|g| g.uuid).collect::<Vec<_>>();
        let cases: &[(Option<&str>, &[&str])] = &[
            (None, &["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2"]),
            (Some(""), &[]),
            (Some("2,0"), &["GPU-cccc-2", "GPU-aaaa-0"]),
            (Some("GPU-bbbb"), &["GPU-bbbb-1"]),
            (Some("1,7,2"), &["GPU-bbbb-1"]),
            (Some("-1"), &[]),
            (Some("0,0"), &["GPU-aaaa-0"]),
        ];
        for (spec, want) in cases {
            assert_eq!(uuids(visible_gpus(&all, *spec)), *want, "CUDA_VISIBLE_DEVICES={spec:?}");
        }
        let hw = assemble(8, 64, visible_gpus(&all, Some("2")));
        assert_eq!(hw.gpus[0].index, 0, "re-indexed from 0");
        assert!(!hw.unified_memory);
    }

    #[test]
    fn devices_without_memory_make_a_unified_worker() {
        let hw = assemble(20, 128 << 30, vec![gpu(0, "GPU-gb10", None)]);
        assert!(hw.unified_memory);
        assert_eq!(hw.shared_memory_bytes, 128 << 30);
    }

    #[test]
    fn no_driver_means_no_gpus_not_a_crash() {
        let p = probe(None, None);
        assert!(p.hardware.cpu_cores >= 1);
        if p.gpu_note.is_some() {
            assert!(p.hardware.gpus.is_empty());
        }
    }
}
