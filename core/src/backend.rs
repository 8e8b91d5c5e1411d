//! Backends: the concrete Burn backends Reel builds plugins for, selected by name at run time.
//!
//! All numeric code is generic over `B: Backend` / `B: AutodiffBackend`. Plugin *configs* are
//! non-generic trait objects, so they are built for each compiled backend through the
//! [`ReelBackend`] trait: the run config names the backend (`[runtime] backend = "cpu"`),
//! [`with_backend!`](crate::with_backend) maps that name to one concrete type once, and
//! everything below is generic.
//!
//! The backends are written down once, in `backend_list!` (this file); everything else is
//! generated from it: the type aliases, the [`BackendName`] enum (config and CLI values, and
//! the error naming the cargo feature of a backend that is not compiled in), the
//! [`ReelBackend`] impls, the `Build*All` supertrait bundles through which a plugin config
//! builds for every compiled backend, the `with_backend!` dispatch, and [`find_backend`],
//! which downcast chains use to try each compiled backend in turn.

use std::any::Any;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use crate::callback::{BuildCallback, CallbackConfig};
use crate::config::ConfigError;
use crate::method::{BuildContext, BuildMethod, MethodConfig, MethodError, TrainingMethod};
use crate::model::{BuildModel, DynModel, ModelConfig, ModelError};
use crate::role::RoleConfig;

/// The one list of backends. Each entry: enum variant, config name, autodiff alias =
/// `Autodiff<inner backend>`, the cargo feature that compiles it in (`always` for none), the
/// device of an index, and docs. `$cb! { [args] entries }` is called with the whole list.
macro_rules! backend_list {
    ($cb:ident $(, $arg:tt)*) => {
        $cb! { [$($arg)*]
            /// The default CPU backend: Burn's `ndarray` backend with autodiff. Measured side
            /// by side against `flex` on the Wan training step, ndarray was about 1.8x faster
            /// (Flex's broadcast and strided element-wise kernels are 10-25x slower).
            Cpu "cpu" CpuBackend = burn::backend::NdArray, always, |_i| Default::default();
            /// Burn's pure-Rust `Flex` CPU backend with autodiff (it has bfloat16 kernels).
            Flex "flex" FlexBackend = burn::backend::Flex, always, |_i| Default::default();
            /// Burn's CUDA backend with autodiff (cargo feature `cuda`).
            Cuda "cuda" CudaBackend = burn::backend::Cuda, "cuda",
                |i| {
                    crate::device_setup::before_gpu_device(true);
                    burn::backend::cuda::CudaDevice::new(i)
                };
            /// Burn's wgpu backend with autodiff (cargo feature `wgpu`): Vulkan, Metal, DX12,
            /// or Mesa's software Vulkan driver on a machine without a GPU.
            Wgpu "wgpu" WgpuBackend = burn::backend::Wgpu, "wgpu",
                |_i| {
                    crate::device_setup::before_gpu_device(false);
                    Default::default()
                };
        }
    };
}

/// `$cb! { [args] entries }` with the entries of `backend_list!` whose cargo feature is on in
/// this crate: each optional entry is decided by a `cfg` on a recursive call.
macro_rules! compiled {
    ([$cb:ident $($arg:tt)*] $($entries:tt)*) => {
        compiled! { @munch $cb [$($arg)*] [] $($entries)* }
    };
    (@munch $cb:ident [$($arg:tt)*] [$($keep:tt)*]) => {
        $cb! { [$($arg)*] $($keep)* }
    };
    (@munch $cb:ident $args:tt [$($keep:tt)*] $(#[$doc:meta])* $v:ident $name:literal
        $alias:ident = $inner:ty, always, |$i:ident| $dev:expr; $($rest:tt)*) => {
        compiled! { @munch $cb $args [$($keep)* $v $alias = $inner, |$i| $dev;] $($rest)* }
    };
    (@munch $cb:ident $args:tt [$($keep:tt)*] $(#[$doc:meta])* $v:ident $name:literal
        $alias:ident = $inner:ty, $feat:literal, |$i:ident| $dev:expr; $($rest:tt)*) => {
        #[cfg(feature = $feat)]
        compiled! { @munch $cb $args [$($keep)* $v $alias = $inner, |$i| $dev;] $($rest)* }
        #[cfg(not(feature = $feat))]
        compiled! { @munch $cb $args [$($keep)*] $($rest)* }
    };
}

/// One alias per backend, compiled in where its feature is on.
macro_rules! aliases {
    ([] $($(#[$doc:meta])* $v:ident $name:literal $alias:ident = $inner:ty, $feat:tt,
        |$i:ident| $dev:expr;)*) => {
        $( alias! { $(#[$doc])* $alias = $inner, $feat } )*
    };
}

macro_rules! alias {
    ($(#[$doc:meta])* $alias:ident = $inner:ty, always) => {
        $(#[$doc])*
        pub type $alias = burn::backend::Autodiff<$inner>;
    };
    ($(#[$doc:meta])* $alias:ident = $inner:ty, $feat:literal) => {
        $(#[$doc])*
        #[cfg(feature = $feat)]
        pub type $alias = burn::backend::Autodiff<$inner>;
    };
}

macro_rules! feature_of {
    (always) => {
        None
    };
    ($feat:literal) => {
        Some($feat)
    };
}

/// The [`BackendName`] enum: every backend of the list, compiled in or not.
macro_rules! name_enum {
    ([] $($(#[$doc:meta])* $v:ident $name:literal $alias:ident = $inner:ty, $feat:tt,
        |$i:ident| $dev:expr;)*) => {
        /// Backend names accepted in `[runtime] backend` and on the command line. Every name
        /// parses; one whose cargo feature is off is an error naming the feature
        /// ([`BackendName::check_compiled`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum BackendName {
            $( $(#[$doc])* $v, )*
        }

        impl BackendName {
            /// Every backend, compiled in or not, in list order.
            pub const ALL: &'static [BackendName] = &[$(BackendName::$v),*];

            /// Lower-case name (the config and command-line value).
            pub fn as_str(self) -> &'static str {
                match self { $(BackendName::$v => $name,)* }
            }

            /// The cargo feature that compiles this backend in (`None`: always compiled).
            pub fn feature(self) -> Option<&'static str> {
                match self { $(BackendName::$v => feature_of!($feat),)* }
            }
        }
    };
}

/// `BackendName::is_compiled`, the `ReelBackend` impls and the `Build*All` bundles, from the
/// compiled entries.
macro_rules! compiled_items {
    ([] $($v:ident $alias:ident = $inner:ty, |$i:ident| $dev:expr;)*) => {
        impl BackendName {
            /// Whether this backend is compiled into the current binary.
            pub fn is_compiled(self) -> bool {
                matches!(self, $(BackendName::$v)|*)
            }
        }

        $(
            impl ReelBackend for $alias {
                const NAME: BackendName = BackendName::$v;
                fn device_for($i: usize) -> Self::Device {
                    $dev
                }
                fn build_method(
                    config: &dyn MethodConfig,
                    ctx: &BuildContext<Self>,
                ) -> Result<Box<dyn TrainingMethod<Self>>, MethodError> {
                    <dyn MethodConfig as BuildMethod<$alias>>::build_method(config, ctx)
                }
                fn build_callback(
                    config: &dyn CallbackConfig,
                ) -> Result<Box<dyn crate::callback::Callback<Self>>, ConfigError> {
                    <dyn CallbackConfig as BuildCallback<$alias>>::build_callback(config)
                }
                fn build_model(
                    config: &dyn ModelConfig,
                    role: &RoleConfig,
                    ctx: &BuildContext<Self>,
                ) -> Result<DynModel<Self>, ModelError> {
                    <dyn ModelConfig as BuildModel<$alias>>::build_model(config, role, ctx)
                }
            }
        )*

        /// Supertrait bundle: a method config that builds for every compiled backend.
        /// Implemented automatically for any type with a generic `BuildMethod<B>` impl.
        pub trait BuildMethodAll: Send $(+ BuildMethod<$alias>)* {}
        impl<T: Send $(+ BuildMethod<$alias>)* + ?Sized> BuildMethodAll for T {}

        /// Supertrait bundle for callbacks (see [`BuildMethodAll`]).
        pub trait BuildCallbackAll: Send $(+ BuildCallback<$alias>)* {}
        impl<T: Send $(+ BuildCallback<$alias>)* + ?Sized> BuildCallbackAll for T {}

        /// Supertrait bundle for model architectures (see [`BuildMethodAll`]).
        pub trait BuildModelAll: Send $(+ BuildModel<$alias>)* {}
        impl<T: Send $(+ BuildModel<$alias>)* + ?Sized> BuildModelAll for T {}

        /// Ask `visitor` about each compiled backend in list order; the first answer wins.
        /// Downcast chains use it to find the concrete backend a generic `B` is.
        pub fn find_backend<V: BackendVisitor>(visitor: &mut V) -> Option<V::Output> {
            $(
                if let Some(out) = visitor.visit::<$alias>() {
                    return Some(out);
                }
            )*
            None
        }
    };
}

/// The exported `with_backend!` macro, from the compiled entries (`$d` is a `$`).
macro_rules! dispatch_macro {
    ([$d:tt] $($v:ident $alias:ident = $inner:ty, |$i:ident| $dev:expr;)*) => {
        /// Run `$body` with the type alias `$B` bound to the backend `$name`
        /// ([`BackendName`](crate::backend::BackendName)) names. `$body` returns a
        /// `Result<T, E>` with `E: From<ConfigError>`; a backend that is not compiled in gives
        /// the error naming its cargo feature.
        ///
        /// ```ignore
        /// reel_core::with_backend!(cfg.runtime.backend, |B| train::<B>(&loaded, &opts))?;
        /// ```
        #[macro_export]
        macro_rules! with_backend {
            ($d name:expr, |$d b:ident| $d body:expr) => {
                match $d name {
                    $(
                        $crate::backend::BackendName::$v => {
                            type $d b = $crate::backend::$alias;
                            $d body
                        }
                    )*
                    #[allow(unreachable_patterns)]
                    other => Err(other.check_compiled().expect_err("not compiled").into()),
                }
            };
        }
    };
}

backend_list!(aliases);
backend_list!(name_enum);
backend_list!(compiled, compiled_items);
backend_list!(compiled, dispatch_macro, $);

// The variants are generated from the list, so `#[default]` cannot mark one of them.
#[allow(clippy::derivable_impls)]
impl Default for BackendName {
    fn default() -> Self {
        BackendName::Cpu
    }
}

impl BackendName {
    /// Error unless the backend is compiled in; the error names the cargo feature to enable.
    pub fn check_compiled(self) -> Result<(), ConfigError> {
        if self.is_compiled() {
            return Ok(());
        }
        let feature = self.feature().unwrap_or(self.as_str());
        Err(ConfigError::new(
            "runtime.backend",
            format!(
                "backend `{}` is not compiled into this binary: rebuild with \
                 `cargo build --release --features {feature}`",
                self.as_str()
            ),
        ))
    }
}

impl std::fmt::Display for BackendName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendName {
    type Err = String;

    /// Parse a backend name (`cpu`, `flex`, `cuda`, `wgpu`; `ndarray` is `cpu`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "ndarray" {
            return Ok(BackendName::Cpu);
        }
        BackendName::ALL
            .iter()
            .copied()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = BackendName::ALL.iter().map(|b| b.as_str()).collect();
                format!("unknown backend `{s}`, expected one of {names:?}")
            })
    }
}

/// A backend Reel can train on: an autodiff backend plus the glue that builds plugin configs
/// for it. Implemented for every compiled backend of the list.
pub trait ReelBackend: AutodiffBackend {
    /// The backend's name.
    const NAME: BackendName;
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
    /// Build a role's model from its architecture config for this backend.
    fn build_model(
        config: &dyn ModelConfig,
        role: &RoleConfig,
        ctx: &BuildContext<Self>,
    ) -> Result<DynModel<Self>, ModelError>;
}

/// `t` as a tensor of the concrete backend `T` when `B` is `T` (a checked, safe downcast);
/// otherwise `t` back. How generic code reaches a backend's own kernels (the fused attention
/// and optimizer kernels on the CubeCL backends).
pub fn downcast_tensor<B: Backend, T: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> Result<Tensor<T, D>, Tensor<B, D>> {
    let mut slot = Some(t);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<Tensor<T, D>>>() {
        Some(s) => Ok(s.take().expect("slot is filled")),
        None => Err(slot.expect("slot is untouched")),
    }
}

/// A question asked of each compiled backend by [`find_backend`].
pub trait BackendVisitor {
    /// The answer.
    type Output;
    /// Answer for the backend `A` (`None`: not this one).
    fn visit<A: ReelBackend>(&mut self) -> Option<Self::Output>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_name_their_feature() {
        for b in BackendName::ALL {
            assert_eq!(b.as_str().parse::<BackendName>().unwrap(), *b);
            let toml_value: BackendName =
                serde_json::from_value(serde_json::Value::String(b.as_str().into())).unwrap();
            assert_eq!(toml_value, *b);
        }
        assert_eq!("ndarray".parse::<BackendName>().unwrap(), BackendName::Cpu);
        assert!("tpu".parse::<BackendName>().unwrap_err().contains("cuda"));
        assert!(BackendName::Cpu.is_compiled() && BackendName::Flex.is_compiled());
        assert_eq!(BackendName::Cuda.is_compiled(), cfg!(feature = "cuda"));
        assert_eq!(BackendName::Wgpu.is_compiled(), cfg!(feature = "wgpu"));
        if !cfg!(feature = "cuda") {
            let e = BackendName::Cuda.check_compiled().unwrap_err().to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
    }

    struct IsBackend(BackendName);
    impl BackendVisitor for IsBackend {
        type Output = &'static str;
        fn visit<A: ReelBackend>(&mut self) -> Option<&'static str> {
            (A::NAME == self.0).then_some(A::NAME.as_str())
        }
    }

    #[test]
    fn find_backend_visits_the_compiled_backends() {
        assert_eq!(
            find_backend(&mut IsBackend(BackendName::Flex)),
            Some("flex")
        );
        let cuda = find_backend(&mut IsBackend(BackendName::Cuda));
        assert_eq!(cuda.is_some(), cfg!(feature = "cuda"));
    }

    #[test]
    fn with_backend_binds_the_named_backend() {
        fn name<B: ReelBackend>() -> Result<BackendName, ConfigError> {
            Ok(B::NAME)
        }
        for b in BackendName::ALL {
            let got: Result<BackendName, ConfigError> = with_backend!(*b, |B| name::<B>());
            match got {
                Ok(n) => assert_eq!(n, *b),
                Err(e) => {
                    assert!(!b.is_compiled());
                    assert_eq!(e.key, "runtime.backend");
                }
            }
        }
    }
}
