//! The machine a service runs on, as far as its names go: one `name()` for the worker's default
//! id and snapshot, and the router's and validator's instance names.

/// The kernel's hostname; `localhost` when it cannot be read.
pub fn name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
