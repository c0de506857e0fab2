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
        // Some other item (a struct, a method without a body): say what the attribute is for.
        Err(_) if syn::parse2::<syn::Item>(item.clone()).is_ok() => {
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
        // Not an item at all: a syntax error, which syn's own message points at. The function is
        // emitted with its signature and a stub body, so that rustc does not report the same
        // syntax error again, and calls to it do not fail too.
        Err(error) => {
            let error = error.into_compile_error();
            return match syn::parse2::<Stub>(item.clone()) {
                Ok(Stub { attrs, vis, sig }) => quote! {
                    #error
                    #(#attrs)*
                    #[allow(unused_variables)]
                    #vis #sig { ::core::unimplemented!() }
                },
                Err(_) => quote!(#error #item),
            };
        }
    };
    result.unwrap_or_else(|error| {
        let error = error.into_compile_error();
        quote!(#error #item)
    })
}

/// A function whose body does not parse: its attributes, visibility and signature, and the body's
/// braces skipped as they are.
struct Stub {
    attrs: Vec<syn::Attribute>,
    vis: syn::Visibility,
    sig: syn::Signature,
}

impl syn::parse::Parse for Stub {
    fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(syn::Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let _body: proc_macro2::Group = input.parse()?;
        Ok(Stub { attrs, vis, sig })
    }
}
