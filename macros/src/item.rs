//! The frame the attribute macros share: parse the annotated function, and on any error emit the
//! error together with the user's item unchanged, so that one mistake does not cascade into errors at
//! every call site (thiserror's and tokio's fallback).

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ItemFn;

/// Parses `item` as a function with a body and runs `generate` on it; `attr` (e.g.
/// `"#[checkpoint]"`) names the attribute in the error for anything else.
pub(crate) fn expand_fn(
    attr: &str,
    item: TokenStream,
    generate: impl FnOnce(ItemFn) -> syn::Result<TokenStream>,
) -> TokenStream {
    let result = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => generate(func),
        Err(_) => {
            let span = item
                .clone()
                .into_iter()
                .next()
                .map_or_else(Span::call_site, |t| t.span());
            Err(syn::Error::new(
                span,
                format!("{attr} applies to a function or method with a body"),
            ))
        }
    };
    result.unwrap_or_else(|error| {
        let error = error.into_compile_error();
        quote!(#error #item)
    })
}
