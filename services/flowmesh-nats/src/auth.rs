//! Per-worker and per-submitter users for `streams/nats-server.conf`. The shared `worker` user
//! may take any worker's work; a worker user made here may reach only its own work subject and
//! consumer, its own snapshot key, its own control and status subjects and its own inbox prefix.
//! A submitter user made here is the SUBMITTER role with its own inbox prefix. Each is the file's
//! role narrowed to one name, so the roles stay written once.

use crate::subjects;

/// The server configuration with the roles, as shipped in `streams/`.
pub const SERVER_CONFIG: &str = include_str!("../../../streams/nats-server.conf");

/// The line inside `users = [ … ]` where per-worker users are inserted.
const USERS_MARKER: &str = "    # per-worker users go here";

/// The NATS user of one worker.
pub fn worker_user(worker_id: &str) -> String {
    format!("worker-{worker_id}")
}

/// The environment variable of the nats-server process that holds that user's password.
pub fn password_variable(worker_id: &str) -> String {
    format!("FLOWMESH_WORKER_{}_PASSWORD", token(worker_id))
}

/// The environment variable of the nats-server process that holds a submitter user's password.
pub fn submitter_password_variable(user: &str) -> String {
    format!("FLOWMESH_SUBMITTER_{}_PASSWORD", token(user))
}

/// The id as it appears in variable and role names: upper case, `_` for anything else.
fn token(worker_id: &str) -> String {
    worker_id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

/// A name that becomes a subject token (a worker id, a user's inbox prefix).
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("{what} {name:?}: use letters, digits, '-' and '_' only (it is a subject token)"));
    }
    Ok(())
}

/// `SERVER_CONFIG` with one user per worker id and one per submitter name.
pub fn server_config(worker_ids: &[String], submitters: &[String]) -> Result<String, String> {
    let mut variables: Vec<String> = Vec::new();
    let mut users_seen: Vec<String> =
        ["submitter", "worker", "validator", "router", "admin"].map(String::from).to_vec();
    let named = worker_ids
        .iter()
        .map(|id| ("worker id", id, password_variable(id), worker_user(id)))
        .chain(submitters.iter().map(|name| ("submitter", name, submitter_password_variable(name), name.clone())));
    for (what, name, variable, user) in named {
        check_name(what, name)?;
        if variables.contains(&variable) {
            return Err(format!("{what} {name:?}: another name already uses the password variable {variable}"));
        }
        if users_seen.contains(&user) {
            return Err(format!("{what} {name:?}: the user {user:?} is already in the file"));
        }
        variables.push(variable);
        users_seen.push(user);
    }
    // Every role that reads the shared artifacts store reads each worker's own store too.
    let buckets: Vec<String> = worker_ids.iter().map(|id| subjects::artifacts_bucket(id)).collect();
    let mut config = SERVER_CONFIG.to_owned();
    for name in ["SUBMITTER", "WORKER", "ROUTER"] {
        let shipped = role(name)?;
        config = config.replacen(&shipped, &reading_every_store(&shipped, &buckets), 1);
    }
    let worker = reading_every_store(&role("WORKER")?, &buckets);
    let submitter = reading_every_store(&role("SUBMITTER")?, &buckets);
    let mut blocks = String::new();
    let mut users = String::new();
    for id in worker_ids {
        let name = format!("WORKER_{}", token(id));
        blocks += &format!(
            "  # {} (flowmesh streams server-config)\n  {name} = {}\n\n",
            worker_user(id),
            narrow(&worker, id)?
        );
        users += &format!(
            "    {{ user: {:?}, password: ${}, permissions: ${name} }}\n",
            worker_user(id),
            password_variable(id)
        );
    }
    for user in submitters {
        let name = format!("SUBMITTER_{}", token(user));
        let own = replace_once(&submitter, "SUBMITTER", &subjects::inbox("submitter"), &[subjects::inbox(user)])?;
        blocks += &format!("  # {user} (flowmesh streams server-config)\n  {name} = {own}\n\n");
        users += &format!(
            "    {{ user: {user:?}, password: ${}, permissions: ${name} }}\n",
            submitter_password_variable(user)
        );
    }
    let users_at = config.find("  users = [").ok_or("streams/nats-server.conf has no users list")?;
    let marker_at = config.find(USERS_MARKER).ok_or("streams/nats-server.conf has no per-worker marker")?;
    Ok(format!("{}{blocks}{}{users}{}", &config[..users_at], &config[users_at..marker_at], &config[marker_at..]))
}

/// The text of a role's block, from `{` to its closing `}`.
fn role(name: &str) -> Result<String, String> {
    let start =
        SERVER_CONFIG.find(&format!("  {name} = {{")).ok_or(format!("streams/nats-server.conf has no {name} role"))?;
    let body = &SERVER_CONFIG[start + format!("  {name} = ").len()..];
    let end = body.find("\n  }\n").ok_or(format!("the {name} role does not end with '  }}'"))?;
    Ok(body[..end + "\n  }".len()].to_owned())
}

/// `role` with each subject that reads the shared artifacts store (`…OBJ_flowmesh_artifacts`,
/// `…OBJ_flowmesh_artifacts.>`) followed by the same subject for each of `buckets`.
fn reading_every_store(role: &str, buckets: &[String]) -> String {
    let shared = subjects::object_stream(subjects::ARTIFACTS_BUCKET);
    let mut out = String::new();
    for line in role.split_inclusive('\n') {
        out += line;
        let subject = line.trim().trim_matches('"');
        let reads_shared = line.trim().starts_with('"')
            && subject.starts_with("$JS.API.")
            && (subject.ends_with(&shared) || subject.contains(&format!("{shared}.")));
        if reads_shared {
            for bucket in buckets {
                out += &line.replace(&shared, &subjects::object_stream(bucket));
            }
        }
    }
    out
}

/// The WORKER role with every subject that reaches any worker's work or keys replaced by those
/// of `id` (reads of other streams and buckets stay as in the role). Each replaced subject must
/// be in the role exactly once: a role that changed shape is an error, never a wider permission.
fn narrow(role: &str, id: &str) -> Result<String, String> {
    let consumer = subjects::work_consumer(id);
    let work = subjects::WORK_STREAM;
    let workers = subjects::WORKERS_BUCKET;
    let replacements: Vec<(String, Vec<String>)> = vec![
        (format!("$KV.{workers}.>"), vec![format!("$KV.{workers}.{id}")]),
        // Live output only under its own name: a follower shows a chunk only from the worker
        // the task was dispatched to.
        (subjects::logs("*", "*", "*"), vec![subjects::logs("*", "*", id)]),
        (
            format!("$JS.API.CONSUMER.CREATE.{work}.>"),
            vec![format!("$JS.API.CONSUMER.CREATE.{work}.{consumer}.{}", subjects::work(id))],
        ),
        // The legacy create names no filter: it would let the worker choose another's subject.
        (format!("$JS.API.CONSUMER.DURABLE.CREATE.{work}.>"), vec![]),
        (format!("$JS.API.CONSUMER.MSG.NEXT.{work}.>"), vec![format!("$JS.API.CONSUMER.MSG.NEXT.{work}.{consumer}")]),
        (format!("$JS.ACK.{work}.>"), vec![format!("$JS.ACK.{work}.{consumer}.>")]),
        // No message reads from FLOWMESH_WORK, which holds every worker's orders.
        (format!("$JS.API.STREAM.MSG.GET.{work}"), vec![]),
        (format!("$JS.API.DIRECT.GET.{work}"), vec![]),
        (format!("$JS.API.DIRECT.GET.{work}.>"), vec![]),
        // Its dispatches in the log: one consumer, its own name and subject, acks only there.
        (
            format!("$JS.API.CONSUMER.CREATE.{}.*.{}", subjects::EVENTS_STREAM, subjects::dispatches("*")),
            vec![format!(
                "$JS.API.CONSUMER.CREATE.{}.{consumer}.{}",
                subjects::EVENTS_STREAM,
                subjects::dispatches(id)
            )],
        ),
        (
            format!("$JS.ACK.{}.>", subjects::EVENTS_STREAM),
            vec![format!("$JS.ACK.{}.{consumer}.>", subjects::EVENTS_STREAM)],
        ),
        (subjects::inbox("worker"), vec![subjects::inbox(&worker_user(id))]),
        // Its files only in its own store, which it creates (and may purge: an object stored
        // again leaves old chunks behind); no write to the shared store or another worker's.
        (
            format!("$O.{}.>", subjects::ARTIFACTS_BUCKET),
            vec![
                format!("$O.{}.>", subjects::artifacts_bucket(id)),
                format!("$JS.API.STREAM.CREATE.{}", subjects::object_stream(&subjects::artifacts_bucket(id))),
                format!("$JS.API.STREAM.PURGE.{}", subjects::object_stream(&subjects::artifacts_bucket(id))),
            ],
        ),
        (subjects::cancel("*"), vec![subjects::cancel(id)]),
        (subjects::release("*"), vec![subjects::release(id)]),
        (subjects::prewarm("*"), vec![subjects::prewarm(id)]),
        (subjects::status("worker.*"), vec![subjects::status(&format!("worker.{id}"))]),
    ];
    // Reports only under its own name: the log's readers take a report's author from its subject.
    let replacements = replacements.into_iter().chain(
        subjects::REPORT_KINDS.iter().map(|kind| (subjects::reports(kind, "*"), vec![subjects::reports(kind, id)])),
    );
    let mut narrowed = role.to_owned();
    for (wide, narrow) in replacements {
        narrowed = replace_once(&narrowed, "WORKER", &wide, &narrow)?;
    }
    Ok(narrowed)
}

/// `role` (the text of role `name`) with the quoted subject `wide` replaced by the subjects
/// `narrow` (none: removed). `wide` must be in the role exactly once.
fn replace_once(role: &str, name: &str, wide: &str, narrow: &[String]) -> Result<String, String> {
    let quoted = format!("\"{wide}\"");
    let count = role.matches(quoted.as_str()).count();
    if count != 1 {
        return Err(format!("the {name} role has {quoted} {count} times (expected once); cannot narrow it"));
    }
    let narrow: Vec<String> = narrow.iter().map(|s| format!("\"{s}\"")).collect();
    Ok(match role.lines().find(|line| line.trim() == quoted) {
        // A subject on a line of its own: one line per narrowed subject, same indent.
        Some(line) => {
            let indent = &line[..line.len() - line.trim_start().len()];
            let lines: Vec<String> = narrow.iter().map(|s| format!("{indent}{s}")).collect();
            let (before, after) = role.split_once(&format!("{line}\n")).expect("the line is in the role");
            format!("{before}{}{after}", lines.iter().map(|l| format!("{l}\n")).collect::<String>())
        }
        // Inside a one-line list (`subscribe = { allow = [ … ] }`).
        None => role.replace(&quoted, &narrow.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn each_worker_gets_the_role_narrowed_to_its_id() {
        let config = server_config(&ids(&["gpu-1", "cpu_2"]), &[]).unwrap();
        assert!(
            config.contains(
                r#"{ user: "worker-gpu-1", password: $FLOWMESH_WORKER_GPU_1_PASSWORD, permissions: $WORKER_GPU_1 }"#
            ),
            "{config}"
        );
        assert!(config.contains(
            r#"{ user: "worker-cpu_2", password: $FLOWMESH_WORKER_CPU_2_PASSWORD, permissions: $WORKER_CPU_2 }"#
        ));
        let block = &config[config.find("WORKER_GPU_1 = {").unwrap()..];
        let block = &block[..block.find("\n  }").unwrap()];
        for narrow in [
            "\"$KV.flowmesh_workers.gpu-1\"",
            "\"$JS.API.CONSUMER.CREATE.FLOWMESH_WORK.worker-gpu-1.flowmesh.work.gpu-1\"",
            "\"$JS.API.CONSUMER.MSG.NEXT.FLOWMESH_WORK.worker-gpu-1\"",
            "\"$JS.ACK.FLOWMESH_WORK.worker-gpu-1.>\"",
            "\"flowmesh.control.gpu-1.cancel\"",
            "\"flowmesh.worker.gpu-1.status\"",
            "\"flowmesh.events.gpu-1.*.*.task.completed\"",
            "\"flowmesh.events.gpu-1.*.*.task.failed\"",
            "\"flowmesh.logs.*.*.gpu-1\"",
            "\"_INBOX_worker-gpu-1.>\"",
            // What names no worker stays as in the role.
            "\"$JS.API.CONSUMER.MSG.NEXT.FLOWMESH_EVENTS.>\"",
        ] {
            assert!(block.contains(narrow), "{narrow} missing from\n{block}");
        }
        for wide in [
            "\"$KV.flowmesh_workers.>\"",
            "\"flowmesh.logs.*.*.*\"",
            "FLOWMESH_WORK.>",
            "DURABLE.CREATE",
            "MSG.GET.>",
            "FLOWMESH_WORK\"",
            "_INBOX_worker.>",
            "control.*",
            "flowmesh.worker.*.status",
            "task.completed.*",
            "task.started.*",
            // Nothing of the other worker's but reading its store.
            "workers.cpu_2",
            "work.cpu_2",
            "FLOWMESH_WORK.worker-cpu_2",
            "control.cpu_2",
            "task.completed.cpu_2",
            "worker-cpu_2.>",
            "$O.flowmesh_artifacts_cpu_2",
            "STREAM.CREATE.OBJ_flowmesh_artifacts_cpu_2",
            "PURGE.OBJ_flowmesh_artifacts_cpu_2",
        ] {
            assert!(!block.contains(wide), "{wide} left in\n{block}");
        }
        assert!(block.contains("\"$JS.API.STREAM.MSG.GET.OBJ_flowmesh_artifacts\""), "{block}");
        // Its files go to its own store only; it reads every worker's (upstream inputs).
        assert!(block.contains("\"$O.flowmesh_artifacts_gpu-1.>\""), "{block}");
        assert!(block.contains("\"$JS.API.STREAM.CREATE.OBJ_flowmesh_artifacts_gpu-1\""), "{block}");
        assert!(
            !block.contains("\"$O.flowmesh_artifacts.>\"") && !block.contains("$O.flowmesh_artifacts_cpu_2"),
            "{block}"
        );
        assert!(block.contains("\"$JS.API.CONSUMER.CREATE.OBJ_flowmesh_artifacts_cpu_2.>\""), "{block}");
        assert!(block.contains("\"$JS.API.DIRECT.GET.OBJ_flowmesh_artifacts_cpu_2\""), "{block}");
        // The shipped roles read every worker's store too; the shared worker still writes the shared one.
        let submitter = &config[config.find("  SUBMITTER = {").unwrap()..];
        let submitter = &submitter[..submitter.find("\n  }").unwrap()];
        assert!(submitter.contains("\"$JS.API.CONSUMER.MSG.NEXT.OBJ_flowmesh_artifacts_gpu-1.>\""), "{submitter}");
        assert!(!submitter.contains("$O.flowmesh_artifacts"), "{submitter}");
        assert!(!block.contains("MSG.GET.FLOWMESH_WORK"), "{block}");
        // The shared roles are still there, unchanged.
        assert!(
            config.contains("  WORKER = {") && config.contains("{ user: worker, password: $FLOWMESH_WORKER_PASSWORD")
        );
        assert_eq!(server_config(&[], &[]).unwrap(), SERVER_CONFIG);
    }

    #[test]
    fn each_submitter_gets_the_role_with_its_own_inbox() {
        let config = server_config(&[], &ids(&["alice"])).unwrap();
        assert!(config.contains(
            r#"{ user: "alice", password: $FLOWMESH_SUBMITTER_ALICE_PASSWORD, permissions: $SUBMITTER_ALICE }"#
        ));
        let block = &config[config.find("SUBMITTER_ALICE = {").unwrap()..];
        let block = &block[..block.find("\n  }").unwrap()];
        assert!(block.contains("\"_INBOX_alice.>\"") && !block.contains("_INBOX_submitter"), "{block}");
        assert!(block.contains("\"flowmesh.submit\""), "{block}");
        let both = server_config(&ids(&["gpu-1"]), &ids(&["alice"])).unwrap();
        let block = &both[both.find("SUBMITTER_ALICE = {").unwrap()..];
        assert!(block.contains("\"$JS.API.STREAM.MSG.GET.OBJ_flowmesh_artifacts_gpu-1\""), "{block}");
        let clash = server_config(&[], &ids(&["router"])).unwrap_err();
        assert!(clash.contains("already in the file"), "{clash}");
    }

    #[test]
    fn ids_that_are_not_one_subject_token_are_refused() {
        for (bad, says) in [
            ("gpu.1", "letters, digits"),
            ("gpu*", "letters, digits"),
            ("", "letters, digits"),
            ("gpu 1", "letters, digits"),
        ] {
            let error = server_config(&ids(&[bad]), &[]).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
        let clash = server_config(&ids(&["gpu-1", "gpu_1"]), &[]).unwrap_err();
        assert!(clash.contains("FLOWMESH_WORKER_GPU_1_PASSWORD"), "{clash}");
    }
}
