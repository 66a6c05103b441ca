//! `#[derive(ConfigKeys)]`: a config struct's dotted keys with their one-line
//! meanings, taken from the fields' doc comments, so that a key is documented
//! once, where it is declared (`embodyflow_core::config::ConfigKeys`, which
//! re-exports this derive next to the trait, shows it at work).
//!
//! Each named field is a key whose meaning is its doc comment: the lines
//! joined by spaces, one final full stop dropped, and the first letter made
//! lower case when the rest of the first word is (`Discount of the step
//! returns.` → `discount of the step returns`; `GAE lambda.` stays). A field
//! marked `#[keys(section)]` is a table of settings: its own keys, prefixed
//! with the field's name (`gae.gamma`), instead of one key. A field marked
//! `#[keys(skip)]` is left out (keys documented elsewhere, such as every
//! stage's `output.*`). A key is named as serde names it
//! (`#[serde(rename = "fn")]`). A field without a doc comment is a compile
//! error.
//!
//! ```text
//! #[derive(ConfigKeys)]
//! struct Config {
//!     /// Rows per record batch read from the steps table.
//!     batch_rows: usize,          // ("batch_rows", "rows per record batch read from the steps table")
//!     /// GAE settings.
//!     #[keys(section)]
//!     gae: GaeConfig,             // ("gae.gamma", …), ("gae.lam", …)
//!     #[keys(skip)]
//!     output: OutputConfig,       // nothing
//! }
//! ```

use proc_macro::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Expr, ExprLit, Fields, Lit, LitStr, Meta, Token, parse_macro_input};

/// Implements `embodyflow_core::config::ConfigKeys` from the fields' doc
/// comments (see the crate documentation).
#[proc_macro_derive(ConfigKeys, attributes(keys))]
pub fn derive_config_keys(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// How a field enters the key list.
enum Role {
    Key,
    Section,
    Skip,
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "ConfigKeys derives only for structs",
        ));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(
            input,
            "ConfigKeys needs named fields (each one a config key)",
        ));
    };
    let mut pushes = Vec::new();
    for field in &fields.named {
        let ident = field.ident.as_ref().expect("named field");
        let name = serde_rename(&field.attrs)?.unwrap_or_else(|| ident.to_string());
        let ty = &field.ty;
        match role(&field.attrs)? {
            Role::Skip => {}
            Role::Section => pushes.push(quote! {
                <#ty as ::embodyflow_core::config::ConfigKeys>::config_keys(
                    &::embodyflow_core::config::dotted(prefix, #name),
                    out,
                );
            }),
            Role::Key => {
                let meaning = meaning(&field.attrs).ok_or_else(|| {
                    syn::Error::new_spanned(
                        ident,
                        format!("config key `{name}` needs a doc comment: its one-line meaning"),
                    )
                })?;
                pushes.push(quote! {
                    out.push((::embodyflow_core::config::dotted(prefix, #name), #meaning));
                });
            }
        }
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::embodyflow_core::config::ConfigKeys for #ident #ty_generics #where_clause {
            fn config_keys(prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, &'static str)>) {
                #(#pushes)*
            }
        }
    })
}

/// The field's `#[keys(...)]` marker.
fn role(attrs: &[syn::Attribute]) -> syn::Result<Role> {
    let mut role = Role::Key;
    for attr in attrs.iter().filter(|a| a.path().is_ident("keys")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("section") {
                role = Role::Section;
                Ok(())
            } else if meta.path.is_ident("skip") {
                role = Role::Skip;
                Ok(())
            } else {
                Err(meta.error("expected `section` or `skip`"))
            }
        })?;
    }
    Ok(role)
}

/// The key's name under `#[serde(rename = "...")]`, `None` without one.
fn serde_rename(attrs: &[syn::Attribute]) -> syn::Result<Option<String>> {
    let mut rename = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") && meta.input.peek(Token![=]) {
                let name: LitStr = meta.value()?.parse()?;
                rename = Some(name.value());
            } else if meta.input.peek(Token![=]) {
                let _: Lit = meta.value()?.parse()?;
            } else if meta.input.peek(syn::token::Paren) {
                let _nested;
                syn::parenthesized!(_nested in meta.input);
            }
            Ok(())
        })?;
    }
    Ok(rename)
}

/// The doc comment as one line of meaning, `None` without one.
fn meaning(attrs: &[syn::Attribute]) -> Option<String> {
    let lines: Vec<String> = attrs
        .iter()
        .filter_map(|attr| match &attr.meta {
            Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(text),
                    ..
                }) => Some(text.value().trim().to_string()),
                _ => None,
            },
            _ => None,
        })
        .filter(|line| !line.is_empty())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let text = lines.join(" ");
    let text = text.strip_suffix('.').unwrap_or(&text);
    Some(lower_first(text))
}

/// `Discount` → `discount`; `GAE`, `StepOPSD` and `MiB` keep their case.
fn lower_first(text: &str) -> String {
    let word = text.split(' ').next().unwrap_or("");
    let mut chars = word.chars();
    match chars.next() {
        Some(first) if first.is_uppercase() && !chars.any(char::is_uppercase) => {
            first.to_lowercase().collect::<String>() + &text[first.len_utf8()..]
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doc_comment_becomes_one_line_of_meaning() {
        let field: syn::Field = syn::parse_quote! {
            /// Discount of the step
            /// returns.
            gamma: f32
        };
        assert_eq!(
            meaning(&field.attrs).as_deref(),
            Some("discount of the step returns")
        );
        for (doc, want) in [
            ("GAE lambda.", "GAE lambda"),
            ("StepOPSD: mix.", "StepOPSD: mix"),
            ("MiB kept.", "MiB kept"),
            ("gigpo: discount.", "gigpo: discount"),
            ("Ünits.", "ünits"),
        ] {
            let field: syn::Field = syn::parse_quote! { #[doc = #doc] x: u8 };
            assert_eq!(meaning(&field.attrs).as_deref(), Some(want), "{doc}");
        }
        let bare: syn::Field = syn::parse_quote! { x: u8 };
        assert_eq!(meaning(&bare.attrs), None);
    }

    #[test]
    fn serde_renames_and_markers_are_read() {
        let field: syn::Field = syn::parse_quote! {
            #[serde(rename = "fn", skip_serializing_if = "Option::is_none")]
            #[keys(section)]
            function: u8
        };
        assert_eq!(serde_rename(&field.attrs).unwrap().as_deref(), Some("fn"));
        assert!(matches!(role(&field.attrs).unwrap(), Role::Section));
        let wrong: syn::Field = syn::parse_quote! { #[keys(flatten)] x: u8 };
        assert!(role(&wrong.attrs).is_err());
    }

    #[test]
    fn a_key_without_a_doc_comment_names_itself_in_the_error() {
        let input: DeriveInput = syn::parse_quote! {
            struct Config {
                #[serde(rename = "fn")]
                function: String,
            }
        };
        let error = expand(&input).err().unwrap().to_string();
        assert_eq!(
            error,
            "config key `fn` needs a doc comment: its one-line meaning"
        );
    }
}
