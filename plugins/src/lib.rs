//! Reel plugins: data sources, media writers (and, later, EMA, validation, logging, LoRA).
#![warn(missing_docs)]

pub mod data;
pub mod media;
