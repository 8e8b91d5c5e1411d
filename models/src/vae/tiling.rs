//! Spatially tiled encode and decode, so that large frames fit in memory.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py`, `AutoencoderKLWan.tiled_encode`,
//! `tiled_decode`, `blend_v`, `blend_h` and `enable_tiling` (defaults: tiles of 256x256
//! pixels every 192 pixels). Each tile runs the whole causal chunk schedule with its own
//! feature cache; a tile's top / left overlap is then blended linearly with the (already
//! blended) tile above / to the left, every tile is cropped to the stride and the pieces
//! are concatenated. The blending makes the result differ from the untiled one near tile
//! seams; a tile that covers the whole frame gives exactly the untiled result.

use burn::tensor::{backend::Backend, Tensor};

use super::cache::FeatCache;
use super::model::{Posterior, VaeError, WanVae};

/// Tile sizes and strides in pixels (diffusers' `tile_sample_*` attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiling {
    /// Tile height in pixels.
    pub tile_sample_min_height: usize,
    /// Tile width in pixels.
    pub tile_sample_min_width: usize,
    /// Vertical distance between tiles in pixels (overlap = height - stride).
    pub tile_sample_stride_height: usize,
    /// Horizontal distance between tiles in pixels.
    pub tile_sample_stride_width: usize,
}

impl Default for Tiling {
    /// diffusers' defaults: 256x256 tiles every 192 pixels.
    fn default() -> Self {
        Self {
            tile_sample_min_height: 256,
            tile_sample_min_width: 256,
            tile_sample_stride_height: 192,
            tile_sample_stride_width: 192,
        }
    }
}

impl Tiling {
    /// Square tiles of `size` pixels every `stride` pixels.
    pub fn square(size: usize, stride: usize) -> Self {
        Self {
            tile_sample_min_height: size,
            tile_sample_min_width: size,
            tile_sample_stride_height: stride,
            tile_sample_stride_width: stride,
        }
    }

    /// Square tiles of `size` pixels overlapping by about a quarter, for a VAE whose spatial
    /// compression is `s` ([`WanVaeConfig::spatial_factor`](super::WanVaeConfig::spatial_factor)):
    /// the stride is `3/4` of the size rounded down to a multiple of `s`. The `vae_tile` /
    /// `--tile` setting; `size` must be a multiple of `s`, at least `2·s` (tiles that overlap).
    pub fn overlapping(size: usize, s: usize) -> Result<Self, VaeError> {
        if s == 0 || size < 2 * s || !size.is_multiple_of(s) {
            return Err(VaeError::Input(format!(
                "tiles of {size} pixels: expected a multiple of the VAE's spatial compression \
                 {s}, at least {}",
                2 * s
            )));
        }
        Ok(Self::square(size, size * 3 / 4 / s * s))
    }

    /// `(size, stride)` per axis (height, width), checked against the compression `s`:
    /// positive multiples of `s` with `stride <= size`.
    fn axes(&self, s: usize) -> Result<[(usize, usize); 2], VaeError> {
        let axes = [
            (self.tile_sample_min_height, self.tile_sample_stride_height),
            (self.tile_sample_min_width, self.tile_sample_stride_width),
        ];
        for (size, stride) in axes {
            if stride == 0 || stride > size || size % s != 0 || stride % s != 0 {
                return Err(VaeError::Input(format!(
                    "tiling {self:?}: sizes and strides must be positive multiples of the \
                     spatial compression {s}, each stride at most its size"
                )));
            }
        }
        Ok(axes)
    }
}

/// `b` with its first `extent` rows (`dim` 3) or columns (`dim` 4) blended from the last
/// ones of `a`: `a[-extent + y] * (1 - y / extent) + b[y] * (y / extent)`.
pub fn blend<B: Backend>(
    a: &Tensor<B, 5>,
    b: Tensor<B, 5>,
    extent: usize,
    dim: usize,
) -> Tensor<B, 5> {
    let (na, nb) = (a.dims()[dim], b.dims()[dim]);
    let extent = extent.min(na).min(nb);
    if extent == 0 {
        return b;
    }
    // Weights as diffusers forms them: `y / extent` and `1 - y / extent` in double, each
    // then applied in float32.
    let mut shape = [1; 5];
    shape[dim] = extent;
    let weights = |f: fn(f64) -> f64| {
        let w: Vec<f32> = (0..extent)
            .map(|y| f(y as f64 / extent as f64) as f32)
            .collect();
        Tensor::<B, 1>::from_floats(w.as_slice(), &b.device()).reshape(shape)
    };
    let head = a.clone().narrow(dim, na - extent, extent) * weights(|r| 1.0 - r)
        + b.clone().narrow(dim, 0, extent) * weights(|r| r);
    if extent == nb {
        return head;
    }
    Tensor::cat(vec![head, b.narrow(dim, extent, nb - extent)], dim)
}

/// Blend a grid of overlapping tiles (row-major) as diffusers does, crop each to `stride`
/// and the result to `size` (both `[height, width]`).
fn stitch<B: Backend>(
    rows: Vec<Vec<Tensor<B, 5>>>,
    overlap: [usize; 2],
    stride: [usize; 2],
    size: [usize; 2],
) -> Tensor<B, 5> {
    let mut blended: Vec<Vec<Tensor<B, 5>>> = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let mut out: Vec<Tensor<B, 5>> = Vec::with_capacity(row.len());
        for (j, mut tile) in row.into_iter().enumerate() {
            if i > 0 {
                tile = blend(&blended[i - 1][j], tile, overlap[0], 3);
            }
            if j > 0 {
                tile = blend(&out[j - 1], tile, overlap[1], 4);
            }
            out.push(tile);
        }
        blended.push(out);
    }
    let crop = |t: Tensor<B, 5>, dim: usize, n: usize| {
        let have = t.dims()[dim];
        t.narrow(dim, 0, n.min(have))
    };
    let rows = blended
        .into_iter()
        .map(|row| {
            let pieces = row
                .into_iter()
                .map(|t| crop(crop(t, 3, stride[0]), 4, stride[1]))
                .collect();
            Tensor::cat(pieces, 4)
        })
        .collect();
    crop(crop(Tensor::cat(rows, 3), 3, size[0]), 4, size[1])
}

/// The tiles `[start, len]` along an axis of `n` with tile `size` and `stride`.
fn spans(n: usize, size: usize, stride: usize) -> Vec<(usize, usize)> {
    (0..n)
        .step_by(stride)
        .map(|i| (i, size.min(n - i)))
        .collect()
}

impl<B: Backend> WanVae<B> {
    /// [`WanVae::encode`] tile by tile (diffusers `tiled_encode`); each tile must be at
    /// least the spatial compression in size.
    pub fn tiled_encode(
        &self,
        video: Tensor<B, 5>,
        tiling: &Tiling,
    ) -> Result<Posterior<B>, VaeError> {
        self.check_video(&video)?;
        let s = self.config.spatial_factor();
        let [(th, sh), (tw, sw)] = tiling.axes(s)?;
        let [_, _, _, h, w] = video.dims();
        let mut rows = Vec::new();
        for (i, hi) in spans(h, th, sh) {
            let mut row = Vec::new();
            for (j, wj) in spans(w, tw, sw) {
                let tile = video.clone().narrow(3, i, hi).narrow(4, j, wj);
                self.check_video(&tile)?;
                row.push(self.encode_moments(tile, &mut FeatCache::new()));
            }
            rows.push(row);
        }
        let moments = stitch(
            rows,
            [(th - sh) / s, (tw - sw) / s],
            [sh / s, sw / s],
            [h / s, w / s],
        );
        Ok(Posterior::from_moments(moments))
    }

    /// [`WanVae::decode`] tile by tile (diffusers `tiled_decode`), clamped to [-1, 1].
    pub fn tiled_decode(&self, z: Tensor<B, 5>, tiling: &Tiling) -> Result<Tensor<B, 5>, VaeError> {
        self.check_latents(&z)?;
        let s = self.config.spatial_factor();
        let [(th, sh), (tw, sw)] = tiling.axes(s)?;
        let [_, _, _, h, w] = z.dims();
        let mut rows = Vec::new();
        for (i, hi) in spans(h, th / s, sh / s) {
            let row = spans(w, tw / s, sw / s)
                .into_iter()
                .map(|(j, wj)| {
                    let tile = z.clone().narrow(3, i, hi).narrow(4, j, wj);
                    self.decode_raw(tile, &mut FeatCache::new())
                })
                .collect();
            rows.push(row);
        }
        let video = stitch(rows, [th - sh, tw - sw], [sh, sw], [h * s, w * s]);
        Ok(video.clamp(-1.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray;

    #[test]
    fn blend_mixes_the_overlap_linearly() {
        let dev = Default::default();
        let a = Tensor::<TestBackend, 5>::ones([1, 1, 1, 4, 2], &dev);
        let b = Tensor::<TestBackend, 5>::zeros([1, 1, 1, 3, 2], &dev);
        let rows = blend(&a, b, 2, 3).into_data().to_vec::<f32>().unwrap();
        // Rows 0 and 1 take (1 - 0/2) and (1 - 1/2) of `a`; row 2 is untouched.
        assert_eq!(rows, vec![1.0, 1.0, 0.5, 0.5, 0.0, 0.0]);
    }

    #[test]
    fn spans_cover_the_axis_like_python_slices() {
        assert_eq!(spans(32, 16, 8), vec![(0, 16), (8, 16), (16, 16), (24, 8)]);
        assert_eq!(spans(4, 8, 8), vec![(0, 4)]);
    }

    #[test]
    fn tilings_must_fit_the_compression() {
        assert!(Tiling::default().axes(8).is_ok());
        assert!(Tiling::square(16, 12).axes(8).is_err());
        assert!(Tiling::square(16, 24).axes(8).is_err());
        assert!(Tiling::square(16, 0).axes(8).is_err());
    }

    #[test]
    fn overlapping_tiles_follow_the_vaes_compression() {
        // Wan2.1's 8: 256-pixel tiles every 192 (diffusers' default).
        assert_eq!(Tiling::overlapping(256, 8).unwrap(), Tiling::default());
        // A VAE of 3 levels compresses 4x: 12-pixel tiles are fine there, every 8 pixels.
        assert_eq!(Tiling::overlapping(12, 4).unwrap(), Tiling::square(12, 8));
        // 16x: the stride rounds down to a multiple of 16.
        assert_eq!(Tiling::overlapping(80, 16).unwrap(), Tiling::square(80, 48));
        for s in [4, 8, 16] {
            let t = Tiling::overlapping(2 * s, s).unwrap();
            assert_eq!(t.tile_sample_stride_height, s, "2·{s} pixels step by {s}");
            assert!(t.axes(s).is_ok());
        }
        for (size, s) in [(24, 16), (8, 8), (12, 8), (16, 0)] {
            let e = Tiling::overlapping(size, s).unwrap_err().to_string();
            assert!(e.contains(&format!("tiles of {size} pixels")), "{e}");
        }
    }
}
