//! `#[derive(Escape)]` for structs with one lifetime parameter (the brand), or none.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::visit::Visit;
use syn::{Data, DeriveInput, Fields, GenericParam, Lifetime, Path};

use crate::args::{self, Accepted, Kind, Options, Value};

const OPTIONS: Options = Options {
    attr: "#[escape(..)]",
    accepted: &[Accepted {
        name: "crate",
        kind: Kind::Path,
        value: "the path of the tensorscope crate as a string",
        example: "crate = \"my_reexports::tensorscope\"",
    }],
};

/// The tensorscope path: `::tensorscope`, or what `#[escape(crate = "..")]` names.
fn crate_path(input: &DeriveInput) -> syn::Result<Path> {
    let mut krate: Path = syn::parse_quote!(::tensorscope);
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("escape")) {
        let tokens = attr.meta.require_list()?.tokens.clone();
        let mut errors = Vec::new();
        for found in args::parse(&OPTIONS, tokens, &mut errors) {
            if let Value::Path(path) = found.value {
                krate = path;
            }
        }
        args::combine(errors)?;
    }
    Ok(krate)
}

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<DeriveInput>(input) {
        Ok(input) => input,
        Err(error) => return error.into_compile_error(),
    };
    generate(&input).unwrap_or_else(|error| {
        // The error, and an impl that lets the rest of the crate type-check, so that one mistake
        // here is one error, not one more at every function returning the type (thiserror's way).
        let error = error.into_compile_error();
        let fallback = fallback(&input);
        quote!(#error #fallback)
    })
}

/// `#name`'s generics with the escape target `'__escape_to` first, for the impl, and the source
/// brand: the type's one lifetime if it has exactly one, else a new `'__escape_from` (a type
/// without a brand escapes from any scope).
fn with_target(input: &DeriveInput) -> (syn::Generics, Lifetime, Lifetime) {
    let span = proc_macro2::Span::mixed_site();
    let to = Lifetime::new("'__escape_to", span);
    let mut generics = input.generics.clone();
    let lifetimes: Vec<&Lifetime> = input.generics.lifetimes().map(|l| &l.lifetime).collect();
    let from = match lifetimes[..] {
        [brand] => brand.clone(),
        _ => {
            let from = Lifetime::new("'__escape_from", span);
            generics.params.insert(
                0,
                GenericParam::Lifetime(syn::LifetimeParam::new(from.clone())),
            );
            from
        }
    };
    generics.params.insert(
        0,
        GenericParam::Lifetime(syn::LifetimeParam::new(to.clone())),
    );
    (generics, from, to)
}

/// An impl that type-checks and is never run: the one emitted beside a derive error.
fn fallback(input: &DeriveInput) -> TokenStream {
    let krate = crate_path(input).unwrap_or_else(|_| syn::parse_quote!(::tensorscope));
    let name = &input.ident;
    let (generics, from, to) = with_target(input);
    let (impl_generics, _, _) = generics.split_for_impl();
    let (_, ty_generics, where_clause) = input.generics.split_for_impl();
    // Every lifetime re-branded, so that functions returning the type type-check as if it derived.
    let escaped = escaped_args(input, &to);
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::__private::Escape<#from, #to> for #name #ty_generics #where_clause {
            type Escaped = #name<#(#escaped),*>;
            fn escape_to(self, _: &#krate::__private::EscapeTarget<#from, #to>) -> Self::Escaped {
                ::core::unimplemented!("derive(Escape) failed to compile")
            }
        }
    }
}

/// The type's generic arguments with every lifetime replaced by `to`: `Output<'a, T>` gives
/// `'__escape_to, T`, the arguments of the escaped type.
fn escaped_args(input: &DeriveInput, to: &Lifetime) -> Vec<TokenStream> {
    input
        .generics
        .params
        .iter()
        .map(|p| match p {
            GenericParam::Lifetime(_) => quote!(#to),
            GenericParam::Type(t) => {
                let ident = &t.ident;
                quote!(#ident)
            }
            GenericParam::Const(c) => {
                let ident = &c.ident;
                quote!(#ident)
            }
        })
        .collect()
}

/// Whether `ty` is `PhantomData<..>`: such a field is made anew for the escaped type.
fn is_phantom(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "PhantomData"),
        _ => false,
    }
}

fn mentions(ty: &syn::Type, lifetime: &Lifetime) -> bool {
    struct Finder<'l>(&'l Lifetime, bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_lifetime(&mut self, l: &'ast Lifetime) {
            self.1 |= l.ident == self.0.ident;
        }
    }
    let mut finder = Finder(lifetime, false);
    finder.visit_type(ty);
    finder.1
}

fn generate(input: &DeriveInput) -> syn::Result<TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "derive(Escape) supports structs; escape the fields of an enum by matching on it",
        ));
    };
    let krate = crate_path(input)?;
    let private = quote!(#krate::__private);
    let name = &input.ident;
    let lifetimes: Vec<&Lifetime> = input.generics.lifetimes().map(|l| &l.lifetime).collect();
    let (generics, from, to) = with_target(input);
    let (impl_generics, _, _) = generics.split_for_impl();
    let (_, ty_generics, where_clause) = input.generics.split_for_impl();
    if lifetimes.is_empty() {
        // No brand, so no scoped tensor inside: the value passes through unchanged.
        return Ok(quote! {
            #[automatically_derived]
            impl #impl_generics #private::Escape<#from, #to> for #name #ty_generics #where_clause {
                type Escaped = Self;
                fn escape_to(self, _: &#private::EscapeTarget<#from, #to>) -> Self {
                    self
                }
            }
        });
    }
    let [brand] = lifetimes[..] else {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "derive(Escape) needs at most one lifetime parameter, the scope brand, as in \
             `struct Output<'s> { y: Tensor<'s> }`",
        ));
    };
    let target = format_ident!("__target", span = proc_macro2::Span::mixed_site());

    let escaped_args = escaped_args(input, &to);
    let field = |ty: &syn::Type, access: TokenStream| {
        if is_phantom(ty) {
            quote!(::core::marker::PhantomData)
        } else if mentions(ty, brand) {
            quote!(#private::Escape::escape_to(#access, #target))
        } else {
            access
        }
    };
    let construct = match &data.fields {
        Fields::Named(fields) => {
            let inits = fields.named.iter().map(|f| {
                let ident = &f.ident;
                let value = field(&f.ty, quote!(self.#ident));
                quote!(#ident: #value)
            });
            quote!(#name { #(#inits),* })
        }
        Fields::Unnamed(fields) => {
            let inits = fields.unnamed.iter().enumerate().map(|(i, f)| {
                let index = syn::Index::from(i);
                field(&f.ty, quote!(self.#index))
            });
            quote!(#name(#(#inits),*))
        }
        Fields::Unit => quote!(#name),
    };
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #private::Escape<#from, #to> for #name #ty_generics #where_clause {
            type Escaped = #name<#(#escaped_args),*>;
            fn escape_to(self, #target: &#private::EscapeTarget<#from, #to>) -> Self::Escaped {
                #construct
            }
        }
    })
}
