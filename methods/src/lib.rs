//! Reel training methods: flow-matching fine-tuning (`finetune`), DMD2 distillation (`dmd2`,
//! optionally with its GAN terms), adversarial distillation (`adversarial`) and multi-phase
//! consistency distillation (`consistency`). Each method registers itself with
//! `#[reel_core::plugin(name, summary)]` on its config impl and reaches its models only
//! through the model seam ([`reel_core::model`]): any registered architecture can be trained.
#![warn(missing_docs)]

pub mod adversarial;
pub mod common;
pub mod consistency;
pub mod dmd2;
pub mod finetune;
#[cfg(test)]
mod test_util;

pub use adversarial::AdversarialConfig;
pub use consistency::ConsistencyConfig;
pub use dmd2::{Dmd2Config, Rollout};
pub use finetune::{flow_matching_loss, loss_of_prediction, FinetuneConfig};
