//! `reel-models`' integration tests, one binary: parity with the diffusers and transformers
//! golden fixtures (LoRA, UMT5, the VAE; the Wan model's own is the library's `wan::parity`
//! unit tests), weight I/O, precision and configs beyond the fixture shapes. One binary links
//! and instantiates the models once, where one binary per file did it seven times. Run one
//! file's tests with its module name:
//! `cargo test --release -p reel-models --test integration -- vae_parity::`.

mod common;

mod general_config;
mod lora_parity;
mod precision;
mod umt5_parity;
mod vae_parity;
mod weights_io;
