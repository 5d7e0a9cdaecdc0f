//! Identifiers. Every id is derived from what caused it, so a retry re-derives the same id.

/// The workflow id of the submission stored at `seq` in the submissions stream.
pub fn workflow_id(submission_seq: u64) -> String {
    format!("wf-{submission_seq}")
}

/// The submission sequence a workflow id was made from (`7` of `wf-7`).
pub fn submission_seq(workflow_id: &str) -> Option<u64> {
    workflow_id.strip_prefix("wf-")?.parse().ok()
}

/// The task id of a stage: unique, stable, and usable as a NATS subject token and object prefix.
pub fn task_id(workflow_id: &str, stage: &str) -> String {
    format!("{workflow_id}-{stage}")
}

/// The workflow a task id belongs to (`wf-7` of `wf-7-train`), read back from [`task_id`]'s form.
pub fn workflow_of_task(task_id: &str) -> Option<&str> {
    let rest = task_id.strip_prefix("wf-")?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    (digits > 0 && rest[digits..].starts_with('-')).then(|| &task_id[..3 + digits])
}

/// Whether `name` can be a stage name (and so part of a subject token and an object name).
pub fn is_valid_stage_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether `id` can be a worker id (a single NATS subject token and a KV key).
pub fn is_valid_worker_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_names_its_workflow() {
        for (task, want) in [
            ("wf-7-train", Some("wf-7")),
            ("wf-12-stage-2", Some("wf-12")),
            ("wf-3-9", Some("wf-3")),
            ("wf-7", None),
            ("wf--x", None),
            ("job-7-train", None),
        ] {
            assert_eq!(workflow_of_task(task), want, "{task}");
        }
        assert_eq!(workflow_of_task(&task_id("wf-41", "main")), Some("wf-41"));
    }
}
