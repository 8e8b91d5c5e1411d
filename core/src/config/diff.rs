//! Where two resolved configs differ: in the tables a checkpoint's fingerprint covers, so that
//! a refused resume can name the key instead of only saying that something differs; and in
//! the settings a resume may change but that make the run differ from an uninterrupted one,
//! so that it can say so.

/// One difference: the dotted key and both values as inline TOML (`absent` where a side
/// lacks the key).
pub type Difference = (String, String, String);

/// The first key under `[models]` or `[method]` (in key order), at or under none of the
/// dotted keys `resumable` (which the fingerprint leaves out), whose value differs between
/// the resolved configs `old` and `new` (TOML texts), with both values. `None` when they
/// agree there, or a text does not parse.
pub fn fingerprint_difference(old: &str, new: &str, resumable: &[String]) -> Option<Difference> {
    let (old, new) = parse_both(old, new)?;
    let mut found = vec![];
    for top in ["models", "method"] {
        differences(old.get(top), new.get(top), top.to_string(), &mut found);
    }
    (found.into_iter()).find(|(key, _, _)| !resumable.iter().any(|r| is_under(key, r)))
}

/// Whether the dotted `key` is `at` or a key inside it.
fn is_under(key: &str, at: &str) -> bool {
    key.strip_prefix(at)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// The settings outside the fingerprint that a resume may change but that change what the
/// steps from there on compute (an uninterrupted run would not): the optimizer, the
/// precision, accumulation, clipping and non-finite policy, the data (its location aside)
/// and the EMA callbacks. Every difference between the resolved configs `old` (the
/// checkpoint's) and `new`, in key order; none when a text does not parse. (`max_steps`,
/// checkpointing and logging change no step.) Both are compared with their defaults filled
/// in where they read as run configs (a default written out is no change), and file
/// locations (`data.path`, `data.negative_embedding`) are not compared: a moved data set
/// is the same data. The `resumable` keys of `[models]` are compared too, but for gradient
/// checkpointing, which gives the same gradients.
pub fn resume_differences(old: &str, new: &str, resumable: &[String]) -> Vec<Difference> {
    let Some((old, new)) = parse_both(old, new) else {
        return vec![];
    };
    let (old, new) = match (with_defaults(&old), with_defaults(&new)) {
        (Some(a), Some(b)) => (a, b),
        _ => (old, new),
    };
    let mut found = vec![];
    let roles =
        (resumable.iter().map(String::as_str)).filter(|k| !k.ends_with(".gradient_checkpointing"));
    let settings = [
        "runtime.dtype",
        "optimizer",
        "training.grad_accumulation",
        "training.max_grad_norm",
        "training.non_finite",
        "data",
    ];
    for key in settings.into_iter().chain(roles) {
        let at = |v: &toml::Value| key.split('.').try_fold(v.clone(), |v, k| v.get(k).cloned());
        differences(at(&old).as_ref(), at(&new).as_ref(), key.into(), &mut found);
    }
    found.retain(|(key, _, _)| !FILE_KEYS.contains(&key.as_str()));
    let emas = |v: &toml::Value| -> Vec<(usize, toml::Value)> {
        let list = v.get("callbacks").and_then(|c| c.as_array()).cloned();
        let is_ema = |c: &toml::Value| c.get("kind").and_then(|k| k.as_str()) == Some("ema");
        (list.unwrap_or_default().into_iter().enumerate())
            .filter(|(_, c)| is_ema(c))
            .collect()
    };
    let (was, now) = (emas(&old), emas(&new));
    for i in 0..was.len().max(now.len()) {
        let index = now.get(i).or(was.get(i)).map_or(i, |(j, _)| *j);
        let (a, b) = (was.get(i).map(|(_, c)| c), now.get(i).map(|(_, c)| c));
        differences(a, b, format!("callbacks[{index}]"), &mut found);
    }
    found
}

/// Keys of file locations, which [`resume_differences`] leaves out.
const FILE_KEYS: [&str; 2] = ["data.path", "data.negative_embedding"];

/// `config` read as a [`super::RunConfig`] and written back: every default filled in.
/// `None` where it does not read as one (a kind not registered in this binary).
fn with_defaults(config: &toml::Value) -> Option<toml::Value> {
    let run: super::RunConfig = config.clone().try_into().ok()?;
    toml::Value::try_from(&run).ok()
}

fn parse_both(old: &str, new: &str) -> Option<(toml::Value, toml::Value)> {
    let old: toml::Value = toml::from_str::<toml::Table>(old).ok()?.into();
    let new: toml::Value = toml::from_str::<toml::Table>(new).ok()?.into();
    Some((old, new))
}

/// Every difference at or below `key`, in key order, appended to `found`.
fn differences(
    a: Option<&toml::Value>,
    b: Option<&toml::Value>,
    key: String,
    found: &mut Vec<Difference>,
) {
    use toml::Value::{Array, Table};
    match (a, b) {
        (Some(Table(x)), Some(Table(y))) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                differences(x.get(k), y.get(k), format!("{key}.{k}"), found);
            }
        }
        (Some(Array(x)), Some(Array(y))) if x.len() == y.len() => {
            for i in 0..x.len() {
                differences(x.get(i), y.get(i), format!("{key}[{i}]"), found);
            }
        }
        _ if a == b => {}
        _ => {
            let show = |v: Option<&toml::Value>| v.map_or("absent".into(), |v| v.to_string());
            found.push((key, show(a), show(b)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_differing_key_with_both_values() {
        let old = "[models.student]\narch = \"wan\"\npreset = \"wan-tiny\"\n[method]\nkind = \"finetune\"\nshift = 3.0\n[training]\nmax_steps = 5\n";
        assert_eq!(fingerprint_difference(old, old, &[]), None);
        let other = old.replace("max_steps = 5", "max_steps = 9");
        assert_eq!(
            fingerprint_difference(old, &other, &[]),
            None,
            "not a fingerprinted table"
        );
        let new = old.replace("shift = 3.0", "shift = 5.0");
        assert_eq!(
            fingerprint_difference(old, &new, &[]),
            Some(("method.shift".into(), "3.0".into(), "5.0".into()))
        );
        let new = old.replace(
            "preset = \"wan-tiny\"",
            "preset = \"wan-tiny\"\ntrainable = true",
        );
        assert_eq!(
            fingerprint_difference(old, &new, &[]),
            Some((
                "models.student.trainable".into(),
                "absent".into(),
                "true".into()
            ))
        );
        let a = "[method]\nsteps = [1, 2]\n";
        let b = "[method]\nsteps = [1, 3]\n";
        assert_eq!(
            fingerprint_difference(a, b, &[]).unwrap().0,
            "method.steps[1]"
        );
        let c = "[method]\nsteps = [1]\n";
        assert_eq!(fingerprint_difference(a, c, &[]).unwrap().0, "method.steps");
        // Resumable keys are passed over, to the first other difference.
        let resumable = ["models.student.attention".to_string()];
        let new = old
            .replace("preset", "attention = \"naive\"\npreset")
            .replace("shift = 3.0", "shift = 5.0");
        assert_eq!(
            fingerprint_difference(old, &new, &resumable).unwrap().0,
            "method.shift"
        );
        assert_eq!(
            fingerprint_difference(old, &new, &[]).unwrap().0,
            "models.student.attention"
        );
        let only = old.replace("preset", "attention = \"naive\"\npreset");
        assert_eq!(fingerprint_difference(old, &only, &resumable), None);
        // A key that only starts like a resumable one is not one.
        let near = ["models.student.attent".to_string()];
        assert!(fingerprint_difference(old, &only, &near).is_some());
    }

    /// Every setting that changes the steps is reported, with both values; what changes no
    /// step (`max_steps`, checkpointing, logging, the data's location) is not.
    #[test]
    fn resume_differences_list_what_changes_the_steps() {
        let old = "[runtime]\nseed = 1\ndtype = \"f32\"\n[data]\nkind = \"x\"\npath = \"a\"\n\
                   batch_size = 2\n[optimizer]\nlr = 0.001\n[training]\nmax_steps = 5\n\
                   keep_last = 3\n[[callbacks]]\nkind = \"logging\"\nevery_steps = 1\n\
                   [[callbacks]]\nkind = \"ema\"\ndecay = 0.9\n";
        assert!(resume_differences(old, old, &[]).is_empty());
        let harmless = old
            .replace("max_steps = 5", "max_steps = 9")
            .replace("keep_last = 3", "keep_last = 1")
            .replace("every_steps = 1", "every_steps = 5")
            .replace("path = \"a\"", "path = \"b\"");
        assert_eq!(resume_differences(old, &harmless, &[]), vec![]);
        let changed = old
            .replace("lr = 0.001", "lr = 0.002")
            .replace("dtype = \"f32\"", "dtype = \"bf16\"")
            .replace("batch_size = 2", "batch_size = 4")
            .replace("decay = 0.9", "decay = 0.99")
            .replace("keep_last = 3", "keep_last = 3\ngrad_accumulation = 2");
        let keys: Vec<(String, String, String)> = resume_differences(old, &changed, &[]);
        let pair = |k: &str, a: &str, b: &str| (k.to_string(), a.to_string(), b.to_string());
        assert_eq!(
            keys,
            vec![
                pair("runtime.dtype", "\"f32\"", "\"bf16\""),
                pair("optimizer.lr", "0.001", "0.002"),
                pair("training.grad_accumulation", "absent", "2"),
                pair("data.batch_size", "2", "4"),
                pair("callbacks[1].decay", "0.9", "0.99"),
            ]
        );
        // A role's resumable keys are reported, but for gradient checkpointing.
        let role = "[models.student]\narch = \"wan\"\nattention = \"naive\"\n";
        let old = format!("{old}{role}");
        let resumable: Vec<String> = ["attention", "gradient_checkpointing", "optimizer"]
            .iter()
            .map(|k| format!("models.student.{k}"))
            .collect();
        let new = old.replace(
            "attention = \"naive\"\n",
            "attention = \"fused\"\ngradient_checkpointing = true\noptimizer = { lr = 0.1 }\n",
        );
        assert_eq!(
            resume_differences(&old, &new, &resumable),
            vec![
                pair("models.student.attention", "\"naive\"", "\"fused\""),
                pair("models.student.optimizer", "absent", "{ lr = 0.1 }"),
            ]
        );
    }
}
