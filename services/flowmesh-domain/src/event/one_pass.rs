//! Reading an event in one pass when its `type` comes before its body's fields, as every writer
//! of ours puts it (`id`, `time`, `type`, then the body): the type names the body's struct, which
//! then reads the rest of the same map. Anything else (a body field first, a duplicate, an error
//! of any kind) is left to the two-pass reading, which says precisely what is wrong.

use super::{DispatchWithoutOrder, EventBody, Orders};
use serde::de::value::{BorrowedStrDeserializer, MapAccessDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::fmt;

/// `Some(event)` when `text` is an event with its `id` and `time` (if anywhere) and its `type`
/// ahead of every body field; `None` for everything the two-pass reading must look at.
pub(super) fn read(text: &str, orders: Orders) -> Option<super::Event> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let event = deserializer.deserialize_map(Envelope(orders)).ok()?;
    deserializer.end().ok()?;
    Some(event)
}

/// A key of the event's map, borrowed from the text unless it holds an escape.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The envelope: `id` and `time` up to the `type`, then the body.
struct Envelope(Orders);

impl<'de> Visitor<'de> for Envelope {
    type Value = super::Event;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<super::Event, A::Error> {
        let (mut id, mut time) = (None, None);
        let kind = loop {
            let Some(Key(key)) = map.next_key()? else { return Err(de::Error::missing_field("type")) };
            match key.as_ref() {
                "type" => break map.next_value::<Key<'de>>()?.0,
                "id" => take(&mut map, &mut id, "id")?,
                "time" => take(&mut map, &mut time, "time")?,
                _ => return Err(de::Error::custom("a body field before the event's type")),
            }
        };
        let fields = MapAccessDeserializer::new(BodyFields { map, id: &mut id, time: &mut time });
        let body = match (self.0, kind.as_ref()) {
            (Orders::Skip, "task.dispatched") => DispatchWithoutOrder::deserialize(fields).map(Into::into),
            (_, kind) => EventBody::deserialize_as(kind, fields)
                .unwrap_or_else(|| Err(de::Error::custom("an unknown event type"))),
        }?;
        match (id, time) {
            (Some(id), Some(time)) => Ok(super::Event { id, time, body }),
            (None, _) => Err(de::Error::missing_field("id")),
            (_, None) => Err(de::Error::missing_field("time")),
        }
    }
}

/// Reads the value of an envelope field into `slot`, which must be empty.
fn take<'de, A: MapAccess<'de>>(map: &mut A, slot: &mut Option<String>, field: &'static str) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(field));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// The map after the `type`, as the body's struct sees it: without the envelope's fields,
/// which are taken into `id` and `time` on the way.
struct BodyFields<'a, A> {
    map: A,
    id: &'a mut Option<String>,
    time: &'a mut Option<String>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for BodyFields<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(Key(key)) = self.map.next_key()? else { return Ok(None) };
            match key {
                Cow::Borrowed("id") => take(&mut self.map, self.id, "id")?,
                Cow::Borrowed("time") => take(&mut self.map, self.time, "time")?,
                Cow::Borrowed("type") => return Err(de::Error::duplicate_field("type")),
                Cow::Borrowed(key) => return seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some),
                // An escaped key: rare, and never an envelope field of ours.
                Cow::Owned(key) => {
                    if matches!(key.as_str(), "id" | "time" | "type") {
                        return Err(de::Error::custom("an escaped envelope field"));
                    }
                    return seed.deserialize(StringDeserializer::new(key)).map(Some);
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, Orders, TaskRef, TaskStarted};
    use super::*;

    const STARTED: &str = r#""workflow_id":"wf-1","task_id":"wf-1-s","stage":"s","attempt":1,"worker_id":"w1""#;

    fn started() -> Event {
        let task = TaskRef { workflow_id: "wf-1".into(), task_id: "wf-1-s".into(), stage: "s".into(), attempt: 1 };
        let body = EventBody::TaskStarted(TaskStarted { task, worker_id: "w1".into() });
        Event { id: "e1".into(), time: "t".into(), body }
    }

    #[test]
    fn one_pass_reads_the_writers_order_and_leaves_the_rest_to_two() {
        let dispatch = r#""workflow_id":"wf-1","task_id":"wf-1-s","stage":"s","attempt":1,"worker_id":"w1","task_type":"echo","message":"m","order":{"not":"an order"}"#;
        #[rustfmt::skip]
        let table: Vec<(&str, String, Orders, bool)> = vec![
            ("as a writer writes it", format!(r#"{{"id":"e1","time":"t","type":"task.started",{STARTED}}}"#), Orders::Read, true),
            ("the type first, the envelope last", format!(r#"{{"type":"task.started",{STARTED},"time":"t","id":"e1"}}"#), Orders::Read, true),
            ("whitespace around everything", format!(" {{ \"id\" : \"e1\" ,\n\"time\":\"t\", \"type\":\"task.started\", {STARTED} }}\n"), Orders::Read, true),
            ("a field it does not know", format!(r#"{{"id":"e1","time":"t","type":"task.started",{STARTED},"later":[1,{{"a":2}}]}}"#), Orders::Read, true),
            ("a body field before the type", r#"{"id":"e1","time":"t","attempt":1,"type":"task.started","workflow_id":"wf-1","task_id":"wf-1-s","stage":"s","worker_id":"w1"}"#.to_owned(), Orders::Read, false),
            ("the id twice before the type", format!(r#"{{"id":"e1","id":"e1","time":"t","type":"task.started",{STARTED}}}"#), Orders::Read, false),
            ("the id again after the type", format!(r#"{{"id":"e1","time":"t","type":"task.started",{STARTED},"id":"e1"}}"#), Orders::Read, false),
            ("the type again", format!(r#"{{"id":"e1","time":"t","type":"task.started",{STARTED},"type":"task.started"}}"#), Orders::Read, false),
            ("an escaped envelope field after the type", format!(r#"{{"time":"t","type":"task.started",{STARTED},"i\u0064":"e1"}}"#), Orders::Read, false),
            ("no id", format!(r#"{{"time":"t","type":"task.started",{STARTED}}}"#), Orders::Read, false),
            ("no type", r#"{"id":"e1","time":"t"}"#.to_owned(), Orders::Read, false),
            ("an unknown type", format!(r#"{{"id":"e1","time":"t","type":"task.pondered",{STARTED}}}"#), Orders::Read, false),
            ("a type that is no string", format!(r#"{{"id":"e1","time":"t","type":6,{STARTED}}}"#), Orders::Read, false),
            ("a body field missing", r#"{"id":"e1","time":"t","type":"task.started","workflow_id":"wf-1"}"#.to_owned(), Orders::Read, false),
            ("trailing bytes", format!(r#"{{"id":"e1","time":"t","type":"task.started",{STARTED}}} x"#), Orders::Read, false),
            ("an array", r#"["e1","t","task.started"]"#.to_owned(), Orders::Read, false),
            ("a dispatch whose order is no order, read", format!(r#"{{"id":"e1","time":"t","type":"task.dispatched",{dispatch}}}"#), Orders::Read, false),
            ("a dispatch whose order is no order, skipped", format!(r#"{{"id":"e1","time":"t","type":"task.dispatched",{dispatch}}}"#), Orders::Skip, true),
        ];
        for (case, text, orders, in_one_pass) in table {
            let one = read(&text, orders);
            assert_eq!(one.is_some(), in_one_pass, "{case}: {one:?}");
            // Whatever one pass reads, two read the same.
            if let Some(event) = one {
                assert_eq!(Event::from_json_in_two_passes(&text, orders), Ok(event), "{case}");
            }
        }
        let written = serde_json::to_string(&started()).unwrap();
        assert_eq!(read(&written, Orders::Read), Some(started()), "what a writer writes is read in one pass");
    }
}
