//! Every example document behaves as paired: valid ones are accepted, invalid ones report
//! (at least) the paths their `# expect-error:` lines name.

use flowmesh_domain::validate_submission;
use std::path::PathBuf;

fn examples(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples").join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn valid_examples_are_accepted() {
    let all = examples("valid");
    assert!(all.len() >= 12, "want at least 12 valid examples, found {}", all.len());
    for (name, body) in all {
        if let Err(problems) = validate_submission(&body, "wf-1") {
            let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
            panic!("{name} should be valid, got:\n  {}", listed.join("\n  "));
        }
    }
}

#[test]
fn invalid_examples_report_their_paths() {
    let all = examples("invalid");
    assert!(all.len() >= 12, "want at least 12 invalid examples, found {}", all.len());
    for (name, body) in all {
        let text = String::from_utf8(body.clone()).unwrap();
        let expected: Vec<&str> =
            text.lines().filter_map(|l| l.strip_prefix("# expect-error:")).map(str::trim).collect();
        assert!(!expected.is_empty(), "{name} has no '# expect-error:' line");
        let problems = match validate_submission(&body, "wf-1") {
            Ok(_) => panic!("{name} should be rejected"),
            Err(problems) => problems,
        };
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        for want in expected {
            assert!(paths.contains(&want), "{name}: expected a problem at {want}, got {problems:#?}");
        }
        for p in &problems {
            assert!(!p.message.is_empty(), "{name}: empty message at {}", p.path);
        }
    }
}
