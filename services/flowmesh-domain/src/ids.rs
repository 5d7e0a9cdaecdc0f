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

/// The workflow whose task stored the object `name` (`wf-7` of `wf-7-train/results.json`): a
/// task's files are named `<task_id>/<path>`. `None` for a name of any other form.
pub fn workflow_of_object(name: &str) -> Option<&str> {
    workflow_of_task(name.split_once('/')?.0)
}

/// Whether `name` can be a stage name (and so part of a subject token and an object name).
pub fn is_valid_stage_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether `id` can be a worker id (a single NATS subject token and a KV key). Not `_`: an event
/// subject's first token is the worker it is by or for, and `_` there means no worker.
pub fn is_valid_worker_id(id: &str) -> bool {
    !id.is_empty()
        && id != crate::event::NO_SCOPE
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A set of workflow ids that stays small however many it holds: ids of the form
/// [`workflow_id`] are kept as ranges of submission sequences (workflows mostly end in the order
/// they came, so a router that has forgotten millions holds a few ranges), any other id by name.
/// Serialized as `{"ranges": [[first, last], …], "others": […]}`; a plain list of ids (how a
/// checkpoint written before it held them) reads as well.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowIds {
    /// First sequence → last sequence (inclusive); ranges neither overlap nor touch.
    ranges: std::collections::BTreeMap<u64, u64>,
    others: std::collections::BTreeSet<String>,
}

impl WorkflowIds {
    pub fn insert(&mut self, id: &str) {
        match canonical_seq(id) {
            Some(seq) => self.insert_range(seq, seq),
            None => {
                self.others.insert(id.to_owned());
            }
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        match canonical_seq(id) {
            Some(seq) => self.contains_seq(seq),
            None => self.others.contains(id),
        }
    }

    /// Whether it holds the workflow of submission `seq` (`wf-<seq>`), without spelling its id.
    pub fn contains_seq(&self, seq: u64) -> bool {
        self.ranges.range(..=seq).next_back().is_some_and(|(_, &last)| seq <= last)
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.others.is_empty()
    }

    /// Every id, ranges first (in order of sequence), then the others by name.
    pub fn iter(&self) -> impl Iterator<Item = String> + '_ {
        let in_ranges = self.ranges.iter().flat_map(|(&first, &last)| (first..=last).map(workflow_id));
        in_ranges.chain(self.others.iter().cloned())
    }

    /// Adds every id of `other`.
    pub fn extend(&mut self, other: &WorkflowIds) {
        for (&first, &last) in &other.ranges {
            self.insert_range(first, last);
        }
        self.others.extend(other.others.iter().cloned());
    }

    /// Removes every id of `other`: a range cut by one of `other`'s keeps what lies outside it.
    pub fn remove_all(&mut self, other: &WorkflowIds) {
        for (&first, &last) in &other.ranges {
            let cut: Vec<(u64, u64)> =
                self.ranges.range(..=last).rev().take_while(|&(_, &end)| end >= first).map(|(&a, &b)| (a, b)).collect();
            for (a, b) in cut {
                self.ranges.remove(&a);
                if a < first {
                    self.ranges.insert(a, first - 1);
                }
                if b > last {
                    self.ranges.insert(last + 1, b);
                }
            }
        }
        self.others.retain(|id| !other.others.contains(id));
    }

    /// A digest of the ids (FNV-1a over the ranges and names): two different sets of one size
    /// get different names this way.
    pub fn fingerprint(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for (first, last) in &self.ranges {
            eat(&first.to_le_bytes());
            eat(&last.to_le_bytes());
        }
        for other in &self.others {
            eat(other.as_bytes());
            eat(&[0]);
        }
        hash
    }

    pub fn len(&self) -> usize {
        // Saturating: a record read from the log may hold a range as wide as u64.
        let in_ranges =
            self.ranges.iter().map(|(first, last)| (last - first).saturating_add(1)).fold(0, u64::saturating_add);
        usize::try_from(in_ranges).unwrap_or(usize::MAX).saturating_add(self.others.len())
    }

    /// Adds `first..=last`, merging it with every range it overlaps or touches.
    fn insert_range(&mut self, mut first: u64, mut last: u64) {
        if let Some((&before, &before_last)) = self.ranges.range(..=first).next_back()
            && before_last.saturating_add(1) >= first
        {
            first = before;
            last = last.max(before_last);
        }
        while let Some((&next, &next_last)) = self.ranges.range(first..).next() {
            if next > last.saturating_add(1) {
                break;
            }
            self.ranges.remove(&next);
            last = last.max(next_last);
        }
        self.ranges.insert(first, last);
    }
}

/// The sequence of an id of exactly [`workflow_id`]'s form (`wf-7`, not `wf-07`).
fn canonical_seq(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("wf-")?;
    let canonical = digits.bytes().all(|b| b.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok()).flatten()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WorkflowIdsWire {
    ranges: Vec<(u64, u64)>,
    others: std::collections::BTreeSet<String>,
}

impl serde::Serialize for WorkflowIds {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ranges = self.ranges.iter().map(|(&first, &last)| (first, last)).collect();
        WorkflowIdsWire { ranges, others: self.others.clone() }.serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for WorkflowIds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Read {
            Compact(WorkflowIdsWire),
            Listed(Vec<String>),
        }
        let mut set = WorkflowIds::default();
        match Read::deserialize(deserializer)? {
            Read::Compact(wire) => {
                for (first, last) in wire.ranges {
                    if first > last {
                        return Err(serde::de::Error::custom(format!("range {first}..={last} is empty")));
                    }
                    set.insert_range(first, last);
                }
                set.others = wire.others;
            }
            Read::Listed(ids) => ids.iter().for_each(|id| set.insert(id)),
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_s_widest_range_counts_without_overflowing() {
        let wide: WorkflowIds =
            serde_json::from_value(serde_json::json!({"ranges": [[0, u64::MAX]], "others": ["job-1"]}))
                .expect("a range as wide as u64 reads");
        assert_eq!(wide.len(), usize::MAX);
    }

    #[test]
    fn only_the_spelling_workflow_id_writes_reads_as_a_sequence() {
        for (id, want) in [
            ("wf-0", Some(0)),
            ("wf-7", Some(7)),
            ("wf-10", Some(10)),
            ("wf-18446744073709551615", Some(u64::MAX)),
            ("wf-18446744073709551616", None),
            ("wf-07", None),
            ("wf-00", None),
            ("wf-+7", None),
            ("wf--7", None),
            ("wf- 7", None),
            ("wf-7a", None),
            ("wf-", None),
            ("wf7", None),
            ("job-7", None),
        ] {
            assert_eq!(canonical_seq(id), want, "{id}");
            if let Some(seq) = want {
                assert_eq!(workflow_id(seq), id, "what it reads, workflow_id writes");
            }
        }
    }

    #[test]
    fn workflow_ids_are_kept_as_ranges_whatever_the_order_they_come_in() {
        let mut set = WorkflowIds::default();
        // Out of order, repeated, touching and overlapping, and ids of other forms.
        for seq in [5, 3, 4, 9, 1, 4, 10, 8, 2, 20] {
            set.insert(&workflow_id(seq));
        }
        for other in ["wf-07", "job-1", "wf-"] {
            set.insert(other);
        }
        assert_eq!(set.ranges.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(), [(1, 5), (8, 10), (20, 20)]);
        assert_eq!(set.len(), 5 + 3 + 1 + 3);
        for (id, want) in [
            ("wf-1", true),
            ("wf-5", true),
            ("wf-6", false),
            ("wf-7", false),
            ("wf-07", true),
            ("wf-8", true),
            ("wf-11", false),
            ("wf-20", true),
            ("wf-0", false),
            ("job-1", true),
            ("job-2", false),
        ] {
            assert_eq!(set.contains(id), want, "{id}");
        }
        set.insert("wf-6");
        set.insert("wf-7");
        assert_eq!(set.ranges.len(), 2, "1..=10 joined");

        let json = serde_json::to_value(&set).unwrap();
        assert_eq!(json["ranges"], serde_json::json!([[1, 10], [20, 20]]));
        assert_eq!(serde_json::from_value::<WorkflowIds>(json).unwrap(), set);
        // As an older checkpoint listed them.
        let listed = serde_json::json!(["wf-3", "wf-1", "wf-2", "job-1"]);
        let read: WorkflowIds = serde_json::from_value(listed).unwrap();
        assert!(read.contains("wf-2") && read.contains("job-1") && read.ranges.len() == 1);
        assert!(serde_json::from_value::<WorkflowIds>(serde_json::json!({"ranges": [[3, 2]], "others": []})).is_err());
    }

    #[test]
    fn workflow_ids_are_joined_and_cut_as_ranges() {
        let set = |seqs: &[u64], others: &[&str]| {
            let mut s = WorkflowIds::default();
            seqs.iter().for_each(|&q| s.insert(&workflow_id(q)));
            others.iter().for_each(|&o| s.insert(o));
            s
        };
        let ranges = |s: &WorkflowIds| s.ranges.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>();
        /// Held, removed, what stays.
        type Row = (&'static [u64], &'static [u64], &'static [(u64, u64)]);
        let table: &[Row] = &[
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &[4, 5, 6], &[(1, 3), (7, 10)]),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &[]),
            (&[1, 2, 3, 7, 8, 9], &[3, 4, 5, 6, 7], &[(1, 2), (8, 9)]),
            (&[1, 2, 3, 7, 8, 9], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &[]),
            (&[5, 6], &[1, 2, 9], &[(5, 6)]),
            (&[1, 3, 5, 7], &[1, 2, 3, 4, 5, 6], &[(7, 7)]),
            (&[], &[1], &[]),
        ];
        for &(held, removed, stays) in table {
            let mut s = set(held, &["job-1", "job-2"]);
            s.remove_all(&set(removed, &["job-2", "job-3"]));
            assert_eq!(ranges(&s), stays, "{held:?} without {removed:?}");
            assert_eq!(s.others.iter().collect::<Vec<_>>(), ["job-1"]);
            let kept: Vec<String> = held.iter().filter(|q| !removed.contains(q)).map(|&q| workflow_id(q)).collect();
            assert_eq!(s.iter().filter(|id| id.starts_with("wf-")).collect::<Vec<_>>(), kept);
        }
        let mut joined = set(&[1, 2, 9], &["job-1"]);
        joined.extend(&set(&[3, 4, 8], &["job-2"]));
        assert_eq!(ranges(&joined), [(1, 4), (8, 9)]);
        assert_eq!(
            joined.iter().collect::<Vec<_>>(),
            ["wf-1", "wf-2", "wf-3", "wf-4", "wf-8", "wf-9", "job-1", "job-2"]
        );
        assert!(!joined.is_empty() && WorkflowIds::default().is_empty());
        // Same size, other ids: another fingerprint; the same ids: the same.
        assert_ne!(set(&[1, 2], &[]).fingerprint(), set(&[1, 3], &[]).fingerprint());
        assert_ne!(set(&[], &["ab", "c"]).fingerprint(), set(&[], &["a", "bc"]).fingerprint());
        assert_eq!(joined.fingerprint(), set(&[1, 2, 3, 4, 8, 9], &["job-2", "job-1"]).fingerprint());
    }

    #[test]
    fn a_million_forgotten_workflows_serialize_in_a_few_bytes() {
        let mut set = WorkflowIds::default();
        for seq in 1..=1_000_000 {
            set.insert(&workflow_id(seq));
        }
        assert_eq!(set.len(), 1_000_000);
        assert_eq!(serde_json::to_string(&set).unwrap(), r#"{"ranges":[[1,1000000]],"others":[]}"#);
    }

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

    #[test]
    fn a_stored_file_names_the_workflow_of_its_task() {
        for (object, want) in [
            ("wf-7-train/results.json", Some("wf-7")),
            ("wf-7-train/final_lora/adapter_model.safetensors", Some("wf-7")),
            ("wf-12-stage-2/logs/stdout.log", Some("wf-12")),
            ("wf-7-train", None),
            ("wf-7/results.json", None),
            ("models/wf-7-train/x", None),
            ("", None),
        ] {
            assert_eq!(workflow_of_object(object), want, "{object}");
        }
    }
}
