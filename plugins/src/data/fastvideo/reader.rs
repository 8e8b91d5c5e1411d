//! Reading single records of FastVideo's parquet files column by column.
//!
//! Only the columns Reel needs are decoded; rows before the wanted one are skipped with the
//! column readers' `skip_records` (whole pages are skipped without decompressing where the
//! page headers allow), so random access does not decode the whole row group.

use std::fs::File;
use std::path::Path;

use parquet::column::reader::ColumnReader;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::SchemaDescriptor;

/// Names of the columns of FastVideo's text-to-video schema that Reel reads.
pub const REQUIRED_COLUMNS: [&str; 6] = [
    "vae_latent_bytes",
    "vae_latent_shape",
    "vae_latent_dtype",
    "text_embedding_bytes",
    "text_embedding_shape",
    "text_embedding_dtype",
];

/// Leaf-column indices of the columns Reel reads in one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns {
    /// `vae_latent_bytes`, `vae_latent_shape`, `vae_latent_dtype`, `text_embedding_bytes`,
    /// `text_embedding_shape`, `text_embedding_dtype`, in [`REQUIRED_COLUMNS`] order.
    pub required: [usize; 6],
    /// `caption`, when present.
    pub caption: Option<usize>,
}

/// The leaf column whose top-level field is `name` (a list column's leaf is its element).
fn leaf(schema: &SchemaDescriptor, name: &str) -> Option<usize> {
    (0..schema.num_columns()).find(|&i| {
        schema
            .column(i)
            .path()
            .parts()
            .first()
            .is_some_and(|p| p == name)
    })
}

impl Columns {
    /// Locate the columns in `schema`; the error names the missing columns.
    pub fn find(schema: &SchemaDescriptor) -> Result<Self, String> {
        let found: Vec<Option<usize>> = REQUIRED_COLUMNS.iter().map(|n| leaf(schema, n)).collect();
        let missing: Vec<&str> = REQUIRED_COLUMNS
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "missing column(s) {} (expected FastVideo's preprocessed schema with {})",
                missing.join(", "),
                REQUIRED_COLUMNS.join(", ")
            ));
        }
        let mut required = [0usize; 6];
        for (r, f) in required.iter_mut().zip(found) {
            *r = f.expect("checked above");
        }
        Ok(Columns {
            required,
            caption: leaf(schema, "caption"),
        })
    }
}

/// One record's raw values.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecord {
    /// Latent bytes, shape and dtype name.
    pub latent: (Vec<u8>, Vec<i64>, String),
    /// Text-embedding bytes, shape and dtype name.
    pub text: (Vec<u8>, Vec<i64>, String),
    /// Caption (empty when the column is absent or null).
    pub caption: String,
}

/// An open parquet file.
pub struct ParquetFile {
    reader: SerializedFileReader<File>,
}

impl ParquetFile {
    /// Open `path` and parse its footer.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
        let reader = guarded(|| {
            SerializedFileReader::new(file).map_err(|e| format!("not a readable parquet file: {e}"))
        })?;
        Ok(ParquetFile { reader })
    }

    /// The file's schema.
    pub fn schema(&self) -> &SchemaDescriptor {
        self.reader.metadata().file_metadata().schema_descr()
    }

    /// Row count of each row group, checked against the values of its columns that are not
    /// lists (one value per row, null or not): a footer that claims more rows than its
    /// columns hold (a corrupt or foreign writer) is an error naming the row group, not an
    /// index of a trillion rows.
    pub fn row_group_rows(&self) -> Result<Vec<usize>, String> {
        let groups = self.reader.metadata().row_groups().iter().enumerate();
        (groups.map(|(i, rg)| {
            let rows = rg.num_rows();
            let flat = rg
                .columns()
                .iter()
                .filter(|c| c.column_descr().max_rep_level() == 0);
            match flat.into_iter().find(|c| c.num_values() != rows) {
                Some(c) => Err(format!(
                    "row group {i} claims {rows} rows where its column `{}` holds {} values",
                    c.column_path(),
                    c.num_values()
                )),
                None => {
                    usize::try_from(rows).map_err(|_| format!("row group {i} claims {rows} rows"))
                }
            }
        }))
        .collect()
    }

    /// Read row `row` of row group `group`.
    pub fn read(&self, columns: &Columns, group: usize, row: usize) -> Result<RawRecord, String> {
        guarded(|| self.read_unguarded(columns, group, row))
    }

    fn read_unguarded(
        &self,
        columns: &Columns,
        group: usize,
        row: usize,
    ) -> Result<RawRecord, String> {
        let groups = self.reader.metadata().num_row_groups();
        if group >= groups {
            return Err(format!(
                "row group {group} is not there (the file has {groups}): it changed since the \
                 data set was opened"
            ));
        }
        let rg = self
            .reader
            .get_row_group(group)
            .map_err(|e| format!("row group {group}: {e}"))?;
        let column = |i: usize| {
            rg.get_column_reader(i)
                .map_err(|e| format!("column {}: {e}", self.schema().column(i).path()))
        };
        let [lb, ls, ld, tb, ts, td] = columns.required;
        let bytes = |i: usize| read_bytes(column(i)?, row, &self.column_name(i));
        let text = |i: usize| {
            bytes(i).and_then(|b| {
                String::from_utf8(b).map_err(|_| format!("{} is not UTF-8", self.column_name(i)))
            })
        };
        let shape = |i: usize| read_i64_list(column(i)?, row, &self.column_name(i));
        let caption = match columns.caption {
            Some(c) => read_optional_bytes(column(c)?, row, "caption")?
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
            None => String::new(),
        };
        Ok(RawRecord {
            latent: (bytes(lb)?, shape(ls)?, text(ld)?),
            text: (bytes(tb)?, shape(ts)?, text(td)?),
            caption,
        })
    }

    fn column_name(&self, i: usize) -> String {
        self.schema()
            .column(i)
            .path()
            .parts()
            .first()
            .cloned()
            .unwrap_or_default()
    }
}

/// `f`, with a panic of the parquet reader (which some corrupt pages and footers cause) made
/// an error, which the callers name the file and record in.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let why = (payload.downcast_ref::<String>().cloned())
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "no message".into());
        Err(format!("the parquet reader failed on it: {why}"))
    })
}

fn skip(skipped: parquet::errors::Result<usize>, row: usize, name: &str) -> Result<(), String> {
    match skipped {
        Ok(n) if n == row => Ok(()),
        Ok(n) => Err(format!(
            "{name}: only {n} rows before row {row} (truncated column)"
        )),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

/// A byte-array value that may be null.
fn read_optional_bytes(
    reader: ColumnReader,
    row: usize,
    name: &str,
) -> Result<Option<Vec<u8>>, String> {
    let ColumnReader::ByteArrayColumnReader(mut r) = reader else {
        return Err(format!("{name}: expected a binary/string column"));
    };
    skip(r.skip_records(row), row, name)?;
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    let (records, _, _) = r
        .read_records(1, Some(&mut defs), None, &mut values)
        .map_err(|e| format!("{name}: {e}"))?;
    if records != 1 {
        return Err(format!("{name}: row {row} is missing (truncated column)"));
    }
    Ok(values.first().map(|v| v.data().to_vec()))
}

/// A byte-array value that must be present.
fn read_bytes(reader: ColumnReader, row: usize, name: &str) -> Result<Vec<u8>, String> {
    read_optional_bytes(reader, row, name)?.ok_or_else(|| format!("{name} is null"))
}

/// A list of int64 values (a tensor shape).
fn read_i64_list(reader: ColumnReader, row: usize, name: &str) -> Result<Vec<i64>, String> {
    let ColumnReader::Int64ColumnReader(mut r) = reader else {
        return Err(format!("{name}: expected a list of int64"));
    };
    skip(r.skip_records(row), row, name)?;
    let (mut defs, mut reps, mut values) = (Vec::new(), Vec::new(), Vec::new());
    // (records, non-null values, levels)
    let (records, _, levels) = r
        .read_records(1, Some(&mut defs), Some(&mut reps), &mut values)
        .map_err(|e| format!("{name}: {e}"))?;
    if records != 1 {
        return Err(format!("{name}: row {row} is missing (truncated column)"));
    }
    if values.len() != levels && !(values.is_empty() && levels == 1) {
        return Err(format!("{name} holds null elements"));
    }
    if values.is_empty() {
        return Err(format!("{name} is null or empty"));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::data_type::Int64Type;
    use parquet::file::writer::SerializedFileWriter;

    use super::*;

    /// A panic inside the reader becomes an error carrying its message; errors and values
    /// pass through.
    #[test]
    fn a_reader_panic_is_an_error() {
        let err = guarded::<()>(|| panic!("index 9 out of range")).unwrap_err();
        assert_eq!(err, "the parquet reader failed on it: index 9 out of range");
        assert_eq!(guarded(|| Ok::<_, String>(3)), Ok(3));
        assert_eq!(guarded::<()>(|| Err("bad".into())), Err("bad".into()));
    }

    /// A shape list with a null element, a null list and an empty list are each refused
    /// (not read as a shorter shape); a whole list reads back.
    #[test]
    fn shape_lists_with_nulls_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shapes.parquet");
        let message = "message m { optional group vae_latent_shape (LIST) { \
                       repeated group list { optional int64 element; } } }";
        let schema = Arc::new(parquet::schema::parser::parse_message_type(message).unwrap());
        let file = File::create(&path).unwrap();
        let mut w = SerializedFileWriter::new(file, schema, Default::default()).unwrap();
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        // Rows: [4, null, 2, 2], null, [], [4, 2].
        let values = [4i64, 2, 2, 4, 2];
        let defs = [3i16, 2, 3, 3, 0, 1, 3, 3];
        let reps = [0i16, 1, 1, 1, 0, 0, 0, 1];
        col.typed::<Int64Type>()
            .write_batch(&values, Some(&defs), Some(&reps))
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
        w.close().unwrap();

        let reader = SerializedFileReader::try_from(File::open(&path).unwrap()).unwrap();
        let read = |row: usize| {
            let column = reader
                .get_row_group(0)
                .unwrap()
                .get_column_reader(0)
                .unwrap();
            read_i64_list(column, row, "vae_latent_shape")
        };
        assert_eq!(read(0), Err("vae_latent_shape holds null elements".into()));
        assert_eq!(read(1), Err("vae_latent_shape is null or empty".into()));
        assert_eq!(read(2), Err("vae_latent_shape is null or empty".into()));
        assert_eq!(read(3), Ok(vec![4, 2]));
    }
}
