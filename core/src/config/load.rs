//! Loading a run config: read TOML, apply `--set` overrides, deserialize with key paths,
//! validate, and render the resolved config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{ConfigError, RunConfig};
use crate::data::DataSpec;
use crate::model::ModelInfo;

/// A parsed and validated run config with its origin.
#[derive(Debug)]
pub struct LoadedConfig {
    /// The typed config.
    pub config: RunConfig,
    /// The file it came from.
    pub path: PathBuf,
    /// Folder relative paths resolve against (the working directory, see [`base_dir_for`]).
    pub base_dir: PathBuf,
    /// The config after overrides, as TOML (written into the run folder).
    pub resolved_toml: String,
    /// Fingerprint of the parts a checkpoint depends on (`[models]` and `[method]`, less
    /// [`Self::resumable_keys`]): changing `max_steps`, callbacks or logging, or switching
    /// gradient checkpointing on to fit a device, keeps checkpoints resumable.
    pub fingerprint: String,
}

/// Keys of `[runtime]` that each process of a run sets for itself (see
/// [`LoadedConfig::run_digest`]).
const PER_PROCESS_KEYS: [&str; 4] = ["device", "devices", "num_devices", "output_dir"];

impl LoadedConfig {
    /// The dotted keys under `[models]` a resume may change: left out of
    /// [`Self::fingerprint`] (`models.<role>.gradient_checkpointing`, `.max_grad_norm`,
    /// `.optimizer`, and each architecture's own, such as Wan's `.attention`).
    pub fn resumable_keys(&self) -> Vec<String> {
        resumable_keys(&self.config)
    }

    /// Whether a checkpoint stamped `stamp`, whose resolved config (its `config.toml`)
    /// `saved` reads, may be resumed with this config: `stamp` is [`Self::fingerprint`], or
    /// the checkpoint was stamped before resumable keys were left out of fingerprints (its
    /// config hashes to `stamp` with every key counted) and its config less this config's
    /// resumable keys hashes to [`Self::fingerprint`]. `saved` is called only in the second
    /// case.
    pub fn fits_checkpoint(&self, stamp: &str, saved: impl FnOnce() -> String) -> bool {
        if stamp == self.fingerprint {
            return true;
        }
        let saved = saved();
        config_fingerprint(&saved, &[]).is_some_and(|old| old == stamp)
            && config_fingerprint(&saved, &self.resumable_keys())
                .is_some_and(|now| now == self.fingerprint)
    }

    /// SHA-256 of the resolved config without the `[runtime]` keys each process of a
    /// multi-process run may set for itself (`device`, `devices`, `num_devices`,
    /// `output_dir`): the processes of one run must agree on it.
    pub fn run_digest(&self) -> String {
        // The resolved text parses (it was written from a table); were it not to, the text
        // itself is compared.
        let Ok(mut root) = toml::from_str::<toml::Table>(&self.resolved_toml) else {
            return crate::checkpoint::sha256_hex(self.resolved_toml.as_bytes());
        };
        if let Some(runtime) = root.get_mut("runtime").and_then(|v| v.as_table_mut()) {
            for key in PER_PROCESS_KEYS {
                runtime.remove(key);
            }
        }
        crate::checkpoint::sha256_hex(root.to_string().as_bytes())
    }

    /// Resolve a path from the config against [`base_dir`](Self::base_dir).
    pub fn resolve(&self, p: &Path) -> PathBuf {
        self.base_dir.join(p)
    }

    /// Every problem with the files the config names for its roles (architecture configs,
    /// `weights`) and callbacks, checked from headers only: what building the roles and
    /// callbacks would report, without reading tensor data. One error per role or callback
    /// at most, each naming the file and the key (`models.<role>.weights`); empty when all
    /// open.
    pub fn file_problems(&self) -> Vec<ConfigError> {
        let roles = self.config.models.iter().filter_map(|(name, role)| {
            role.model
                .check_files(role, &|p| self.resolve(p))
                .err()
                .map(|e| self.role_error(name, e))
        });
        roles.chain(self.callback_problems()).collect()
    }

    /// Check the files the callbacks will open (a validation VAE, a text encoder), as
    /// [`CallbackConfig::check_files`](crate::callback::CallbackConfig::check_files) does:
    /// `reel train` runs this before its first step. The error names the file and the key
    /// (`callbacks[<i>].vae`).
    pub fn check_callback_files(&self) -> Result<(), ConfigError> {
        self.callback_problems().next().map_or(Ok(()), Err)
    }

    fn callback_problems(&self) -> impl Iterator<Item = ConfigError> + '_ {
        self.config
            .callbacks
            .iter()
            .enumerate()
            .filter_map(|(i, cb)| {
                let checked = cb.check_files(&|p| self.resolve(p));
                checked.err().map(|e| self.callback_error(i, e))
            })
    }

    /// Check the callbacks' models against the data (`spec`), as
    /// [`CallbackConfig::check_data`](crate::callback::CallbackConfig::check_data) does:
    /// `reel train` runs this once the data source is open, before it makes the run folder.
    /// The error names the file and the key (`callbacks[<i>].vae`).
    pub fn check_callback_data(&self, spec: &DataSpec) -> Result<(), ConfigError> {
        self.callback_data_problems(spec).next().map_or(Ok(()), Err)
    }

    fn callback_data_problems<'s>(
        &'s self,
        spec: &'s DataSpec,
    ) -> impl Iterator<Item = ConfigError> + 's {
        self.config
            .callbacks
            .iter()
            .enumerate()
            .filter_map(|(i, cb)| {
                let checked = cb.check_data(spec, &|p| self.resolve(p));
                checked.err().map(|e| self.callback_error(i, e))
            })
    }

    /// An error from callback `i`'s plugin, keyed `callbacks[<i>].<key>` in this config file.
    fn callback_error(&self, i: usize, e: ConfigError) -> ConfigError {
        e.in_section(&format!("callbacks[{i}]")).in_file(&self.path)
    }

    /// A step's data against this machine's memory ([`Self::check_step_memory`], as one
    /// process),
    /// every role whose architecture tells its shape facts from the config alone
    /// ([`ModelConfig::model_info`](crate::model::ModelConfig::model_info)) checked against
    /// the data, then every callback's models ([`Self::check_callback_data`]): what building
    /// the roles and starting the run would report, without building them (no weights are
    /// read). One error per role or callback at most, naming the file and the role
    /// (`models.<role>`) or key (`callbacks[<i>].vae`).
    pub fn model_problems(&self, spec: &DataSpec) -> Vec<ConfigError> {
        let infos = self.model_infos();
        let roles = infos.iter().filter_map(|(name, info)| match info {
            Ok(Some(info)) => info
                .check_data(name, spec)
                .map_err(|e| e.in_file(&self.path))
                .err(),
            Ok(None) => None,
            Err(e) => Some(e.clone()),
        });
        let known = |name: &str| {
            infos
                .get(name)
                .and_then(|i| i.as_ref().ok().copied())
                .flatten()
        };
        let method = (self.config.method.check_models(&known))
            .map_err(|e| e.in_section("method").in_file(&self.path))
            .err();
        let batch = self.check_step_memory(spec, 1).err();
        batch
            .into_iter()
            .chain(roles)
            .chain(method)
            .chain(self.callback_data_problems(spec))
            .collect()
    }

    /// Each role's shape facts by role name, as its architecture tells them from its config
    /// (`Ok(None)`: an architecture that does not); no weights are read. An error names the
    /// file and the role (`models.<role>`).
    pub fn model_infos(&self) -> BTreeMap<&str, Result<Option<ModelInfo>, ConfigError>> {
        (self.config.models.iter())
            .map(|(name, role)| {
                let info = (role.model.model_info(role, &|p| self.resolve(p)))
                    .map_err(|e| self.role_error(name, e));
                (name.as_str(), info)
            })
            .collect()
    }

    /// An error from role `name`'s plugin, keyed `models.<name>.<key>` in this config file.
    fn role_error(&self, name: &str, e: ConfigError) -> ConfigError {
        e.in_section(&format!("models.{name}")).in_file(&self.path)
    }
}

/// Relative paths in a config are resolved against the current working directory, the way
/// users write them on the command line (`weights = "ckpt/..."`).
pub fn base_dir_for(_config_path: &Path) -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

/// Parse a `--set key.path=value` override (`callbacks.0.decay` or `callbacks[0].decay`
/// index arrays). The value is parsed as a TOML value (`3`, `1e-4`,
/// `true`, `[1, 2]`, `"text"`), falling back to a bare string.
pub fn parse_override(spec: &str) -> Result<(Vec<String>, toml::Value), ConfigError> {
    let (key, raw) = spec.split_once('=').ok_or_else(|| {
        ConfigError::new("--set", format!("expected `key.path=value`, got `{spec}`"))
    })?;
    // `callbacks[2].every` (the form errors name keys in) is `callbacks.2.every`.
    let key = key.trim().replace('[', ".").replace(']', "");
    if key.is_empty() || key.split('.').any(|p| p.is_empty()) {
        return Err(ConfigError::new(
            "--set",
            format!("bad key path `{key}` in `{spec}`"),
        ));
    }
    let raw = raw.trim();
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed table has key v"),
        // An array, table, quoted string or number that does not parse is a mistake in the
        // flag, not text: taken as a string, it would be blamed on the config file.
        Err(e) if looks_like_toml(raw) => {
            let why = one_line(e.message());
            return Err(ConfigError::new(
                "--set",
                format!("`{spec}`: `{raw}` is not a TOML value ({why}); quote text as \"...\""),
            ));
        }
        Err(_) => toml::Value::String(raw.to_string()),
    };
    Ok((key.split('.').map(str::to_string).collect(), value))
}

/// Whether an override's value is meant as TOML rather than bare text: an array, a table, a
/// quoted string, or a number (`1e-3`, `-5`, `18446744073709551615`).
fn looks_like_toml(raw: &str) -> bool {
    let number = raw
        .trim_start_matches(['+', '-'])
        .starts_with(|c: char| c.is_ascii_digit())
        && raw
            .chars()
            .all(|c| c.is_ascii_digit() || "+-._eE".contains(c));
    number || raw.starts_with(['[', '{', '"', '\''])
}

/// Apply one override to a TOML tree, creating tables as needed. Numeric parts index arrays
/// (`callbacks.0.decay`).
pub fn apply_override(
    root: &mut toml::Value,
    path: &[String],
    value: toml::Value,
) -> Result<(), ConfigError> {
    let full = path.join(".");
    let mut cur = root;
    for (i, part) in path.iter().enumerate() {
        let last = i + 1 == path.len();
        cur = match cur {
            toml::Value::Table(t) => {
                if last {
                    t.insert(part.clone(), value);
                    return Ok(());
                }
                t.entry(part.clone())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
            }
            toml::Value::Array(a) => {
                let idx: usize = part.parse().map_err(|_| {
                    ConfigError::new(full.clone(), format!("`{part}` must be an array index"))
                })?;
                let len = a.len();
                let slot = a.get_mut(idx).ok_or_else(|| {
                    ConfigError::new(
                        full.clone(),
                        format!(
                            "index {idx} out of range (array has {len} entries; --set changes \
                             entries the file has, new ones go in the file)"
                        ),
                    )
                })?;
                if last {
                    *slot = value;
                    return Ok(());
                }
                slot
            }
            _ => {
                return Err(ConfigError::new(
                    full.clone(),
                    format!(
                        "cannot set below `{}`: it is not a table",
                        path[..i].join(".")
                    ),
                ))
            }
        };
    }
    Ok(())
}

/// Read, override, deserialize and validate a run config file.
pub fn load_run_config(path: &Path, overrides: &[String]) -> Result<LoadedConfig, ConfigError> {
    parse(&read_config(path)?, path, overrides, true)
}

/// Like [`load_run_config`], but a backend that is not compiled into this binary is left to
/// the caller ([`RunConfig::validate_settings`]): `reel check` lists it with the file
/// problems, so a CUDA config can be checked on a CPU build.
pub fn load_run_config_any_backend(
    path: &Path,
    overrides: &[String],
) -> Result<LoadedConfig, ConfigError> {
    parse(&read_config(path)?, path, overrides, false)
}

fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("", format!("cannot read config: {e}")).in_file(path))
}

/// Like [`load_run_config`] on TOML text (`path` is used for messages and relative paths).
pub fn parse_run_config(
    text: &str,
    path: &Path,
    overrides: &[String],
) -> Result<LoadedConfig, ConfigError> {
    parse(text, path, overrides, true)
}

/// Parse, override, deserialize and validate (the backend's presence too when `backend`).
fn parse(
    text: &str,
    path: &Path,
    overrides: &[String],
    backend: bool,
) -> Result<LoadedConfig, ConfigError> {
    let mut root: toml::Value = toml::from_str::<toml::Table>(text)
        .map(toml::Value::Table)
        .map_err(|e| {
            ConfigError::new("", format!("invalid TOML: {}", one_line(&e.to_string())))
                .in_file(path)
        })?;
    for spec in overrides {
        let (keys, value) = parse_override(spec).map_err(|e| e.in_file(path))?;
        apply_override(&mut root, &keys, value).map_err(|e| e.in_file(path))?;
    }
    let config: RunConfig = deserialize(&root).map_err(|(key, msg)| {
        let key = refine_key(&root, &key, &msg);
        let msg = with_kinds(&root, &key, msg);
        ConfigError::new(key, msg).in_file(path)
    })?;
    let valid = if backend {
        config.validate()
    } else {
        config.validate_settings()
    };
    valid.map_err(|e| e.in_file(path))?;
    let resolved_toml = toml::to_string_pretty(&root).unwrap_or_else(|_| text.to_string());
    Ok(LoadedConfig {
        path: path.to_path_buf(),
        base_dir: base_dir_for(path),
        resolved_toml,
        fingerprint: fingerprint(&root, &resumable_keys(&config)),
        config,
    })
}

/// Keys of each role table a resume may change, whatever the architecture: how gradients
/// are computed (checkpointing), clipped, and which optimizer settings apply (as `[optimizer]`
/// may change). Each architecture adds its own ([`crate::model::ModelConfig::resumable_keys`]).
const RESUMABLE_ROLE_KEYS: [&str; 3] = ["gradient_checkpointing", "max_grad_norm", "optimizer"];

/// The dotted keys (`models.<role>.<key>`) of [`RESUMABLE_ROLE_KEYS`] and each role's
/// architecture's resumable keys (see [`LoadedConfig::fingerprint`]).
fn resumable_keys(config: &RunConfig) -> Vec<String> {
    let mut keys = vec![];
    for (name, role) in &config.models {
        let arch = role.model.resumable_keys().iter();
        for key in RESUMABLE_ROLE_KEYS.iter().chain(arch) {
            keys.push(format!("models.{name}.{key}"));
        }
    }
    keys
}

/// The fingerprint of the resolved config `text` (a run's `config.resolved.toml`, a
/// checkpoint's `config.toml`) less the dotted `models.<role>.<key>` keys of `leave_out`
/// ([`LoadedConfig::fingerprint`] leaves out [`LoadedConfig::resumable_keys`]); `None` when
/// the text does not parse.
pub fn config_fingerprint(text: &str, leave_out: &[String]) -> Option<String> {
    let root = toml::from_str::<toml::Table>(text).ok()?;
    Some(fingerprint(&toml::Value::Table(root), leave_out))
}

/// SHA-256 of the `[models]` and `[method]` tables less the dotted `models.<role>.<key>`
/// keys of `leave_out` (see [`LoadedConfig::fingerprint`]).
fn fingerprint(root: &toml::Value, leave_out: &[String]) -> String {
    let mut root = root.clone();
    for key in leave_out {
        let mut parts = key.split('.');
        let (Some("models"), Some(role), Some(k)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let table = (root.get_mut("models")).and_then(|m| m.get_mut(role));
        if let Some(table) = table.and_then(|t| t.as_table_mut()) {
            table.remove(k);
        }
    }
    let pick = |k: &str| {
        root.get(k)
            .and_then(|v| serde_json::to_string(v).ok())
            .unwrap_or_default()
    };
    crate::checkpoint::sha256_hex(
        format!("models={}\nmethod={}", pick("models"), pick("method")).as_bytes(),
    )
}

/// Deserialize with key-path tracking: `Err((dotted key, one-line message))`.
fn deserialize(root: &toml::Value) -> Result<RunConfig, (String, String)> {
    serde_path_to_error::deserialize(root.clone()).map_err(|e| {
        let key = e.path().to_string();
        let key = if key == "." { String::new() } else { key };
        let msg = one_line(&e.into_inner().to_string());
        // Messages end with the tables or fields they are about ("... in `attention` in
        // `models.student`"): drop them from the message, and add a field of the table at the
        // key to the key (an error from inside a table that was deserialized in one piece).
        let (mut key, mut msg) = (key, msg);
        while let Some((head, tail)) = msg.rsplit_once(" in `") {
            let Some(field) = tail.strip_suffix('`').filter(|f| !f.contains('`')) else {
                break;
            };
            if matches!(value_at(root, &key), Some(toml::Value::Table(t)) if t.contains_key(field))
            {
                key = if key.is_empty() {
                    field.to_string()
                } else {
                    format!("{key}.{field}")
                };
            }
            msg = head.to_string();
        }
        (key, msg)
    })
}

/// The value at a serde path like `callbacks[0].adapter` in a TOML tree.
fn value_at<'a>(root: &'a toml::Value, key: &str) -> Option<&'a toml::Value> {
    let mut cur = root;
    for part in key.split('.').filter(|p| !p.is_empty()) {
        let (name, idx) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

/// Plugin tables (`kind = ...`) are buffered by typetag, which loses the path of a field
/// inside them. Find the field: the key whose removal changes the error is the culprit; when
/// its value is a table itself, the search goes on inside it.
fn refine_key(root: &toml::Value, key: &str, msg: &str) -> String {
    refine_in(root, key, key, msg)
}

/// [`refine_key`] in the table at `at` for the error `(raw, msg)` of the whole config.
fn refine_in(root: &toml::Value, raw: &str, at: &str, msg: &str) -> String {
    let Some(toml::Value::Table(table)) = value_at(root, at) else {
        return at.to_string();
    };
    let child = |field: &str| match at {
        "" => field.to_string(),
        _ => format!("{at}.{field}"),
    };
    let join = |field: &str| match table.get(field) {
        Some(toml::Value::Table(_)) => refine_in(root, raw, &child(field), msg),
        _ => child(field),
    };
    // An unknown field is its own key (removing another, required field would change the
    // error too, and be blamed).
    let unknown = msg
        .strip_prefix("unknown field `")
        .and_then(|m| m.split_once('`'));
    if let Some((field, _)) = unknown.filter(|(f, _)| table.contains_key(*f)) {
        return child(field);
    }
    if let Some(field) = missing_here(root, at, table, msg) {
        return child(&field);
    }
    // A field whose removal clears the error, or changes it into another than a missing
    // field, is the culprit; a required field's removal always changes the error (into its
    // own absence), so those are suspects only when no other field is the culprit.
    let mut required = vec![];
    for field in table.keys().filter(|k| k.as_str() != "kind") {
        let mut probe = root.clone();
        if let Some(toml::Value::Table(t)) = value_at_mut(&mut probe, at) {
            t.remove(field);
        }
        match deserialize(&probe) {
            Err((k, m)) if k == raw && m == msg => continue,
            // The same error, its path now tracked further (serde buffers less): that path.
            Err((k, m)) if m == msg && k.starts_with(raw) && k.len() > raw.len() => return k,
            Err((_, m)) if m.starts_with("missing field") => required.push(field),
            _ => return join(field),
        }
    }
    // Of those, the one whose value the message quotes, else the only one.
    let quoted = |f: &&String| table.get(*f).is_some_and(|v| msg.contains(&v.to_string()));
    match required.iter().copied().find(quoted) {
        Some(f) => join(f),
        None if required.len() == 1 => join(required[0]),
        None => at.to_string(),
    }
}

/// The field a "missing field" error `msg` names, when it is missing from the table at `at`
/// itself (a whole `[data]` table left out) rather than from a table inside: giving it an
/// empty value there changes the error into another that is not about an unknown field.
/// `None` for `kind`, which is keyed by its table.
fn missing_here(
    root: &toml::Value,
    at: &str,
    table: &toml::map::Map<String, toml::Value>,
    msg: &str,
) -> Option<String> {
    let field = msg.strip_prefix("missing field `")?.strip_suffix('`')?;
    // A missing `kind` is keyed by its table, with the kinds it could name (`with_kinds`).
    if field == "kind" || table.contains_key(field) {
        return None;
    }
    let mut probe = root.clone();
    let toml::Value::Table(t) = value_at_mut(&mut probe, at)? else {
        return None;
    };
    t.insert(field.to_string(), toml::Value::Table(Default::default()));
    match deserialize(&probe) {
        Err((_, m)) if m == msg || m.starts_with("unknown field") => None,
        _ => Some(field.to_string()),
    }
}

/// A missing `kind` with the kinds the table at `key` could name: they are found by
/// deserializing the config with an empty kind there, which serde answers with the list.
fn with_kinds(root: &toml::Value, key: &str, msg: String) -> String {
    if msg != "missing field `kind`" {
        return msg;
    }
    let mut probe = root.clone();
    let Some(toml::Value::Table(t)) = value_at_mut(&mut probe, key) else {
        return msg;
    };
    t.insert("kind".into(), toml::Value::String(String::new()));
    match deserialize(&probe) {
        Err((_, m)) => match m.split_once("unknown variant ``, expected ") {
            Some((_, kinds)) => {
                let kinds = kinds.strip_prefix("one of ").unwrap_or(kinds);
                format!("{msg}: one of {kinds}")
            }
            None => msg,
        },
        Ok(_) => msg,
    }
}

fn value_at_mut<'a>(root: &'a mut toml::Value, key: &str) -> Option<&'a mut toml::Value> {
    let mut cur = root;
    for part in key.split('.').filter(|p| !p.is_empty()) {
        let (name, idx) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            cur = cur.get_mut(name)?;
        }
        if let Some(i) = idx {
            cur = cur.get_mut(i)?;
        }
    }
    Some(cur)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_parses_types_and_creates_tables() {
        let mut root = toml::Value::Table(Default::default());
        for spec in [
            "a.b=3",
            "a.c=1e-4",
            "a.d=true",
            "a.e=[1, 2]",
            "a.f=hello",
            "a.g=\"q\"",
        ] {
            let (k, v) = parse_override(spec).unwrap();
            apply_override(&mut root, &k, v).unwrap();
        }
        let a = root.get("a").unwrap();
        assert_eq!(a.get("b").unwrap().as_integer(), Some(3));
        assert_eq!(a.get("c").unwrap().as_float(), Some(1e-4));
        assert_eq!(a.get("d").unwrap().as_bool(), Some(true));
        assert_eq!(a.get("e").unwrap().as_array().unwrap().len(), 2);
        assert_eq!(a.get("f").unwrap().as_str(), Some("hello"));
        assert_eq!(a.get("g").unwrap().as_str(), Some("q"));
    }

    #[test]
    fn override_indexes_arrays_and_rejects_bad_paths() {
        let mut root: toml::Value = toml::from_str::<toml::Table>("[[cb]]\nx = 1\n")
            .map(toml::Value::Table)
            .unwrap();
        let (k, v) = parse_override("cb.0.x=5").unwrap();
        apply_override(&mut root, &k, v).unwrap();
        assert_eq!(root["cb"][0]["x"].as_integer(), Some(5));
        let (k, v) = parse_override("cb[0].x=6").unwrap();
        apply_override(&mut root, &k, v).unwrap();
        assert_eq!(root["cb"][0]["x"].as_integer(), Some(6));
        let (k, v) = parse_override("cb.3.x=5").unwrap();
        let err = apply_override(&mut root, &k, v).unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        assert!(parse_override("novalue").is_err());
        assert!(parse_override("a..b=1").is_err());
        // A value meant as TOML that does not parse is the flag's fault, not the file's;
        // bare text (a path starting with a digit too) is a string.
        for bad in ["x=[", "x={a=", "x=18446744073709551615", "x=\"open", "x=1e"] {
            let err = parse_override(bad).unwrap_err().to_string();
            assert!(
                err.contains("--set") && err.contains("not a TOML value"),
                "{bad}: {err}"
            );
        }
        for (text, want) in [
            ("x=runs/a", "runs/a"),
            ("x=1.3B/model.safetensors", "1.3B/model.safetensors"),
        ] {
            assert_eq!(parse_override(text).unwrap().1.as_str(), Some(want));
        }
    }
}
