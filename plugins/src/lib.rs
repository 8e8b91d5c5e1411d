//! Reel plugins: data sources, media writers and the EMA, validation and logging callbacks.
#![warn(missing_docs)]

pub mod callbacks;
pub mod data;
pub mod media;
