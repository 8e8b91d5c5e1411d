//! Cheap identities of the weight files a run reads (`models.<role>.weights`), kept in each
//! checkpoint's `state.json`: a resume whose files changed under the same path (a teacher
//! replaced by another) says so, where the config fingerprint, which covers only the config's
//! text, cannot tell.
//!
//! A stamp is [`content_stamp`]: the file's size and a SHA-256 of its first and last MiB (the
//! safetensors header and the last tensors' bytes), the same on every machine, so two runs'
//! checkpoints stay byte-identical.

use std::collections::BTreeMap;

use crate::config::LoadedConfig;
use crate::io::content_stamp;

/// Stamps of the `weights` whose values a checkpoint does not hold, by role name: a frozen
/// role's and an adapter role's base (a role trained in full gets every value back from the
/// checkpoint, whatever its file holds now).
pub fn role_weight_stamps(loaded: &LoadedConfig) -> BTreeMap<String, String> {
    let roles = loaded.config.models.iter();
    roles
        .filter(|(_, role)| !role.trainable || role.adapter.is_some())
        .filter_map(|(name, role)| {
            let path = loaded.resolve(role.weights.as_ref()?);
            Some((name.clone(), content_stamp(&path, 1 << 20)?))
        })
        .collect()
}

/// The roles whose weights stamp in `now` differs from the checkpoint's `then` (a role the
/// checkpoint has no stamp for is not compared: checkpoints from before stamps).
pub fn changed_weights(
    then: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    let differs = |(name, stamp): (&String, &String)| now.get(name).is_some_and(|s| s != stamp);
    then.iter()
        .filter(|e| differs(*e))
        .map(|(n, _)| n.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_weights_compares_the_roles_both_sides_stamp() {
        let (a, b) = ("1:aa".to_string(), "1:bb".to_string());
        let then = BTreeMap::from([("teacher".to_string(), a.clone()), ("old".into(), a)]);
        let now = BTreeMap::from([("teacher".to_string(), b)]);
        assert_eq!(changed_weights(&then, &now), ["teacher"]);
        assert!(changed_weights(&now, &now).is_empty());
    }
}
