//! Safetensors I/O for Burn modules by dotted parameter path.
//!
//! Reel's module field names equal the upstream checkpoint keys (see [`crate::params`]), so a
//! safetensors file maps onto a module with no renaming table:
//!
//! - [`read_safetensors`] / [`write_safetensors`] convert between a file and host
//!   [`TensorData`](burn::tensor::TensorData) (read: F32, BF16, F16 and F64 on disk, always
//!   returned as f32; write: f32, or bf16 / f16 with [`write_safetensors_as`]);
//! - [`load_module_tensors`] puts tensors into a module by path, keeping every parameter's id,
//!   device and `require_grad` flag, and reports *all* missing, unexpected and wrongly shaped
//!   keys in one [`WeightError::Mismatch`];
//! - [`module_to_safetensors`] writes every float parameter of a module;
//! - [`replace_file`] / [`replace_file_with`] write any file whole (temporary sibling, sync,
//!   rename), as the safetensors writer does; [`sync_dir`] makes renames in a folder durable
//!   (the checkpoints' folders too); [`rename_replacing`] renames a folder over another,
//!   putting the old one back on failure (checkpoints and `final/`); [`remove_any`] removes a
//!   folder, a file or a link;
//! - [`content_stamp`] identifies a file or folder by its size and both ends' bytes;
//!   [`is_special`] tells a named pipe or device, which a reader must not open.

mod atomic;
mod error;
mod module;
mod safetensors;
mod serialize;
mod stamp;

pub use self::atomic::*;
pub use self::safetensors::*;
pub use error::*;
pub use module::*;
pub use stamp::{content_stamp, is_special};

#[cfg(test)]
mod tests;
