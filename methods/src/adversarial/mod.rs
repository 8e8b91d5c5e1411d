//! `kind = "adversarial"`: adversarial distillation with discriminator heads on a frozen
//! feature network, and its building blocks: the hinge / non-saturating losses with a
//! finite-difference R1 penalty ([`loss`]), the heads over the feature network's hidden
//! states ([`heads`]), the configuration ([`config`]) and the method ([`method`]).

pub mod config;
pub mod heads;
pub mod loss;
pub mod method;

pub use config::AdversarialConfig;
pub use heads::{DiscriminatorHeads, Head, HeadsConfig};
pub use loss::{approx_r1, softplus, GanLoss};
pub use method::Adversarial;
