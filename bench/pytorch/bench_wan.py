#!/usr/bin/env python3
"""PyTorch reference for `reel bench`: the same Wan presets, shapes and training step with
diffusers' `WanTransformer3DModel`, printed as the same kind of table.

Training step = forward, flow-matching MSE loss (target noise - x0, sigma 0.5), backward,
global-norm clipping at 1.0, AdamW (lr 1e-4, betas 0.9/0.999, weight decay 0.01) - the step
`reel bench` times. Initialisation follows Reel's (weights N(0,1)/sqrt(fan_in), biases zero,
norm scales one, modulation tables N(0,1)/sqrt(dim)); values differ, distributions match.
FLOP formula as in `reel bench`: per forward B*n*[N*(12d^2+4df+4Nd+4Ld) + L*4d^2], x3 for a
training step. Attention uses PyTorch's `scaled_dot_product_attention` (diffusers' default
processor), i.e. fused / memory-efficient kernels where PyTorch has them.

Usage: bench_wan.py --preset wan-bench-small --shape 8 16 16 --batch 8 --device cpu [--json]

`--attention-only` times the blocks' self-attention alone instead, as `reel bench
--attention-only` does: `scaled_dot_product_attention` on q, k, v of [B, heads, N, head_dim] in
--dtype (stored [B, N, heads, head_dim]), the forward without gradients and the forward plus
the backward of sum(o); forward FLOPs 4*B*heads*N^2*head_dim, x3.5 with the backward.
"""
import argparse
import json
import math
import resource
import statistics
import sys
import time

import torch

# Reel's presets (models/src/wan/presets.rs), as diffusers config dicts.
SMALL_IO = dict(patch_size=(1, 2, 2), in_channels=4, out_channels=4, text_dim=32, freq_dim=64,
                cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
WAN21_IO = dict(patch_size=(1, 2, 2), in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
                cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)


def small(layers, heads, head_dim, ffn, patch_size=(1, 2, 2)):
    return dict(SMALL_IO, patch_size=patch_size, num_layers=layers, num_attention_heads=heads,
                attention_head_dim=head_dim, ffn_dim=ffn)


PRESETS = {
    "wan-tiny": dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                     out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
                     qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32),
    "wan-quickstart": small(4, 4, 48, 768, patch_size=(4, 2, 2)),
    "wan-bench-small": small(4, 4, 32, 512),
    "wan-bench-medium": small(8, 8, 64, 2048),
    "wan2.1-t2v-1.3b": dict(WAN21_IO, num_layers=30, num_attention_heads=12, attention_head_dim=128, ffn_dim=8960),
    "wan2.1-t2v-14b": dict(WAN21_IO, num_layers=40, num_attention_heads=40, attention_head_dim=128, ffn_dim=13824),
}


def reel_init(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:  # norm scales
                p.fill_(1.0)
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def forward_flops(c, batch, tokens, text_len):
    d = c["num_attention_heads"] * c["attention_head_dim"]
    f, n, l = c["ffn_dim"], tokens, text_len
    return batch * c["num_layers"] * (n * (12 * d * d + 4 * d * f + 4 * n * d + 4 * l * d) + l * 4 * d * d)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def bench(args, preset):
    from diffusers import WanTransformer3DModel

    c = PRESETS[preset]
    dev = torch.device(args.device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    model = WanTransformer3DModel(**c)
    reel_init(model, 0)
    model.to(dev)
    f, h, w = args.shape
    pt, ph, pw = c["patch_size"]
    tokens = (f // pt) * (h // ph) * (w // pw)
    b = args.batch
    x0 = torch.randn(b, c["in_channels"], f, h, w, device=dev)
    noise = torch.randn_like(x0)
    text = torch.randn(b, args.text_len, c["text_dim"], device=dev)
    sigma = torch.full((b,), 0.5, device=dev)
    t = sigma * 1000.0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01)
    autocast = torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32)

    fwd = []
    model.eval()
    with torch.no_grad():
        for i in range(args.warmup + args.steps):
            sync(dev)
            t0 = time.perf_counter()
            with autocast:
                out = model(x0, t, text, return_dict=False)[0]
            out.float().sum().item()
            if i >= args.warmup:
                fwd.append((time.perf_counter() - t0) * 1e3)
    model.train()
    if args.gradient_checkpointing:
        model.enable_gradient_checkpointing()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train = []
    for i in range(args.warmup + args.steps):
        sync(dev)
        t0 = time.perf_counter()
        s = sigma.view(b, 1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        with autocast:
            pred = model(xt, t, text, return_dict=False)[0]
        loss = (pred.float() - (noise - x0)).square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        if i >= args.warmup:
            train.append((time.perf_counter() - t0) * 1e3)
    ffl = forward_flops(c, b, tokens, args.text_len)
    med_f, med_t = statistics.median(fwd), statistics.median(train)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return dict(preset=preset, backend=f"torch-{dev.type}", dtype=args.dtype,
                gradient_checkpointing=args.gradient_checkpointing, batch=b, tokens=tokens,
                trainable_params=sum(p.numel() for p in model.parameters()),
                forward_ms=dict(median=med_f, min=min(fwd), max=max(fwd)),
                train_step_ms=dict(median=med_t, min=min(train), max=max(train)),
                train_tokens_per_s=b * tokens / (med_t / 1e3),
                forward_gflops=ffl / (med_f / 1e3) / 1e9, train_gflops=3 * ffl / (med_t / 1e3) / 1e9,
                peak_mib=peak, peak_kind="cuda max_memory_allocated" if dev.type == "cuda" else "process peak RSS")


def timed(args, dev, f):
    ms = []
    for i in range(args.warmup + args.steps):
        sync(dev)
        t0 = time.perf_counter()
        f()
        sync(dev)
        if i >= args.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    return dict(mean=statistics.mean(ms), median=statistics.median(ms), min=min(ms), max=max(ms))


def bench_attention(args, preset):
    c = PRESETS[preset]
    dev = torch.device(args.device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    f, h, w = args.shape
    pt, ph, pw = c["patch_size"]
    b, heads, n, d = (args.batch, c["num_attention_heads"], (f // pt) * (h // ph) * (w // pw),
                      c["attention_head_dim"])
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, heads, d, device=dev, dtype=dtype).transpose(1, 2) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forward():
        with torch.no_grad():
            sdpa(q, k, v)

    def train():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        sdpa(*leaves).sum().backward()

    flops = 4.0 * b * heads * n * n * d
    fwd, trn = timed(args, dev, forward), timed(args, dev, train)
    return dict(kernel="torch sdpa", shape=[b, heads, n, d], dtype=args.dtype, forward_ms=fwd,
                forward_tflops=flops / (fwd["median"] * 1e9), train_ms=trn,
                train_tflops=3.5 * flops / (trn["median"] * 1e9), error=None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", action="append", choices=sorted(PRESETS))
    p.add_argument("--shape", nargs=3, type=int, default=[8, 16, 16], metavar=("F", "H", "W"))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--text-len", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="bf16 = autocast, f32 master weights")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = PyTorch's default)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute each block in backward (diffusers enable_gradient_checkpointing)")
    p.add_argument("--attention-only", action="store_true",
                   help="time the blocks' self-attention alone (scaled_dot_product_attention)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.attention_only:
        rows = [bench_attention(args, pr) for pr in (args.preset or ["wan-quickstart"])]
        if args.json:
            json.dump(rows, sys.stdout, indent=2)
            print()
            return
        for r in rows:
            print(f"{r['kernel']:<12} {str(r['shape']):<22} {r['dtype']:<5} | forward "
                  f"{r['forward_ms']['median']:.2f} ms {r['forward_tflops']:.1f} TFLOP/s | "
                  f"fwd+bwd {r['train_ms']['median']:.2f} ms {r['train_tflops']:.1f} TFLOP/s")
        return
    rows = [bench(args, pr) for pr in (args.preset or ["wan-quickstart"])]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print(f"{'preset':<18} {'backend':<11} {'dtype':<5} {'batch':>5} {'tokens':>6} | {'forward ms (med/min/max)':>26} | "
          f"{'train step ms (med/min/max)':>27} | {'tok/s':>10} {'fwd GF/s':>9} {'trn GF/s':>9} {'peak MiB':>9}")
    for r in rows:
        fm, tm = r["forward_ms"], r["train_step_ms"]
        print(f"{r['preset']:<18} {r['backend']:<11} {r['dtype']:<5} {r['batch']:>5} {r['tokens']:>6} | "
              f"{fm['median']:8.1f} {fm['min']:8.1f} {fm['max']:8.1f} | {tm['median']:8.1f} {tm['min']:8.1f} {tm['max']:9.1f} | "
              f"{r['train_tokens_per_s']:10.0f} {r['forward_gflops']:9.2f} {r['train_gflops']:9.2f} {r['peak_mib']:9.0f}")


if __name__ == "__main__":
    main()
