//! Secrets in task specs (`serve`'s `apiKey`): the accepted workflow, and so every event, view
//! and log line built from it, holds a placeholder; the router puts the value back, read from the
//! stored submission, only into the work order of the task that uses it.

use crate::decode;
use crate::validate::stage_specs;
use serde_json::Value;

/// What an event records in place of a secret.
pub const REDACTED: &str = "(secret: handed only to the task)";

/// The spec fields that hold secrets.
const FIELDS: [&str; 1] = ["apiKey"];

/// Replaces every secret in a merged spec by [`REDACTED`].
pub fn redact(spec: &mut Value) {
    for field in FIELDS {
        if let Some(value) = spec.get_mut(field)
            && value.is_string()
        {
            *value = Value::String(REDACTED.to_owned());
        }
    }
}

/// Whether a spec holds a placeholder the router must fill before dispatch.
pub fn is_redacted(spec: &Value) -> bool {
    FIELDS.iter().any(|field| spec.get(field).and_then(Value::as_str) == Some(REDACTED))
}

/// Puts the secrets of `stage`, as the submitted document `body` gives them, back into `spec`.
pub fn restore(spec: &mut Value, body: &[u8], stage: &str) -> Result<(), String> {
    let mut doc =
        decode::decode(body).map_err(|p| format!("the stored submission no longer decodes: {}", p.message))?;
    if crate::n8n::is_n8n(&doc) {
        doc = crate::n8n::translate(&doc).map_err(|_| "the stored n8n submission no longer translates".to_owned())?;
    }
    let (_, merged) = stage_specs(&doc)
        .into_iter()
        .find(|(name, _)| name == stage)
        .ok_or_else(|| format!("the stored submission has no stage {stage:?}"))?;
    for field in FIELDS {
        if spec.get(field).and_then(Value::as_str) != Some(REDACTED) {
            continue;
        }
        let value = merged
            .get(field)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty() && *v != REDACTED)
            .ok_or_else(|| format!("the stored submission gives stage {stage:?} no {field}"))?;
        spec[field] = Value::String(value.to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate_submission;

    const DOC: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nspec:\n  taskType: serve\n  apiKey: root-key\n  accessMode: proxy\n  model: {source: {type: huggingface, identifier: m}}\n  stages:\n    - {name: a}\n    - {name: b, spec: {apiKey: b-key}}\n";

    #[test]
    fn the_accepted_workflow_holds_placeholders_and_restore_puts_each_stage_s_key_back() {
        let wf = validate_submission(DOC.as_bytes(), "wf-1").expect("valid");
        let text = serde_json::to_string(&wf).unwrap();
        assert!(!text.contains("root-key") && !text.contains("b-key"), "{text}");
        for (stage, key) in [("a", "root-key"), ("b", "b-key")] {
            let mut spec = serde_json::Value::clone(&wf.tasks.iter().find(|t| t.stage == stage).unwrap().spec);
            assert!(is_redacted(&spec));
            restore(&mut spec, DOC.as_bytes(), stage).unwrap();
            assert_eq!(spec["apiKey"], key);
            assert!(!is_redacted(&spec));
        }
    }

    #[test]
    fn restore_fails_clearly_when_the_submission_does_not_give_the_key() {
        let mut spec = serde_json::json!({"apiKey": REDACTED});
        let err = restore(&mut spec, DOC.as_bytes(), "zzz").unwrap_err();
        assert!(err.contains("no stage \"zzz\""), "{err}");
        let other = DOC.replace("  apiKey: root-key\n", "");
        let err = restore(&mut spec, other.as_bytes(), "a").unwrap_err();
        assert!(err.contains("no apiKey"), "{err}");
    }

    #[test]
    fn an_empty_or_non_string_api_key_is_a_validation_error() {
        for bad in ["''", "42"] {
            let doc = DOC.replace("apiKey: root-key", &format!("apiKey: {bad}"));
            let problems = validate_submission(doc.as_bytes(), "wf-1").expect_err("invalid");
            assert!(problems.iter().any(|p| p.path == "/spec/apiKey"), "{bad}: {problems:?}");
            assert!(problems.iter().all(|p| !p.message.contains("b-key")), "{problems:?}");
        }
    }
}
