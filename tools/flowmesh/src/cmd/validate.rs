//! `flowmesh validate FILE…` (also `workflow validate`): checks documents offline with the
//! validator's own rules; exits 1 when any has a problem.

use flowmesh_domain::Problem;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[arg(long)]
    json: bool,
}

/// One document's verdict, as `--json` prints it.
#[derive(serde::Serialize)]
struct Verdict<'a> {
    file: &'a PathBuf,
    valid: bool,
    errors: Vec<Problem>,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut all_ok = true;
    let mut report = Vec::new();
    for file in &args.files {
        let outcome = super::read_document(file)
            .map_err(|e| e.to_string())
            .map(|body| flowmesh_domain::validate_submission(&body, "wf-0"));
        let problems = match outcome {
            Err(e) => vec![Problem::new("/", e)],
            Ok(Ok(_)) => Vec::new(),
            Ok(Err(problems)) => problems,
        };
        all_ok &= problems.is_empty();
        if args.json {
            report.push(Verdict { file, valid: problems.is_empty(), errors: problems });
        } else if problems.is_empty() {
            println!("{}: valid", file.display());
        } else {
            println!("{}: {} problem(s)", file.display(), problems.len());
            for p in &problems {
                println!("  {p}");
            }
        }
    }
    if args.json {
        super::print_sorted_json(&report)?;
    }
    Ok(super::exit(all_ok))
}
