#!/usr/bin/env python3
"""PyTorch reference for `reel bench --vae ... / --text-encoder ...`: the same Wan2.1 VAE
decode and encode and UMT5-XXL encoding, timed the same way, with diffusers'
`AutoencoderKLWan` and transformers' `UMT5EncoderModel`, printed as the same rows.

Random weights of the real shapes (timing does not depend on their values), float32 as
FastVideo runs both models for Wan (`vae_precision` and `text_encoder_precisions` fp32), with
PyTorch's defaults: cuDNN convolutions may use TF32 (`torch.backends.cudnn.allow_tf32`),
matrix products do not. The VAE decodes normal latents of the video's latent shape, then
encodes the decoded video (`--vae-op decode` or `encode` times one pass, the encode of a
random video in [-1, 1], as `reel bench` does); `--vae-tile N` tiles both as `reel bench` does
(N-pixel tiles, a stride of 3/4 N rounded down to a multiple of 8).

Usage: bench_encoders.py --device cuda --vae wan2.1 --video 81 480 832 [--vae-tile 256] --json
       bench_encoders.py --device cuda --text-encoder umt5-xxl --text-len 512 --batch 1 --json
Arguments `reel bench` takes and this script does not use (--backend, --dtype...) are refused.
"""
import argparse
import json
import resource
import statistics
import sys
import time

import torch

UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                num_heads=64, feed_forward_proj="gated-gelu")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(args, dev, fn):
    """Milliseconds of each of `--steps` calls after `--warmup` calls, and the last output."""
    out = None
    for _ in range(args.warmup):
        out = fn()
    sync(dev)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        out = fn()
        sync(dev)
        times.append((time.perf_counter() - t0) * 1000)
    stats = dict(mean=statistics.mean(times), median=statistics.median(times),
                 min=min(times), max=max(times))
    return stats, out


def peak_mib(dev):
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def row(op, inp, out, stats, dev, kernels):
    return dict(op=op, input=list(inp), output=list(out), ms=stats, peak_rss_mib=peak_mib(dev),
                kernels=kernels)


def vae_rows(args, dev):
    from diffusers import AutoencoderKLWan

    if args.vae != "wan2.1":
        sys.exit(f"--vae {args.vae}: only `wan2.1` (random weights of the Wan2.1 VAE) is built in")
    f, h, w = args.video
    with torch.device(dev):
        vae = AutoencoderKLWan().eval()  # diffusers' defaults are the Wan2.1 VAE
    s = vae.config.scale_factor_spatial if hasattr(vae.config, "scale_factor_spatial") else 8
    if h % s or w % s:
        sys.exit(f"--video {f} {h} {w}: height and width must be multiples of {s}")
    if args.vae_tile:
        stride = args.vae_tile * 3 // 4 // 8 * 8
        vae.enable_tiling(tile_sample_min_height=args.vae_tile, tile_sample_min_width=args.vae_tile,
                          tile_sample_stride_height=stride, tile_sample_stride_width=stride)
    latent_frames = 1 + (f - 1) // 4
    g = torch.Generator(device=dev).manual_seed(0)
    z = torch.randn(1, vae.config.z_dim, latent_frames, h // s, w // s, generator=g, device=dev)
    kernels = f"torch {torch.__version__}, cudnn tf32 {torch.backends.cudnn.allow_tf32}"
    rows, video = [], None
    with torch.no_grad():
        if args.vae_op != "encode":
            stats, video = timed(args, dev, lambda: vae.decode(z).sample)
            rows.append(row("vae decode", z.shape, video.shape, stats, dev, kernels))
        if args.vae_op != "decode":
            if video is None:  # a random video of the frames the decode would give
                frames = 1 + (latent_frames - 1) * 4
                video = torch.randn(1, 3, frames, h, w, generator=g, device=dev).clamp(-1, 1)
            stats, mean = timed(args, dev, lambda: vae.encode(video).latent_dist.mean)
            rows.append(row("vae encode", video.shape, mean.shape, stats, dev, kernels))
    return rows


def umt5_row(args, dev):
    # Only UMT5 needs `transformers` (bench/gpu.sh checks for it and skips this run without).
    try:
        from transformers import UMT5Config, UMT5EncoderModel
    except ImportError as e:
        sys.exit(f"--text-encoder needs `transformers` for UMT5 ({e})")

    if args.text_encoder != "umt5-xxl":
        sys.exit(f"--text-encoder {args.text_encoder}: only `umt5-xxl` (random weights) is built in")
    with torch.device(dev):
        model = UMT5EncoderModel(UMT5Config(**UMT5_XXL)).eval()
    g = torch.Generator(device=dev).manual_seed(0)
    ids = torch.randint(0, UMT5_XXL["vocab_size"], (args.batch, args.text_len), generator=g,
                        device=dev)
    mask = torch.ones_like(ids)
    kernels = f"torch {torch.__version__}, matmul tf32 {torch.backends.cuda.matmul.allow_tf32}"
    with torch.no_grad():
        stats, out = timed(args, dev, lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state)
    return row("umt5 encode", ids.shape, out.shape, stats, dev, kernels)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--vae")
    p.add_argument("--video", type=int, nargs=3, default=[17, 64, 64], metavar=("F", "H", "W"))
    p.add_argument("--vae-tile", type=int)
    p.add_argument("--vae-op", choices=["both", "decode", "encode"], default="both",
                   help="the decode, then the encode of the decoded video (both), or one pass")
    p.add_argument("--text-encoder")
    p.add_argument("--text-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not (args.vae or args.text_encoder):
        sys.exit("nothing to time: pass --vae and/or --text-encoder")
    dev = torch.device(args.device)
    rows = []
    if args.vae:
        rows += vae_rows(args, dev)
    if args.text_encoder:
        rows.append(umt5_row(args, dev))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'op':<12} {'input':<24} {'output':<24} | {'median ms':>10} {'peak MiB':>9} | kernels")
    for r in rows:
        print(f"{r['op']:<12} {str(r['input']):<24} {str(r['output']):<24} | "
              f"{r['ms']['median']:>10.1f} {r['peak_rss_mib']:>9.0f} | {r['kernels']}")


if __name__ == "__main__":
    main()
