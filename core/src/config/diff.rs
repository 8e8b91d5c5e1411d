//! Where two resolved configs differ in the tables a checkpoint's fingerprint covers, so that a
//! refused resume can name the key instead of only saying that something differs.

/// The first key under `[models]` or `[method]` (in key order) whose value differs between
/// the resolved configs `old` and `new` (TOML texts), with both values as inline TOML
/// (`absent` where a side lacks the key). `None` when they agree there, or a text does not
/// parse.
pub fn fingerprint_difference(old: &str, new: &str) -> Option<(String, String, String)> {
    let old: toml::Value = toml::from_str::<toml::Table>(old).ok()?.into();
    let new: toml::Value = toml::from_str::<toml::Table>(new).ok()?.into();
    ["models", "method"]
        .into_iter()
        .find_map(|top| difference(old.get(top), new.get(top), top.to_string()))
}

/// The first difference at or below `key`.
fn difference(
    a: Option<&toml::Value>,
    b: Option<&toml::Value>,
    key: String,
) -> Option<(String, String, String)> {
    use toml::Value::{Array, Table};
    match (a, b) {
        (Some(Table(x)), Some(Table(y))) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .find_map(|k| difference(x.get(k), y.get(k), format!("{key}.{k}")))
        }
        (Some(Array(x)), Some(Array(y))) if x.len() == y.len() => {
            (0..x.len()).find_map(|i| difference(x.get(i), y.get(i), format!("{key}[{i}]")))
        }
        _ if a == b => None,
        _ => {
            let show = |v: Option<&toml::Value>| v.map_or("absent".into(), |v| v.to_string());
            Some((key, show(a), show(b)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_differing_key_with_both_values() {
        let old = "[models.student]\narch = \"wan\"\npreset = \"wan-tiny\"\n[method]\nkind = \"finetune\"\nshift = 3.0\n[training]\nmax_steps = 5\n";
        assert_eq!(fingerprint_difference(old, old), None);
        let other = old.replace("max_steps = 5", "max_steps = 9");
        assert_eq!(
            fingerprint_difference(old, &other),
            None,
            "not a fingerprinted table"
        );
        let new = old.replace("shift = 3.0", "shift = 5.0");
        assert_eq!(
            fingerprint_difference(old, &new),
            Some(("method.shift".into(), "3.0".into(), "5.0".into()))
        );
        let new = old.replace(
            "preset = \"wan-tiny\"",
            "preset = \"wan-tiny\"\ntrainable = true",
        );
        assert_eq!(
            fingerprint_difference(old, &new),
            Some((
                "models.student.trainable".into(),
                "absent".into(),
                "true".into()
            ))
        );
        let a = "[method]\nsteps = [1, 2]\n";
        let b = "[method]\nsteps = [1, 3]\n";
        assert_eq!(fingerprint_difference(a, b).unwrap().0, "method.steps[1]");
        let c = "[method]\nsteps = [1]\n";
        assert_eq!(fingerprint_difference(a, c).unwrap().0, "method.steps");
    }
}
