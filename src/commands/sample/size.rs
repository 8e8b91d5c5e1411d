//! The size of `reel sample`'s clips when it is not the run's data's: `--latent-size` in
//! latents, `--video-size` in video frames and pixels (turned into latents by the `--vae`'s
//! compression). Checked against the VAE and the roles' models before any weight is loaded.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use reel_core::config::LoadedConfig;
use reel_core::data::DataSpec;
use reel_core::memory;
use reel_core::model::ModelInfo;
use reel_models::vae::WanVaeConfig;

/// Frames, height and width, written `FxHxW` (`81x480x832`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClipSize {
    /// Frames.
    pub frames: usize,
    /// Height.
    pub height: usize,
    /// Width.
    pub width: usize,
}

impl FromStr for ClipSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = "expected FRAMESxHEIGHTxWIDTH, three whole numbers such as 81x480x832";
        let parts: Vec<&str> = s.trim().split(['x', 'X']).collect();
        let [f, h, w] = parts[..] else {
            return Err(format!("`{s}`: {expected}"));
        };
        let number = |text: &str| match text.trim().parse::<usize>() {
            Ok(0) => Err(format!("`{s}`: sizes start at 1, not 0")),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("`{s}`: `{text}` is not a size; {expected}")),
        };
        Ok(Self {
            frames: number(f)?,
            height: number(h)?,
            width: number(w)?,
        })
    }
}

impl fmt::Display for ClipSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.frames, self.height, self.width)
    }
}

/// What a size flag asks for, before it is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeRequest {
    /// `--latent-size`: latent frames, height and width.
    Latent(ClipSize),
    /// `--video-size`: video frames, height and width in pixels.
    Video(ClipSize),
}

impl SizeRequest {
    /// The flag, as the user wrote it.
    fn flag(&self) -> String {
        match self {
            Self::Latent(s) => format!("--latent-size {s}"),
            Self::Video(s) => format!("--video-size {s}"),
        }
    }
}

/// The latent size `request` asks for, from the VAE's compression (`vae`: its `config.json`,
/// needed for `--video-size`), checked against the roles' models (`infos`, from
/// [`model_infos`]): each axis a multiple of the model's patch, and within its position
/// encoding. Errors name the flag and the axis.
pub fn latent_size(
    request: SizeRequest,
    vae: Option<&Path>,
    infos: &[(String, ModelInfo)],
) -> anyhow::Result<ClipSize> {
    let flag = request.flag();
    let latent = match request {
        SizeRequest::Latent(size) => size,
        SizeRequest::Video(size) => {
            let Some(vae) = vae else {
                anyhow::bail!(
                    "{flag}: video sizes are turned into latents by --vae, and none is given"
                );
            };
            let config = WanVaeConfig::of_pretrained(vae)
                .map_err(|e| anyhow::anyhow!("{flag}: --vae {e}"))?;
            let (t, s) = (config.temporal_factor(), config.spatial_factor());
            video_to_latent(size, t, s).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?
        }
    };
    let what = match request {
        SizeRequest::Latent(_) => flag,
        SizeRequest::Video(_) => format!("{flag} ({latent} latents)"),
    };
    let available = memory::host_memory_available();
    for (role, info) in infos {
        fits(info, latent).map_err(|e| anyhow::anyhow!("{what}: the `{role}` model: {e}"))?;
        fits_in_memory(info.in_channels, latent, available)
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    }
    Ok(latent)
}

/// Whether one clip of `channels × size` float32 latents fits in `available` bytes (`None`:
/// unknown, not checked): a mistyped size fails here, before the weights load, not by
/// aborting the process when the noise is drawn. Sampling needs more than this (the model's
/// activations); the check is for sizes that cannot be meant.
pub(super) fn fits_in_memory(
    channels: usize,
    size: ClipSize,
    available: Option<u64>,
) -> Result<(), String> {
    let dims = [channels, size.frames, size.height, size.width];
    let bytes = dims
        .iter()
        .try_fold(4u128, |acc, &n| acc.checked_mul(n as u128));
    let clip = format!("one clip of {channels}x{size} latents");
    match (bytes, available) {
        (None, _) => Err(format!("{clip} has more values than can be counted")),
        (Some(bytes), Some(free)) if bytes > u128::from(free) => Err(format!(
            "{clip} takes {} as float32, more than the {} of memory this machine has available",
            memory::size(bytes),
            memory::size(u128::from(free))
        )),
        _ => Ok(()),
    }
}

/// `spec` with the latent frames, height and width of `size`.
pub fn with_size(spec: DataSpec, size: ClipSize) -> DataSpec {
    DataSpec {
        frames: size.frames,
        height: size.height,
        width: size.width,
        ..spec
    }
}

/// Text tokens per prompt where no data tells them: Wan's pipeline pads each prompt to 512
/// (diffusers' `WanPipeline`, `max_sequence_length`), as `reel preprocess` and `reel data
/// negative` do by default.
pub const PIPELINE_TEXT_LEN: usize = 512;

/// The shapes of clips of `latents` for the roles' models (`infos`), with no data to tell
/// them (an untrained model whose run has no data at hand): the latent channels and text width
/// of the first role whose architecture tells them from its config, [`PIPELINE_TEXT_LEN`]
/// text tokens. `None` when no role tells its shapes.
pub fn stand_in(infos: &[(String, ModelInfo)], latents: ClipSize) -> Option<DataSpec> {
    infos.first().map(|(_, info)| DataSpec {
        channels: info.in_channels,
        frames: latents.frames,
        height: latents.height,
        width: latents.width,
        text_len: PIPELINE_TEXT_LEN,
        text_dim: info.text_dim,
    })
}

/// The latents a VAE compressing time by `t` and space by `s` decodes to `video`: its decoder
/// makes `1 + (F - 1)·t` frames of `H·s × W·s` pixels from `F × H × W` latents, so the video's
/// frames must be one more than a multiple of `t` and its sides multiples of `s`.
fn video_to_latent(video: ClipSize, t: usize, s: usize) -> Result<ClipSize, String> {
    if !(video.frames - 1).is_multiple_of(t) {
        let below = video.frames - 1 - (video.frames - 1) % t + 1;
        let above = below
            .checked_add(t)
            .map(|n| format!(" or {n}"))
            .unwrap_or_default();
        return Err(format!(
            "the VAE decodes 1 + {t}·k frames; {} frames cannot be made: use {below}{above}",
            video.frames
        ));
    }
    for (axis, pixels) in [("height", video.height), ("width", video.width)] {
        if !pixels.is_multiple_of(s) {
            return Err(format!(
                "the {axis} {pixels} is not a multiple of the VAE's spatial compression {s}"
            ));
        }
    }
    Ok(ClipSize {
        frames: 1 + (video.frames - 1) / t,
        height: video.height / s,
        width: video.width / s,
    })
}

/// The shape facts of every role whose architecture tells them from its config.
pub fn model_infos(loaded: &LoadedConfig) -> anyhow::Result<Vec<(String, ModelInfo)>> {
    let infos = loaded.model_infos().into_iter();
    let known =
        infos.filter_map(|(name, info)| info.transpose().map(|i| Ok((name.to_owned(), i?))));
    known.collect()
}

/// Whether a model of `info` can take latents of `size`: each axis a multiple of its patch,
/// and no more patches long than its position encoding covers.
fn fits(info: &ModelInfo, size: ClipSize) -> Result<(), String> {
    let axes = [
        ("frame count", size.frames),
        ("height", size.height),
        ("width", size.width),
    ];
    for (axis, (name, latents)) in axes.into_iter().enumerate() {
        (info.check_extent(axis, latents))
            .map_err(|problem| problem.in_terms_of(&format!("the latent {name} {latents}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(frames: usize, height: usize, width: usize) -> ClipSize {
        ClipSize {
            frames,
            height,
            width,
        }
    }

    #[test]
    fn sizes_parse_as_frames_by_height_by_width() {
        assert_eq!("81x480x832".parse(), Ok(size(81, 480, 832)));
        assert_eq!(" 3X8x16 ".parse(), Ok(size(3, 8, 16)));
        assert_eq!(size(3, 8, 16).to_string(), "3x8x16");
        for bad in ["81x480", "81x480x832x1", "81xax832", "", "81x-1x832"] {
            let err = bad.parse::<ClipSize>().unwrap_err();
            assert!(err.contains("FRAMESxHEIGHTxWIDTH"), "{bad}: {err}");
        }
        let err = "0x8x8".parse::<ClipSize>().unwrap_err();
        assert!(err.contains("start at 1"), "{err}");
    }

    #[test]
    fn a_video_size_becomes_the_latents_its_vae_decodes_to() {
        // Wan2.1's VAE: 4× in time, 8× in space.
        assert_eq!(
            video_to_latent(size(81, 480, 832), 4, 8),
            Ok(size(21, 60, 104))
        );
        assert_eq!(video_to_latent(size(1, 8, 8), 4, 8), Ok(size(1, 1, 1)));
        // Whatever the compression, decoding the latents gives the video back.
        for (t, s) in [(1, 1), (2, 4), (4, 8), (8, 16)] {
            let video = size(1 + 3 * t, 5 * s, 7 * s);
            let l = video_to_latent(video, t, s).unwrap();
            assert_eq!(
                size(1 + (l.frames - 1) * t, l.height * s, l.width * s),
                video
            );
        }
        let err = video_to_latent(size(80, 480, 832), 4, 8).unwrap_err();
        assert!(err.contains("use 77 or 81"), "{err}");
        let err = video_to_latent(size(usize::MAX, 8, 8), 4, 8).unwrap_err();
        assert!(err.contains(&format!("use {}", usize::MAX - 2)), "{err}");
        let err = video_to_latent(size(81, 480, 830), 4, 8).unwrap_err();
        assert!(
            err.contains("width 830") && err.contains("compression 8"),
            "{err}"
        );
    }

    #[test]
    fn a_clip_that_cannot_fit_in_memory_is_refused() {
        // 16 × 2 × 4 × 4 float32 latents: 2 KiB.
        assert_eq!(fits_in_memory(16, size(2, 4, 4), Some(2048)), Ok(()));
        assert_eq!(fits_in_memory(16, size(2, 4, 4), None), Ok(()));
        let err = fits_in_memory(16, size(2, 4, 5), Some(2048)).unwrap_err();
        assert!(
            err.contains("16x2x4x5") && err.contains("more than"),
            "{err}"
        );
        let err = fits_in_memory(usize::MAX, size(usize::MAX, 1, 1), None).unwrap_err();
        assert!(err.contains("than can be counted"), "{err}");
    }

    #[test]
    fn latents_must_tile_the_patch_and_fit_the_position_encoding() {
        let info = ModelInfo {
            in_channels: 4,
            out_channels: 4,
            text_dim: 32,
            patch_size: [1, 2, 4],
            hidden_size: 64,
            num_layers: 2,
            max_grid: Some(8),
        };
        assert_eq!(fits(&info, size(8, 16, 32)), Ok(()));
        let err = fits(&info, size(3, 8, 10)).unwrap_err();
        assert!(
            err.contains("width 10") && err.contains("patch size 4"),
            "{err}"
        );
        let err = fits(&info, size(3, 18, 8)).unwrap_err();
        assert!(
            err.contains("height 18 is 9 patches") && err.contains("at most 16"),
            "{err}"
        );
        let err = fits(&info, size(9, 2, 4)).unwrap_err();
        assert!(err.contains("frame count 9"), "{err}");
        let unlimited = ModelInfo {
            max_grid: None,
            ..info
        };
        assert_eq!(fits(&unlimited, size(1000, 2, 4)), Ok(()));
    }
}
