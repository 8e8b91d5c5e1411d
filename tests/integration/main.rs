//! The `reel` crate's integration tests, one binary: real short trainings in temp dirs, the
//! `reel` binary driven as a user drives it, and the docs checked against the code.
//!
//! One test binary instead of one per file: each binary links the whole Burn stack and
//! instantiates the trainer's generic code again (21 binaries took 714 s of compiler time in a
//! clean build, this one 158 s; docs/architecture.md, "Tests"). Run one file's tests with its
//! module name: `cargo test --release --test integration -- lora::`. `tests/multi_process.rs`
//! stays a binary of its own: it needs the `mpi` feature and runs under `mpirun`.

#[path = "../common/mod.rs"]
mod common;

mod bench;
mod callbacks;
mod cli;
mod config_errors;
mod core_loop;
mod crash;
mod data_parallel;
mod data_sources;
mod distillation;
mod docs;
mod gradient_checkpointing;
mod lora;
mod memory_floor;
mod non_finite;
mod precision;
mod preprocess;
mod quickstart;
mod readme;
mod resume;
mod save_errors;
mod second_arch;
mod videos;
