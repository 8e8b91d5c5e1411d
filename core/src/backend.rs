//! Backends: the concrete Burn backends Reel builds plugins for, selected by name at run time.
//!
//! All numeric code is generic over `B: Backend` / `B: AutodiffBackend`. Plugin *configs* are
//! non-generic trait objects, so they are built for each compiled backend through the
//! [`ReelBackend`] trait: the run config names the backend (`[runtime] backend = "cpu"`), the
//! binary maps that name to one concrete type once, and everything below is generic.

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::callback::{BuildCallback, CallbackConfig};
use crate::config::ConfigError;
use crate::method::{BuildContext, BuildMethod, MethodConfig, MethodError, TrainingMethod};

/// The default CPU backend: Burn's `ndarray` backend with autodiff.
///
/// Measured side by side against Burn's `Flex` backend on the Wan training step
/// (`reel bench --backend cpu` vs `--backend flex`), ndarray was about 1.8x faster: Flex's
/// broadcast and strided element-wise kernels are 10-25x slower (see README, "Performance").
pub type CpuBackend = burn::backend::Autodiff<burn::backend::NdArray>;

/// Burn's pure-Rust `Flex` CPU backend with autodiff (`[runtime] backend = "flex"`).
pub type FlexBackend = burn::backend::Autodiff<burn::backend::Flex>;

/// The CUDA backend with autodiff (cargo feature `cuda`).
#[cfg(feature = "cuda")]
pub type CudaBackend = burn::backend::Autodiff<burn::backend::Cuda>;

/// Backend names accepted in `[runtime] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendName {
    /// The default CPU backend, Burn's ndarray (always compiled).
    #[default]
    Cpu,
    /// Burn's Flex CPU backend (always compiled).
    Flex,
    /// Burn's CUDA backend (cargo feature `cuda`).
    Cuda,
}

impl BackendName {
    /// Whether this backend is compiled into the current binary.
    pub fn is_compiled(self) -> bool {
        match self {
            BackendName::Cpu | BackendName::Flex => true,
            BackendName::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// Error unless the backend is compiled in; names the cargo feature to enable.
    pub fn check_compiled(self) -> Result<(), ConfigError> {
        if self.is_compiled() {
            Ok(())
        } else {
            Err(ConfigError::new(
                "runtime.backend",
                "backend `cuda` is not compiled into this binary: rebuild with `cargo build --release --features cuda`",
            ))
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendName::Cpu => "cpu",
            BackendName::Flex => "flex",
            BackendName::Cuda => "cuda",
        }
    }
}

/// A backend Reel can train on: an autodiff backend plus the glue that builds plugin configs
/// for it. Implemented for [`CpuBackend`] and, with the `cuda` feature, `CudaBackend`.
pub trait ReelBackend: AutodiffBackend {
    /// Human-readable backend name.
    fn backend_name() -> &'static str;
    /// The device with the given index (ignored by CPU backends).
    fn device_for(index: usize) -> Self::Device;
    /// Build a method from its config for this backend.
    fn build_method(
        config: &dyn MethodConfig,
        ctx: &BuildContext<Self>,
    ) -> Result<Box<dyn TrainingMethod<Self>>, MethodError>;
    /// Build a callback from its config for this backend.
    fn build_callback(
        config: &dyn CallbackConfig,
    ) -> Result<Box<dyn crate::callback::Callback<Self>>, ConfigError>;
}

macro_rules! impl_reel_backend {
    ($ty:ty, $name:expr, $dev:expr) => {
        impl ReelBackend for $ty {
            fn backend_name() -> &'static str {
                $name
            }
            fn device_for(index: usize) -> Self::Device {
                #[allow(clippy::redundant_closure_call)]
                ($dev)(index)
            }
            fn build_method(
                config: &dyn MethodConfig,
                ctx: &BuildContext<Self>,
            ) -> Result<Box<dyn TrainingMethod<Self>>, MethodError> {
                <dyn MethodConfig as BuildMethod<$ty>>::build_method(config, ctx)
            }
            fn build_callback(
                config: &dyn CallbackConfig,
            ) -> Result<Box<dyn crate::callback::Callback<Self>>, ConfigError> {
                <dyn CallbackConfig as BuildCallback<$ty>>::build_callback(config)
            }
        }
    };
}

impl_reel_backend!(CpuBackend, "cpu (ndarray)", |_i: usize| Default::default());
impl_reel_backend!(FlexBackend, "flex", |_i: usize| Default::default());
#[cfg(feature = "cuda")]
impl_reel_backend!(CudaBackend, "cuda", |i: usize| {
    burn::backend::cuda::CudaDevice::new(i)
});

/// Supertrait bundle: a plugin config that can build for every compiled backend.
/// Implemented automatically for any type with a generic `BuildMethod<B>` impl.
#[cfg(not(feature = "cuda"))]
pub trait BuildMethodAll: BuildMethod<CpuBackend> + BuildMethod<FlexBackend> {}
#[cfg(not(feature = "cuda"))]
impl<T: BuildMethod<CpuBackend> + BuildMethod<FlexBackend> + ?Sized> BuildMethodAll for T {}
/// Supertrait bundle: a plugin config that can build for every compiled backend.
#[cfg(feature = "cuda")]
pub trait BuildMethodAll:
    BuildMethod<CpuBackend> + BuildMethod<FlexBackend> + BuildMethod<CudaBackend>
{
}
#[cfg(feature = "cuda")]
impl<T: BuildMethod<CpuBackend> + BuildMethod<FlexBackend> + BuildMethod<CudaBackend> + ?Sized>
    BuildMethodAll for T
{
}

/// Supertrait bundle for callbacks (see [`BuildMethodAll`]).
#[cfg(not(feature = "cuda"))]
pub trait BuildCallbackAll: BuildCallback<CpuBackend> + BuildCallback<FlexBackend> {}
#[cfg(not(feature = "cuda"))]
impl<T: BuildCallback<CpuBackend> + BuildCallback<FlexBackend> + ?Sized> BuildCallbackAll for T {}
/// Supertrait bundle for callbacks (see [`BuildMethodAll`]).
#[cfg(feature = "cuda")]
pub trait BuildCallbackAll:
    BuildCallback<CpuBackend> + BuildCallback<FlexBackend> + BuildCallback<CudaBackend>
{
}
#[cfg(feature = "cuda")]
impl<
        T: BuildCallback<CpuBackend>
            + BuildCallback<FlexBackend>
            + BuildCallback<CudaBackend>
            + ?Sized,
    > BuildCallbackAll for T
{
}
