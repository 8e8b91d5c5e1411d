//! Reel training methods: flow-matching fine-tuning (and, as they land, DMD2 and adversarial
//! distillation). Each method registers itself with one typetag impl plus one
//! `register_plugin!` line.
#![warn(missing_docs)]

pub mod common;
pub mod dmd2;
pub mod finetune;

pub use dmd2::{Dmd2Config, Rollout};
pub use finetune::{flow_matching_loss, loss_of_prediction, FinetuneConfig};
