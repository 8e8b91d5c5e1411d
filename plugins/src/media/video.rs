//! Latents people can look at: the Wan VAE decodes a generated latent clip to RGB frames,
//! written as a GIF and, when the `ffmpeg` binary is installed
//! (`scripts/install-ffmpeg.sh`), as an H.264 MP4.

use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use reel_core::data::DataSpec;
use reel_models::vae::{Tiling, VaeError, WanVae};

pub use super::ffmpeg::write_mp4;

/// A decoded clip: `frames` of `width × height` RGB pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Frames {
    /// The frames, in order.
    pub frames: Vec<Vec<[u8; 3]>>,
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
}

/// The Wan VAE as a latent-to-video decoder.
#[derive(Debug)]
pub struct VideoDecoder<B: Backend> {
    /// The VAE.
    pub vae: WanVae<B>,
    /// Undo the `latents_mean` / `latents_std` normalisation first (the form FastVideo
    /// data and the DiT use); `false` for raw posterior latents.
    pub denormalize: bool,
    /// Decode in spatial tiles (large frames on small GPUs).
    pub tiling: Option<Tiling>,
    /// The device the VAE lives on.
    pub device: B::Device,
}

impl<B: Backend> VideoDecoder<B> {
    /// Load a diffusers `vae/` folder onto `device`.
    pub fn load(path: &Path, device: &B::Device, denormalize: bool) -> Result<Self, VaeError> {
        Ok(Self {
            vae: WanVae::load(path, device)?,
            denormalize,
            tiling: None,
            device: device.clone(),
        })
    }

    /// Decode one latent clip `[C, F, H, W]` (row-major `latents`, shape from `spec`) to
    /// RGB frames: `1 + 4·(F − 1)` frames of `8·H × 8·W` pixels for the Wan2.1 VAE.
    pub fn decode(&self, latents: &[f32], spec: &DataSpec) -> Result<Frames, VaeError> {
        let device = &self.device;
        let dims = [1, spec.channels, spec.frames, spec.height, spec.width];
        let z = Tensor::<B, 5>::from_data(TensorData::new(latents.to_vec(), dims), device);
        let z = if self.denormalize {
            self.vae.denormalize_latents(z)?
        } else {
            z
        };
        let video = match &self.tiling {
            Some(t) => self.vae.tiled_decode(z, t)?,
            None => self.vae.decode(z)?,
        };
        let [_, _, f, h, w] = video.dims();
        let values = video
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .map_err(|e| VaeError::Input(format!("reading back the decoded clip: {e:?}")))?;
        Ok(Frames {
            frames: to_rgb(&values, f, h, w),
            width: w,
            height: h,
        })
    }
}

/// `[3, F, H, W]` values in [-1, 1] to `F` RGB frames.
pub fn to_rgb(values: &[f32], f: usize, h: usize, w: usize) -> Vec<Vec<[u8; 3]>> {
    let plane = h * w;
    let byte = |v: f32| ((v.clamp(-1.0, 1.0) + 1.0) * 127.5).round() as u8;
    (0..f)
        .map(|t| {
            (0..plane)
                .map(|p| [0, 1, 2].map(|c| byte(values[(c * f + t) * plane + p])))
                .collect()
        })
        .collect()
}

/// At most `n` frames of a clip, evenly spaced, first and last included.
pub fn pick_frames(frames: &[Vec<[u8; 3]>], n: usize) -> Vec<Vec<[u8; 3]>> {
    if frames.len() <= n || n < 2 {
        return frames.iter().take(n.max(1)).cloned().collect();
    }
    (0..n)
        .map(|i| frames[i * (frames.len() - 1) / (n - 1)].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_map_to_bytes_per_channel_and_frame() {
        // [3, 2, 1, 2]: channel c, frame t, pixel p.
        let v: Vec<f32> = vec![
            -1.0, 1.0, 0.0, 0.5, 1.0, -1.0, -0.5, 2.0, 0.0, 0.0, 1.0, -3.0,
        ];
        let rgb = to_rgb(&v, 2, 1, 2);
        assert_eq!(rgb[0], [[0, 255, 128], [255, 0, 128]]);
        assert_eq!(rgb[1], [[128, 64, 255], [191, 255, 0]]);
    }

    #[test]
    fn pick_frames_spreads_evenly() {
        let frames: Vec<Vec<[u8; 3]>> = (0..9u8).map(|i| vec![[i; 3]]).collect();
        let firsts = |f: Vec<Vec<[u8; 3]>>| f.iter().map(|x| x[0][0]).collect::<Vec<_>>();
        assert_eq!(firsts(pick_frames(&frames, 3)), [0, 4, 8]);
        assert_eq!(firsts(pick_frames(&frames, 20)).len(), 9);
        assert_eq!(firsts(pick_frames(&frames, 1)), [0]);
    }
}
