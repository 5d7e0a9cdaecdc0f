//! `flowmesh ssh connect TASK` and `flowmesh ssh run TASK -- CMD`: a shell, or one command, in a
//! running interactive `ssh` task, through the SSH server its container runs. The task's owner is
//! whoever holds a key it lists in `authorizedKeys`: the CLI only finds where the session listens
//! (the worker's `task.updated`) and runs the system's `ssh` with the caller's own key.

use flowmesh::log;
use flowmesh_domain::EventBody;
use flowmesh_domain::state::TaskStatus;
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Open a shell in a running interactive ssh task.
    Connect {
        task: String,
        /// The private key to use (default: ssh's own choice).
        #[arg(short = 'i', long)]
        identity: Option<PathBuf>,
        /// Print the ssh command instead of running it.
        #[arg(long)]
        print: bool,
    },
    /// Run one command in a running interactive ssh task; exits with its exit code.
    Run {
        task: String,
        #[arg(short = 'i', long)]
        identity: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// Where a session listens, from the worker's `task.updated` for the running attempt.
struct Endpoint {
    host: String,
    port: u64,
    user: String,
}

async fn endpoint(js: &async_nats::jetstream::Context, task_id: &str) -> anyhow::Result<Endpoint> {
    let state = log::fold_task(js, task_id).await?;
    let task = state.task(task_id).expect("fold_task found it");
    anyhow::ensure!(task.def.task_type == "ssh", "{task_id} is a {} task, not an ssh session", task.def.task_type);
    anyhow::ensure!(
        flowmesh_domain::validate::ssh_interactive(&task.def.spec),
        "{task_id} runs a command, not a session; its output: flowmesh task logs {task_id} --follow"
    );
    anyhow::ensure!(
        task.status == TaskStatus::Running,
        "{task_id} is {}, not running; sessions can be joined only while they run",
        task.status.as_str()
    );
    let events = log::events(js, subjects::task_events(task_id), false).await?;
    futures_util::pin_mut!(events);
    let mut found = None;
    while let Some(event) = events.next().await {
        if let EventBody::TaskUpdated(u) = event?.body
            && u.task.attempt == task.attempt
            && let Some(data) = u.data
            && let (Some(host), Some(port), Some(user)) =
                (data["host"].as_str(), data["port"].as_u64(), data["user"].as_str())
        {
            found = Some(Endpoint { host: host.to_owned(), port, user: user.to_owned() });
        }
    }
    found.ok_or_else(|| anyhow::anyhow!("{task_id} has not reported where its session listens yet; try again shortly"))
}

/// The `ssh` argv for a session. Session containers get fresh host keys each time, so the CLI
/// neither records nor checks them; the worker's report in the event log says where to go.
fn ssh_argv(at: &Endpoint, identity: Option<&PathBuf>, tty: bool, command: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = vec!["ssh".into(), "-p".into(), at.port.to_string()];
    for option in ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"] {
        argv.extend(["-o".into(), option.into()]);
    }
    if let Some(key) = identity {
        argv.extend(["-i".into(), key.display().to_string(), "-o".into(), "IdentitiesOnly=yes".into()]);
    }
    if tty {
        argv.push("-t".into());
    }
    argv.push(format!("{}@{}", at.user, at.host));
    if !command.is_empty() {
        argv.push("--".into());
        argv.extend(command.iter().cloned());
    }
    argv
}

pub async fn run(nats: &NatsArgs, command: Command) -> anyhow::Result<ExitCode> {
    let (task, identity, tty, remote, print) = match command {
        Command::Connect { task, identity, print } => (task, identity, true, Vec::new(), print),
        Command::Run { task, identity, command } => (task, identity, false, command, false),
    };
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    let at = endpoint(&handles.js, &task).await?;
    let argv = ssh_argv(&at, identity.as_ref(), tty, &remote);
    if print {
        println!("{}", argv.join(" "));
        return Ok(ExitCode::SUCCESS);
    }
    // Replace this process: the terminal, signals and the exit code belong to ssh.
    let error = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    anyhow::bail!("running ssh: {error}")
}
