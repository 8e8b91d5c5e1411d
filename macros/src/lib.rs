//! Reel's plugin macros, re-exported by `reel-core` (use them as `reel_core::plugin` and
//! `reel_core::Roles`):
//!
//! - `#[plugin(name = "...", summary = "...")]` on the impl of a plugin config trait
//!   (`MethodConfig`, `CallbackConfig`, `DataConfig`, `AdapterConfig`, `ModelConfig`)
//!   registers the type under `name` for TOML (the typetag name) and for `reel list` (the
//!   registry entry, with the summary) in one place, so the two can never disagree;
//! - `#[derive(Roles)]` on a training method lists the fields marked `#[role]` (a
//!   `TrainableRole` or an `Option` of one) as the method's roles.
#![warn(missing_docs)]

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{parse_macro_input, Data, DeriveInput, Error, Fields, ItemImpl, Token};

/// `name = "...", summary = "..."` (string literals or paths to `&'static str` constants).
struct PluginArgs {
    name: syn::Expr,
    summary: syn::Expr,
}

impl Parse for PluginArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let pairs = Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated(input)?;
        let (mut name, mut summary) = (None, None);
        for pair in pairs {
            let value = match &pair.value {
                v @ (syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(_),
                    ..
                })
                | syn::Expr::Path(_)) => v.clone(),
                other => {
                    return Err(Error::new_spanned(
                        other,
                        "expected a string literal or a constant",
                    ))
                }
            };
            if pair.path.is_ident("name") {
                name = Some(value);
            } else if pair.path.is_ident("summary") {
                summary = Some(value);
            } else {
                return Err(Error::new_spanned(
                    pair.path,
                    "expected `name` or `summary`",
                ));
            }
        }
        let missing = |what: &str| Error::new(input.span(), format!("missing `{what} = \"...\"`"));
        Ok(Self {
            name: name.ok_or_else(|| missing("name"))?,
            summary: summary.ok_or_else(|| missing("summary"))?,
        })
    }
}

/// Register a plugin config: `#[reel_core::plugin(name = "finetune", summary = "...")]` on
/// `impl MethodConfig for FinetuneConfig { ... }`. The name selects the type in TOML
/// (`kind = "finetune"`, or `arch = "..."` for models) and lists it in `reel list`.
#[proc_macro_attribute]
pub fn plugin(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = parse_macro_input!(args as PluginArgs);
    let item = parse_macro_input!(item as ItemImpl);
    let Some((None, trait_path, _)) = &item.trait_ else {
        return Error::new_spanned(
            &item.self_ty,
            "#[plugin] goes on `impl <PluginTrait> for <Type>`",
        )
        .to_compile_error()
        .into();
    };
    let (name, summary) = (&args.name, &args.summary);
    quote! {
        const _: () = {
            use ::reel_core::__private::typetag;
            #[typetag::serde(name = #name)]
            #item
            ::reel_core::inventory::submit! {
                ::reel_core::registry::PluginDescriptor {
                    kind: <dyn #trait_path as ::reel_core::registry::PluginTrait>::KIND,
                    name: #name,
                    summary: #summary,
                }
            }
        };
    }
    .into()
}

/// List a method's roles: `#[derive(Roles)]` on the method struct, `#[role]` on each field
/// holding a `TrainableRole` (or an `Option` of one). Implements `reel_core::role::RoleFields`
/// for the struct's first type parameter (the backend), roles in field order.
#[proc_macro_derive(Roles, attributes(role))]
pub fn derive_roles(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match roles_impl(&input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn roles_impl(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(Error::new_spanned(
            &input.ident,
            "#[derive(Roles)] needs a struct",
        ));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(Error::new_spanned(
            &input.ident,
            "#[derive(Roles)] needs named fields",
        ));
    };
    let roles: Vec<&syn::Ident> = fields
        .named
        .iter()
        .filter(|f| f.attrs.iter().any(|a| a.path().is_ident("role")))
        .filter_map(|f| f.ident.as_ref())
        .collect();
    let Some(backend) = input.generics.type_params().next().map(|p| &p.ident) else {
        return Err(Error::new_spanned(
            &input.generics,
            "#[derive(Roles)] needs the backend as the struct's first type parameter",
        ));
    };
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::reel_core::role::RoleFields<#backend> for #ident #ty_generics #where_clause {
            fn role_fields(&self) -> ::std::vec::Vec<&dyn ::reel_core::role::RoleHandle<#backend>> {
                let mut out = ::std::vec::Vec::new();
                #( ::reel_core::role::RoleField::<#backend>::push_roles(&self.#roles, &mut out); )*
                out
            }
            fn role_fields_mut(&mut self) -> ::std::vec::Vec<&mut dyn ::reel_core::role::RoleHandle<#backend>> {
                let mut out = ::std::vec::Vec::new();
                #( ::reel_core::role::RoleField::<#backend>::push_roles_mut(&mut self.#roles, &mut out); )*
                out
            }
        }
    })
}
