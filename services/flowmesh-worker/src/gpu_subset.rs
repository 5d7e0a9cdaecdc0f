//! Which of the worker's GPUs an `ssh` container gets: a pure choice over the request and the hardware.

use flowmesh_domain::fleet::{Gpu, Hardware};
use flowmesh_domain::placement::GpuRequest;
use flowmesh_domain::units::format_bytes;

/// Chooses the GPUs a container is given.
///
/// - Limit enabled (`ENABLE_SSH_GPU_LIMIT=true`): exactly `request.count` devices whose name
///   contains the type (case-insensitively) and whose memory is at least the per-device request
///   (on a unified-memory worker a device counts `shared_memory_bytes / count`, as placement does).
///   Among the matching devices the smallest sufficient memory wins, then the lowest index, so a
///   small job does not take the big card. A count of 0 gets no device.
/// - Limit disabled: every GPU of the worker, whatever the count (0 included): the operator chose
///   not to partition the machine, so a container sees it as it is (`--gpus all`). A request the
///   worker cannot meet still fails, as it would with the limit on.
/// - A GPU request (count > 0) on a worker without GPUs is an error in both modes: the task asked
///   for hardware that is not there, and running it on the CPU would be a silent lie.
///
/// The error is the message of an execution error.
pub fn select(request: &GpuRequest, hw: &Hardware, limit_enabled: bool) -> Result<Vec<Gpu>, String> {
    if request.count > 0 && hw.gpus.is_empty() {
        return Err(format!("the task asks for {} but this worker has no GPUs", describe(request)));
    }
    let mut matching: Vec<(u64, &Gpu)> = hw
        .gpus
        .iter()
        .filter(|gpu| request.kind.as_deref().is_none_or(|kind| gpu.name.to_lowercase().contains(kind)))
        .map(|gpu| (effective_memory(gpu, request, hw), gpu))
        .filter(|(memory, _)| *memory >= request.memory_bytes)
        .collect();
    if (matching.len() as u64) < u64::from(request.count) {
        return Err(format!(
            "the task asks for {} but only {} of this worker's {} GPUs match",
            describe(request),
            matching.len(),
            hw.gpus.len()
        ));
    }
    if !limit_enabled {
        return Ok(hw.gpus.clone());
    }
    matching.sort_by_key(|(memory, gpu)| (*memory, gpu.index));
    let mut chosen: Vec<Gpu> = matching.into_iter().take(request.count as usize).map(|(_, g)| g.clone()).collect();
    // Host order inside the container, so `CUDA_VISIBLE_DEVICES=0..N-1` follows the machine's order.
    chosen.sort_by_key(|g| g.index);
    Ok(chosen)
}

/// The memory a device offers this request: its own, or its share of a unified pool.
fn effective_memory(gpu: &Gpu, request: &GpuRequest, hw: &Hardware) -> u64 {
    if hw.unified_memory {
        (hw.shared_memory_bytes / u64::from(request.count.max(1))).max(gpu.memory_bytes)
    } else {
        gpu.memory_bytes
    }
}

fn describe(request: &GpuRequest) -> String {
    let mut text = format!("{} GPU{}", request.count, if request.count == 1 { "" } else { "s" });
    if let Some(kind) = &request.kind {
        text += &format!(" of type {}", kind.to_uppercase());
    }
    if request.memory_bytes > 0 {
        text += &format!(" with >= {} each", format_bytes(request.memory_bytes));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, name: &str, memory_gib: u64) -> Gpu {
        Gpu { index, uuid: format!("GPU-{index}"), name: name.to_owned(), memory_bytes: memory_gib * GIB }
    }

    fn hw(gpus: Vec<Gpu>) -> Hardware {
        Hardware { cpu_cores: 32, memory_bytes: 256 * GIB, gpus, ..Hardware::default() }
    }

    fn ask(count: u32, kind: Option<&str>, memory_gib: u64) -> GpuRequest {
        GpuRequest { count, kind: kind.map(str::to_owned), memory_bytes: memory_gib * GIB }
    }

    /// Given the hardware and the request, when selecting with the limit on or off, then these
    /// indices are chosen, or the error mentions this fragment.
    fn check(name: &str, request: GpuRequest, hw: &Hardware, limit: bool, want: Result<&[u32], &str>) {
        let got = select(&request, hw, limit).map(|gpus| gpus.iter().map(|g| g.index).collect::<Vec<_>>());
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{name}"),
            (Err(message), Err(fragment)) => {
                assert!(message.contains(fragment), "{name}: {message:?} should mention {fragment:?}")
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn smallest_matching_subset() {
        // Mixed machine: two big H100s, two smaller A100s, listed out of memory order.
        let mixed = hw(vec![
            gpu(0, "NVIDIA H100 80GB HBM3", 80),
            gpu(1, "NVIDIA A100-SXM4-40GB", 40),
            gpu(2, "NVIDIA H100 80GB HBM3", 80),
            gpu(3, "NVIDIA A100-SXM4-40GB", 40),
        ]);
        let gb10 = Hardware {
            cpu_cores: 20,
            memory_bytes: 128 * GIB,
            gpus: vec![gpu(0, "NVIDIA GB10", 0)],
            unified_memory: true,
            shared_memory_bytes: 128 * GIB,
        };
        let none = hw(vec![]);
        check("count 0 gets nothing", ask(0, None, 0), &mixed, true, Ok(&[]));
        check("count only: smallest memory first, then index", ask(1, None, 0), &mixed, true, Ok(&[1]));
        check("count 3 spills onto the bigger cards", ask(3, None, 0), &mixed, true, Ok(&[0, 1, 3]));
        check("type filter, case-insensitive", ask(2, Some("h100"), 0), &mixed, true, Ok(&[0, 2]));
        check("memory filter skips the small cards", ask(1, None, 48), &mixed, true, Ok(&[0]));
        check("unified pool: the share counts", ask(1, Some("gb10"), 96), &gb10, true, Ok(&[0]));
        check("unified pool too small", ask(1, None, 200), &gb10, true, Err("only 0 of this worker's 1 GPUs match"));
        check(
            "not enough matching",
            ask(3, Some("a100"), 0),
            &mixed,
            true,
            Err("only 2 of this worker's 4 GPUs match"),
        );
        check("no GPUs at all", ask(1, None, 0), &none, true, Err("this worker has no GPUs"));
        check("no GPUs, limit off", ask(1, None, 0), &none, false, Err("this worker has no GPUs"));
        check("no GPUs, no request", ask(0, None, 0), &none, true, Ok(&[]));
        check("limit off: every GPU", ask(1, Some("a100"), 0), &mixed, false, Ok(&[0, 1, 2, 3]));
        check("limit off, count 0: every GPU", ask(0, None, 0), &mixed, false, Ok(&[0, 1, 2, 3]));
        check("limit off, unmet request", ask(5, None, 0), &mixed, false, Err("only 4 of this worker's 4 GPUs match"));
    }
}
