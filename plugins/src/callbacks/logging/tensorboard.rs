//! TensorBoard event files, written (and read back) without TensorFlow.
//!
//! A file `events.out.tfevents.<unix time>.<host>` is a sequence of TFRecords (see
//! [`tfrecord`](super::tfrecord)). Each record is an `Event` protobuf (TensorFlow's
//! `core/util/event.proto`), encoded with prost; only the fields TensorBoard reads for
//! scalars are declared:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | 1 `wall_time` | double | seconds since the epoch |
//! | 2 `step` | int64 | the global step |
//! | 3 `file_version` | string | `brain.Event:2`, first record only |
//! | 5 `summary` | `Summary` | `repeated Value value = 1`, each `tag = 1`, `simple_value = 2` |
//! | 7 `session_log` | `SessionLog` | `status = 1` (`START = 1`): written on resume |
//!
//! On resume the writer starts a new file with a `SessionLog START` event at the first new
//! step; TensorBoard then drops the older files' events from that step on, so a resumed run
//! shows no duplicated points.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use super::tfrecord::{read_records, tfrecord};

/// `file_version` of the first event of every file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// `SessionLog.SessionStatus.START`.
const SESSION_START: i32 = 1;

/// The wire form of `tensorflow.Event` (the fields Reel writes). `wall_time` and `step` are
/// written even when zero (explicit presence), which readers take as the same values.
#[derive(Clone, PartialEq, Message)]
struct EventProto {
    #[prost(double, optional, tag = "1")]
    wall_time: Option<f64>,
    #[prost(int64, optional, tag = "2")]
    step: Option<i64>,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<SummaryProto>,
    #[prost(message, optional, tag = "7")]
    session_log: Option<SessionLogProto>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
struct SummaryProto {
    #[prost(message, repeated, tag = "1")]
    value: Vec<ValueProto>,
}

/// `tensorflow.Summary.Value` with a `simple_value`.
#[derive(Clone, PartialEq, Message)]
struct ValueProto {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// `tensorflow.SessionLog` (its status).
#[derive(Clone, PartialEq, Message)]
struct SessionLogProto {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// One decoded (or to-be-encoded) `Event`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// Global step.
    pub step: i64,
    /// `file_version` (first event of a file).
    pub file_version: Option<String>,
    /// Scalars `(tag, simple_value)` of the summary.
    pub values: Vec<(String, f32)>,
    /// Whether the event carries a `SessionLog` with status `START`.
    pub session_start: bool,
}

impl Event {
    /// The protobuf encoding of this event.
    pub fn encode(&self) -> Vec<u8> {
        let values = self
            .values
            .iter()
            .map(|(tag, v)| ValueProto {
                tag: tag.clone(),
                simple_value: Some(*v),
            })
            .collect::<Vec<_>>();
        EventProto {
            wall_time: Some(self.wall_time),
            step: Some(self.step),
            file_version: self.file_version.clone(),
            summary: (!values.is_empty()).then_some(SummaryProto { value: values }),
            session_log: self.session_start.then_some(SessionLogProto {
                status: SESSION_START,
            }),
        }
        .encode_to_vec()
    }

    /// Decode an `Event`, skipping fields this module does not know.
    pub fn decode(bytes: &[u8]) -> Result<Event, String> {
        let p = EventProto::decode(bytes).map_err(|e| e.to_string())?;
        let values = p.summary.map(|s| s.value).unwrap_or_default();
        Ok(Event {
            wall_time: p.wall_time.unwrap_or_default(),
            step: p.step.unwrap_or_default(),
            file_version: p.file_version,
            values: values
                .into_iter()
                .filter_map(|v| Some((v.tag, v.simple_value?)))
                .collect(),
            session_start: p.session_log.is_some_and(|l| l.status == SESSION_START),
        })
    }
}

/// Read every event of an event file, checking both CRCs of every record.
pub fn read_events(path: &Path) -> Result<Vec<Event>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_records(&bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .into_iter()
        .map(|(offset, data)| {
            Event::decode(data)
                .map_err(|e| format!("{}: record at byte {offset}: {e}", path.display()))
        })
        .collect()
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// This machine's name for event file names (`reel` when unknown).
fn host_name() -> String {
    let raw = reel_core::console::host_name().unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.' || *c == '_')
        .collect();
    if clean.is_empty() {
        "reel".into()
    } else {
        clean
    }
}

/// Appends events to a new event file.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Create `dir/events.out.tfevents.<unix time>.<host>` (with a `.<n>` suffix when that
    /// name exists) and write the `file_version` event.
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let wall = now();
        let base = format!("events.out.tfevents.{}.{}", wall as u64, host_name());
        let mut path = dir.join(&base);
        let mut n = 1;
        while path.exists() {
            path = dir.join(format!("{base}.{n}"));
            n += 1;
        }
        let mut w = EventWriter {
            out: BufWriter::new(File::create(&path)?),
            path,
        };
        w.write(&Event {
            wall_time: wall,
            file_version: Some(FILE_VERSION.into()),
            ..Event::default()
        })?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Make the events written so far durable (see [`super::jsonl::MetricsLog::sync`]).
    pub fn sync(&self) -> std::io::Result<()> {
        self.out.get_ref().sync_data()
    }

    /// Write one event and flush it (readers see every step at once).
    pub fn write(&mut self, event: &Event) -> std::io::Result<()> {
        self.out.write_all(&tfrecord(&event.encode()))?;
        self.out.flush()
    }

    /// Write scalars `(tag, value)` at `step`, now.
    pub fn scalars(&mut self, step: u64, values: &[(String, f64)]) -> std::io::Result<()> {
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            values: values.iter().map(|(k, v)| (k.clone(), *v as f32)).collect(),
            ..Event::default()
        })
    }

    /// Mark a restart: TensorBoard discards earlier files' events at steps `>= step`.
    pub fn session_start(&mut self, step: u64) -> std::io::Result<()> {
        self.write(&Event {
            wall_time: now(),
            step: step as i64,
            session_start: true,
            ..Event::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        let name = w.path().file_name().unwrap().to_string_lossy().to_string();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        w.scalars(
            1,
            &[("train/loss".into(), 0.5), ("lr/student".into(), 1e-3)],
        )
        .unwrap();
        w.session_start(2).unwrap();
        w.scalars(300, &[("val/overall".into(), 0.875)]).unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
        assert!(events[0].values.is_empty() && events[0].wall_time > 1.6e9);
        assert_eq!(events[1].step, 1);
        assert_eq!(
            events[1].values,
            [
                ("train/loss".to_string(), 0.5),
                ("lr/student".to_string(), 1e-3)
            ]
        );
        assert!(events[2].session_start && events[2].step == 2 && events[2].values.is_empty());
        assert_eq!((events[3].step, events[3].values[0].1), (300, 0.875));
        // A second writer in the same second gets its own file.
        let w2 = EventWriter::create(dir.path()).unwrap();
        assert_ne!(w2.path(), path);
        // Corruption is detected.
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read_events(&path).unwrap_err().contains("CRC"));
    }

    #[test]
    fn encoding_matches_protobuf_wire_format() {
        // step 300 → varint ac 02; a one-value summary; bytes checked by hand.
        let ev = Event {
            wall_time: 0.0,
            step: 300,
            values: vec![("a".into(), 1.0)],
            ..Event::default()
        };
        let bytes = ev.encode();
        let mut want = vec![0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0xac, 0x02];
        want.extend([0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15, 0, 0, 0x80, 0x3f]);
        assert_eq!(bytes, want);
        assert_eq!(Event::decode(&bytes).unwrap(), ev);
        // A resume marker is `session_log` (field 7, length-delimited) with status START.
        let start = Event {
            step: 2,
            session_start: true,
            ..Event::default()
        };
        let bytes = start.encode();
        assert_eq!(&bytes[bytes.len() - 4..], &[0x3a, 2, 0x08, 0x01]);
        assert_eq!(Event::decode(&bytes).unwrap(), start);
    }
}
