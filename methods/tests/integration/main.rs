//! `reel-methods`' integration tests, one binary: the golden finetune and DMD2 steps against
//! diffusers, DMD2's cadence in real tiny runs, and the adversarial toy. Run one file's tests with
//! its module name: `cargo test --release -p reel-methods --test integration -- dmd2_golden::`.

mod dmd2_cadence;
mod dmd2_golden;
mod finetune_golden;
mod gan_toy;
