//! TensorBoard event files, written (and read back) without TensorFlow or a protobuf crate.
//!
//! A file `events.out.tfevents.<unix time>.<host>` is a sequence of TFRecords (see
//! [`tfrecord`](super::tfrecord)). Each record is an `Event` protobuf, hand-encoded here with
//! the fields TensorBoard reads:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | 1 `wall_time` | double | seconds since the epoch |
//! | 2 `step` | int64 | the global step |
//! | 3 `file_version` | string | `brain.Event:2`, first record only |
//! | 5 `summary` | message | `repeated Value value = 1` with `tag = 1` (string) and `simple_value = 2` (float) |
//! | 6 `session_log` | message | `status = 1` (enum, `START = 1`): written on resume |
//!
//! On resume the writer starts a new file with a `SessionLog START` event at the first new
//! step; TensorBoard then drops the older files' events from that step on, so a resumed run
//! shows no duplicated points.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::tfrecord::{read_records, tfrecord};

/// `file_version` of the first event of every file.
pub const FILE_VERSION: &str = "brain.Event:2";

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_delimited(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, ((field << 3) | 2) as u64);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
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
        let mut out = Vec::new();
        out.push(0x09); // field 1, 64-bit
        out.extend_from_slice(&self.wall_time.to_le_bytes());
        out.push(0x10); // field 2, varint
        varint(&mut out, self.step as u64);
        if let Some(v) = &self.file_version {
            len_delimited(&mut out, 3, v.as_bytes());
        }
        if !self.values.is_empty() {
            let mut summary = Vec::new();
            for (tag, value) in &self.values {
                let mut v = Vec::new();
                len_delimited(&mut v, 1, tag.as_bytes());
                v.push(0x15); // field 2, 32-bit
                v.extend_from_slice(&value.to_le_bytes());
                len_delimited(&mut summary, 1, &v);
            }
            len_delimited(&mut out, 5, &summary);
        }
        if self.session_start {
            len_delimited(&mut out, 6, &[0x08, 0x01]);
        }
        out
    }

    /// Decode an `Event`, skipping fields this module does not know.
    pub fn decode(bytes: &[u8]) -> Result<Event, String> {
        let mut ev = Event::default();
        for (field, value) in fields(bytes)? {
            match (field, value) {
                (1, Wire::Fixed64(b)) => ev.wall_time = f64::from_le_bytes(b),
                (2, Wire::Varint(v)) => ev.step = v as i64,
                (3, Wire::Bytes(b)) => {
                    ev.file_version = Some(String::from_utf8_lossy(b).into_owned())
                }
                (5, Wire::Bytes(summary)) => {
                    for (f, v) in fields(summary)? {
                        if let (1, Wire::Bytes(value)) = (f, v) {
                            let (mut tag, mut simple) = (String::new(), None);
                            for (vf, vv) in fields(value)? {
                                match (vf, vv) {
                                    (1, Wire::Bytes(t)) => {
                                        tag = String::from_utf8_lossy(t).into_owned()
                                    }
                                    (2, Wire::Fixed32(b)) => simple = Some(f32::from_le_bytes(b)),
                                    _ => {}
                                }
                            }
                            if let Some(s) = simple {
                                ev.values.push((tag, s));
                            }
                        }
                    }
                }
                (6, Wire::Bytes(log)) => {
                    ev.session_start = fields(log)?
                        .into_iter()
                        .any(|(f, v)| matches!((f, v), (1, Wire::Varint(1))));
                }
                _ => {}
            }
        }
        Ok(ev)
    }
}

enum Wire<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// Split a protobuf message into `(field number, value)` pairs.
fn fields(mut b: &[u8]) -> Result<Vec<(u32, Wire<'_>)>, String> {
    fn read_varint(b: &mut &[u8]) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first().ok_or("truncated varint")?;
            *b = rest;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err(format!("truncated field: need {n} bytes, have {}", b.len()));
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = read_varint(&mut b)?;
        let field = (key >> 3) as u32;
        let value = match key & 7 {
            0 => Wire::Varint(read_varint(&mut b)?),
            1 => Wire::Fixed64(take(&mut b, 8)?.try_into().expect("8 bytes")),
            2 => {
                let n = read_varint(&mut b)? as usize;
                Wire::Bytes(take(&mut b, n)?)
            }
            5 => Wire::Fixed32(take(&mut b, 4)?.try_into().expect("4 bytes")),
            w => return Err(format!("field {field}: unsupported wire type {w}")),
        };
        out.push((field, value));
    }
    Ok(out)
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
    let raw = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
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
    }
}
