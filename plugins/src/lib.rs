//! Reel plugins: data sources, media writers (and, later, EMA, validation, logging, LoRA).
#![warn(missing_docs)]

pub mod callbacks;
pub mod data;
pub mod lora;
pub mod media;
