//! [`ModelInfo`]: the shape facts of a model that methods and data checks need.

use crate::config::ConfigError;
use crate::data::DataSpec;

/// Input/output facts of a diffusion model, independent of its architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelInfo {
    /// Latent channels the model reads.
    pub in_channels: usize,
    /// Latent channels the model predicts.
    pub out_channels: usize,
    /// Width of the text embeddings it takes.
    pub text_dim: usize,
    /// Patch size `[t, h, w]`: frames, height and width must be multiples of it.
    pub patch_size: [usize; 3],
    /// Width of the hidden states [`DiffusionModel::forward_hidden_states`] returns.
    ///
    /// [`DiffusionModel::forward_hidden_states`]: super::DiffusionModel::forward_hidden_states
    pub hidden_size: usize,
    /// Number of blocks whose hidden states can be read (indices `0..num_layers`).
    pub num_layers: usize,
    /// The longest post-patch extent (latent size / patch size) on any axis that the model's
    /// position encoding covers (Wan: `rope_max_seq_len`); `None` when there is no limit.
    pub max_grid: Option<usize>,
}

impl ModelInfo {
    /// Check that role `role`'s model fits the data: it reads and predicts the data's latent
    /// channels, takes text embeddings as wide as the data's, and its patch tiles the clip.
    /// The error's key is the role's table (`models.<role>`), its message names the data key
    /// to change. Roles that all fit the same data therefore agree with each other on
    /// channels and text width.
    pub fn check_data(&self, role: &str, spec: &DataSpec) -> Result<(), ConfigError> {
        let err = |message: String| Err(ConfigError::new(format!("models.{role}"), message));
        if self.in_channels != spec.channels {
            return err(format!(
                "the model takes {} latent channels (in_channels) but the data has {}",
                self.in_channels, spec.channels
            ));
        }
        if self.out_channels != spec.channels {
            return err(format!(
                "the model predicts {} latent channels (out_channels) but the data has {}",
                self.out_channels, spec.channels
            ));
        }
        if self.text_dim != spec.text_dim {
            return err(format!(
                "the model takes text embeddings {} wide (text_dim) but the data's are {} wide",
                self.text_dim, spec.text_dim
            ));
        }
        let axes = [
            ("data.frames", spec.frames),
            ("data.height", spec.height),
            ("data.width", spec.width),
        ];
        for (axis, (key, size)) in axes.into_iter().enumerate() {
            self.check_extent(axis, size).map_err(|problem| {
                ConfigError::new(
                    format!("models.{role}"),
                    problem.in_terms_of(&format!("`{key}` = {size}")),
                )
            })?;
        }
        Ok(())
    }

    /// Check that `size` latents on `axis` (0: frames, 1: height, 2: width) tile the model's
    /// patch on that axis and are no more patches long than its position encoding covers.
    ///
    /// # Panics
    /// If `axis` is not 0, 1 or 2 (a caller's broken invariant).
    pub fn check_extent(&self, axis: usize, size: usize) -> Result<(), ExtentProblem> {
        assert!(
            axis < 3,
            "axis {axis} of a 3-axis (frames, height, width) clip"
        );
        let patch = self.patch_size[axis];
        if patch == 0 || !size.is_multiple_of(patch) {
            return Err(ExtentProblem::NotPatchMultiple {
                patch_size: self.patch_size,
                axis,
            });
        }
        match self.max_grid.filter(|&max| size / patch > max) {
            Some(max) => Err(ExtentProblem::PastPositions {
                patches: size / patch,
                max,
                at_most: max.saturating_mul(patch),
            }),
            None => Ok(()),
        }
    }

    /// Video tokens of a clip of `frames × height × width` latents (one per patch); `None`
    /// when more than a `usize` counts (or a patch size is zero).
    pub fn tokens(&self, frames: usize, height: usize, width: usize) -> Option<usize> {
        let mut axes = [frames, height, width].into_iter().zip(self.patch_size);
        axes.try_fold(1usize, |acc, (size, patch)| {
            acc.checked_mul(size.checked_div(patch)?)
        })
    }
}

/// Why latents of some extent do not fit a model on one axis ([`ModelInfo::check_extent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentProblem {
    /// The extent is not a multiple of the model's patch on that axis.
    NotPatchMultiple {
        /// The model's patch size `[t, h, w]`.
        patch_size: [usize; 3],
        /// The axis checked (0: frames, 1: height, 2: width).
        axis: usize,
    },
    /// The extent is more patches long than the model's position encoding covers.
    PastPositions {
        /// Patches along the axis.
        patches: usize,
        /// Positions the encoding covers (Wan: `rope_max_seq_len`).
        max: usize,
        /// The longest extent in latents that fits.
        at_most: usize,
    },
}

impl ExtentProblem {
    /// The problem as a sentence whose subject is `what` (the extent as the caller names it:
    /// a config key and its value, or a flag's axis).
    pub fn in_terms_of(&self, what: &str) -> String {
        match *self {
            Self::NotPatchMultiple { patch_size, axis } => format!(
                "{what} is not a multiple of the model's patch size {} on that axis \
                 (patch_size {patch_size:?})",
                patch_size[axis]
            ),
            Self::PastPositions {
                patches,
                max,
                at_most,
            } => format!(
                "{what} is {patches} patches long, more than the {max} positions the model's \
                 position encoding covers (rope_max_seq_len); use at most {at_most}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: ModelInfo = ModelInfo {
        in_channels: 4,
        out_channels: 4,
        text_dim: 32,
        patch_size: [4, 2, 2],
        hidden_size: 64,
        num_layers: 2,
        max_grid: None,
    };

    fn check(role: &str, m: &ModelInfo, spec: &DataSpec) -> Result<(), ConfigError> {
        m.check_data(role, spec)
    }

    fn message(r: Result<(), ConfigError>) -> String {
        r.expect_err("should be rejected").to_string()
    }

    #[test]
    fn check_data_accepts_clips_the_patch_tiles() {
        let m = INFO;
        check("student", &m, &DataSpec::for_tests(4, 12, 12)).unwrap();
        check("student", &m, &DataSpec::for_tests(8, 14, 16)).unwrap();
    }

    #[test]
    fn check_data_names_the_data_key_and_role() {
        let m = INFO;
        let e = message(check("student", &m, &DataSpec::for_tests(6, 12, 12)));
        for want in ["`models.student`", "`data.frames` = 6", "patch size 4"] {
            assert!(e.contains(want), "missing {want:?} in: {e}");
        }
        let e = message(check("teacher", &m, &DataSpec::for_tests(4, 13, 12)));
        assert!(
            e.contains("`models.teacher`") && e.contains("`data.height` = 13"),
            "{e}"
        );
        let e = message(check("critic", &m, &DataSpec::for_tests(4, 12, 15)));
        assert!(e.contains("`data.width` = 15"), "{e}");
        let mut s = DataSpec::for_tests(4, 12, 12);
        s.channels = 16;
        let e = message(check("student", &m, &s));
        assert!(
            e.contains("4 latent channels") && e.contains("has 16"),
            "{e}"
        );
        let mut s = DataSpec::for_tests(4, 12, 12);
        s.text_dim = 64;
        let e = message(check("student", &m, &s));
        assert!(e.contains("32 wide") && e.contains("64 wide"), "{e}");
    }

    #[test]
    fn output_channels_must_match_the_data() {
        let info = ModelInfo {
            out_channels: 8,
            ..INFO
        };
        let e = info
            .check_data("critic", &DataSpec::for_tests(4, 12, 12))
            .unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("`models.critic`") && e.contains("out_channels"),
            "{e}"
        );
        INFO.check_data("critic", &DataSpec::for_tests(4, 12, 12))
            .unwrap();
        assert_eq!(INFO.tokens(8, 12, 12), Some(2 * 6 * 6));
        assert_eq!(INFO.tokens(usize::MAX, usize::MAX, 12), None);
    }

    #[test]
    fn clips_longer_than_the_position_encoding_are_rejected() {
        let info = ModelInfo {
            max_grid: Some(6),
            ..INFO
        };
        info.check_data("student", &DataSpec::for_tests(24, 12, 12))
            .unwrap();
        let e = message(check("student", &info, &DataSpec::for_tests(4, 14, 12)));
        for want in [
            "`models.student`",
            "`data.height` = 14",
            "7 patches",
            "at most 12",
        ] {
            assert!(e.contains(want), "missing {want:?} in: {e}");
        }
        let e = message(check("critic", &info, &DataSpec::for_tests(28, 12, 12)));
        assert!(
            e.contains("`data.frames` = 28") && e.contains("at most 24"),
            "{e}"
        );
    }

    #[test]
    fn each_axis_is_checked_against_its_own_patch() {
        let info = ModelInfo {
            patch_size: [1, 2, 4],
            max_grid: Some(5),
            ..INFO
        };
        for (axis, patch) in info.patch_size.into_iter().enumerate() {
            assert_eq!(info.check_extent(axis, 5 * patch), Ok(()));
            assert_eq!(
                info.check_extent(axis, 6 * patch),
                Err(ExtentProblem::PastPositions {
                    patches: 6,
                    max: 5,
                    at_most: 5 * patch
                })
            );
            if patch > 1 {
                let off = info.check_extent(axis, 3 * patch + 1).unwrap_err();
                assert_eq!(
                    off,
                    ExtentProblem::NotPatchMultiple {
                        patch_size: [1, 2, 4],
                        axis
                    }
                );
                let said = off.in_terms_of("the latent size");
                assert!(said.contains(&format!("patch size {patch} on")), "{said}");
            }
        }
        // A zero patch (a broken config) is a refusal, not a division by zero.
        let zero = ModelInfo {
            patch_size: [0, 2, 2],
            ..INFO
        };
        assert!(zero.check_extent(0, 4).is_err());
    }
}
