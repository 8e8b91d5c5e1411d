//! `kind = "consistency"`: multi-phase consistency distillation (PCM-style), as FastVideo
//! distilled its video models before DMD2 (`fastvideo/distill.py`).
//!
//! Roles: `student` (trainable), `teacher` (frozen, loaded without autodiff) and, with
//! `target = "ema"` (default), the method's own `target`: an exponential moving average of the
//! student that never receives gradients and is saved with every checkpoint as
//! `target.safetensors` (so a resume is exact). With `target = "student"` the student itself,
//! without gradients, gives the targets.
//!
//! Each step (0-based global step `s`, with `n = phases_at(s)` from
//! `multi_phased_distill_schedule`), per sample:
//! 1. draw a point `i` uniformly from `1..=N` of the Euler grid ([`solver`]) and noise the data
//!    latent to it, `x_i = (1 − σ_i)·x0 + σ_i·ε`;
//! 2. the student predicts the phase end: `x̂ = x_i + (σ_end − σ_i)·v_student(x_i, σ_i)`;
//! 3. the teacher takes one guided Euler step (`distill_cfg`, [`method::teacher_step`]):
//!    `x_{i−1} = x_i + (σ_{i−1} − σ_i)·v̂_teacher`;
//! 4. the target network maps that point to the same phase end,
//!    `x̃ = x_{i−1} + (σ_end − σ_{i−1})·v_target(x_{i−1}, σ_{i−1})` (just `x_{i−1}` when it is
//!    the phase end);
//! 5. loss `d(x̂, x̃)` (pseudo-Huber or L2, [`loss`]) plus `pred_decay_weight` times the
//!    prediction-decay regulariser of `x̂`; gradients reach the student only.
//!
//! The EMA target follows the student after every optimizer step:
//! `θ_target ← d·θ_target + (1 − d)·θ_student` (applied at the start of the next step).
//!
//! Sampling ([`TrainingMethod::sample`](reel_core::method::TrainingMethod::sample)) is one
//! deterministic Euler step per phase over the phase boundaries
//! ([`solver::EulerSolver::phase_sigmas`]), with the schedule's last phase count by default
//! and without classifier-free guidance (it is distilled in) unless the request asks for it.
//!
//! Differences from FastVideo: the grid's lowest boundary is σ = 0 (FastVideo's is the
//! scheduler's smallest σ); points and noises are drawn per sample from streams keyed by the
//! step and the sample's stream position (FastVideo draws per batch), so accumulation equals a larger
//! batch.
//!
//! ```toml
//! [method]
//! kind = "consistency"
//! num_euler_timesteps = 50
//! multi_phased_distill_schedule = "4000-4,8000-8"
//! distill_cfg = 3.0
//! loss = "huber"
//! target = "ema"
//! ema_decay = 0.95
//! ```

pub mod config;
pub mod loss;
pub mod method;
pub mod schedule;
pub mod solver;
#[cfg(test)]
mod tests;

pub use config::{ConsistencyConfig, TargetNetwork};
pub use loss::{DistanceLoss, PredDecay};
pub use method::{consistency_target, teacher_step, Consistency, Points};
pub use schedule::PhaseSchedule;
pub use solver::{euler_segment, EulerSolver};
