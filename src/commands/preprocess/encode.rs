//! One clip to one FastVideo row: decode, pick the frames, cover-and-crop them to the
//! target size, encode with the Wan VAE (the posterior mean, not normalised: FastVideo
//! normalises at train time) and the caption with UMT5 (the prompt's own tokens, unpadded).

use anyhow::Context;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use reel_models::umt5::Umt5TextEncoder;
use reel_models::vae::{Tiling, WanVae};
use reel_plugins::data::fastvideo::{FastVideoRecord, MediaInfo, StoredTensor};
use reel_plugins::media::decode::{read_clip, Clip, FrameNeed, MediaKind};
use reel_plugins::media::resize::{cover_and_crop, frame_indices};

use super::inputs::Item;

/// The target shape of every clip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// Frames per video clip (`1 + 4k`; images are one frame).
    pub frames: usize,
    /// Height in pixels (a multiple of the VAE's spatial compression).
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
    /// Frame rate the frames are sampled at (`None`: every frame).
    pub fps: Option<f64>,
    /// Text tokens the prompt is encoded to (Wan: 512).
    pub text_len: usize,
}

/// The models preprocessing runs.
pub struct Encoders<B: Backend> {
    /// The Wan VAE.
    pub vae: WanVae<B>,
    /// Tokenizer and UMT5 encoder.
    pub text: Umt5TextEncoder<B>,
    /// Spatial tiling of the VAE encode, for large frames.
    pub tiling: Option<Tiling>,
    /// The device.
    pub device: B::Device,
}

impl<B: Backend> Encoders<B> {
    /// Preprocess one item into its row (`id` is its index).
    pub fn record(
        &self,
        item: &Item,
        id: usize,
        target: &Target,
    ) -> anyhow::Result<FastVideoRecord> {
        let caption = item.caption.clone().map_err(anyhow::Error::msg)?;
        let clip = read_clip(
            &item.path,
            FrameNeed {
                frames: wanted_frames(item, target),
                fps: target.fps,
            },
        )?;
        let (pixels, frames) = self.fit(&clip, item, target)?;
        let video = Tensor::<B, 5>::from_data(
            TensorData::new(pixels, [1, 3, frames, target.height, target.width]),
            &self.device,
        );
        let posterior = match &self.tiling {
            Some(t) => self.vae.tiled_encode(video, t),
            None => self.vae.encode(video),
        }
        .context("VAE encode")?;
        let latent = posterior.mean.squeeze_dim::<4>(0);
        let (embeds, lengths) = self
            .text
            .encode_prompts(&[caption.as_str()], target.text_len)
            .context("text encode")?;
        let [_, _, d] = embeds.dims();
        let text = embeds.narrow(1, 0, lengths[0]).reshape([lengths[0], d]);
        Ok(FastVideoRecord {
            id: format!("{id:08}"),
            latent: stored(latent)?,
            text_embedding: stored(text)?,
            caption,
            media: Some(media_info(item, frames, target, clip.fps)),
        })
    }

    /// The clip's frames picked and fitted to the target, as `[3, F, H, W]` values in
    /// [-1, 1], with `F`.
    fn fit(&self, clip: &Clip, item: &Item, t: &Target) -> anyhow::Result<(Vec<f32>, usize)> {
        let want = wanted_frames(item, t);
        let src_fps = clip.fps.filter(|_| t.fps.is_some());
        let idx = frame_indices(clip.frames.len(), want, src_fps, t.fps)
            .ok_or_else(|| too_short(clip.frames.len(), want, src_fps, t.fps))?;
        let plane = t.height * t.width;
        let mut out = vec![0f32; 3 * want * plane];
        for (f, &i) in idx.iter().enumerate() {
            let img = cover_and_crop(&clip.frames[i], clip.width, clip.height, t.width, t.height);
            for (p, px) in img.iter().enumerate() {
                for c in 0..3 {
                    out[(c * want + f) * plane + p] = px[c] as f32 / 127.5 - 1.0;
                }
            }
        }
        Ok((out, want))
    }
}

/// Why a clip of `n` frames is too short for `want` frames sampled at `fps` from its own
/// `src_fps`: in frames, and in seconds where the rates are known ("90 frames at 30.00 fps
/// (3.00 s), 81 frames at 16 fps need 151 (5.03 s)").
fn too_short(n: usize, want: usize, src_fps: Option<f64>, fps: Option<f64>) -> anyhow::Error {
    let frames = |k: usize| format!("{k} frame{}", if k == 1 { "" } else { "s" });
    match (src_fps, fps) {
        (Some(src), Some(fps)) => {
            let need = ((want - 1) as f64 * src / fps).floor() as usize + 1;
            anyhow::anyhow!(
                "{} at {src:.2} fps ({:.2} s), {want} frames at {fps} fps need {need} ({:.2} s)",
                frames(n),
                n as f64 / src,
                need as f64 / src
            )
        }
        _ => anyhow::anyhow!("{}, {want} needed", frames(n)),
    }
}

/// The frames an item gives: one for an image, the target's count for a clip.
fn wanted_frames(item: &Item, t: &Target) -> usize {
    match item.kind {
        MediaKind::Image => 1,
        _ => t.frames,
    }
}

/// A float32 tensor as FastVideo stores it.
fn stored<B: Backend, const D: usize>(t: Tensor<B, D>) -> anyhow::Result<StoredTensor> {
    let shape = t.dims();
    let values = t
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading back a tensor: {e:?}"))?;
    Ok(StoredTensor::f32(&values, &shape))
}

fn media_info(item: &Item, frames: usize, t: &Target, fps: Option<f64>) -> MediaInfo {
    let fps = t.fps.or(fps).unwrap_or(0.0);
    MediaInfo {
        file_name: item.name(),
        media_type: item.kind.media_type().into(),
        width: t.width as i64,
        height: t.height as i64,
        num_frames: frames as i64,
        duration_sec: if fps > 0.0 { frames as f64 / fps } else { 0.0 },
        fps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_clip_says_what_it_has_and_needs_in_seconds() {
        let e = too_short(90, 81, Some(30.0), Some(16.0)).to_string();
        assert_eq!(
            e,
            "90 frames at 30.00 fps (3.00 s), 81 frames at 16 fps need 151 (5.03 s)"
        );
        assert_eq!(
            too_short(1, 5, None, Some(16.0)).to_string(),
            "1 frame, 5 needed"
        );
    }
}
