//! Locating the golden fixture sets (made with the real diffusers / transformers; see
//! `tests/fixtures/README.md`) for the parity tests of every crate.
//!
//! A set lives in `tests/fixtures/<name>/` of the repository, so the tests run on any clone.
//! An environment variable points a test run at another set made the same way (for example
//! `REEL_WAN_FIXTURES=/data/wan_small`); the tests derive every shape and count from the
//! files, so any valid set passes.

use std::path::PathBuf;

/// The Wan DiT fixture set: `$REEL_WAN_FIXTURES`, else `tests/fixtures/wan_tiny`.
pub const WAN: FixtureSet = FixtureSet {
    name: "wan_tiny",
    env: "REEL_WAN_FIXTURES",
};
/// The Wan VAE fixture set: `$REEL_VAE_FIXTURES`, else `tests/fixtures/wan_vae_tiny`.
pub const WAN_VAE: FixtureSet = FixtureSet {
    name: "wan_vae_tiny",
    env: "REEL_VAE_FIXTURES",
};
/// The UMT5 encoder fixture set: `$REEL_T5_FIXTURES`, else `tests/fixtures/umt5_tiny`.
pub const UMT5: FixtureSet = FixtureSet {
    name: "umt5_tiny",
    env: "REEL_T5_FIXTURES",
};

/// One fixture set: its folder name under `tests/fixtures/` and the variable overriding it.
#[derive(Debug, Clone, Copy)]
pub struct FixtureSet {
    /// Folder name under the repository's `tests/fixtures/`.
    pub name: &'static str,
    /// Environment variable naming another folder.
    pub env: &'static str,
}

impl FixtureSet {
    /// The folder: the environment variable when set, else the repository's copy.
    pub fn dir(&self) -> PathBuf {
        std::env::var_os(self.env)
            .map(PathBuf::from)
            .unwrap_or_else(|| self.repository_dir())
    }

    /// The repository's copy (`tests/fixtures/<name>`), whatever the environment says.
    pub fn repository_dir(&self) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(self.name)
    }

    /// The folder, checked to hold each of `files`. Panics (the calling test fails) naming the
    /// folder, the missing file and the variable to set.
    pub fn require(&self, files: &[&str]) -> PathBuf {
        let dir = self.dir();
        for f in files {
            assert!(
                dir.join(f).is_file(),
                "golden fixture `{f}` not found in `{}`: set {} to a fixture folder made as \
                 tests/fixtures/README.md describes",
                dir.display(),
                self.env
            );
        }
        dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_holds_every_set() {
        for set in [WAN, WAN_VAE, UMT5] {
            if std::env::var_os(set.env).is_none() {
                set.require(&["config.json", "README.md"]);
            }
        }
    }
}
